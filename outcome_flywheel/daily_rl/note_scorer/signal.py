"""The online note scorer as a reward signal of the daily update (the `scorer` weight, off by default):
each of D-1's notes scored by the scorer's state after D-1."""

from __future__ import annotations

import math

import numpy as np

from outcome_flywheel.daily_rl.note_scorer.features import FEATURES_TABLE, feature_lookup
from outcome_flywheel.daily_rl.note_scorer.model import ScorerStore
from outcome_flywheel.settings import resolve_path
from outcome_flywheel.storage import Warehouse


def scorer_signals(warehouse: Warehouse, prediction_day: str) -> dict[tuple[str, int], float]:
    """(headline_id, rollout_index) -> sigmoid of the online note scorer's score of D-1's note, by its
    state after D-1 (`note_scorer(D-1)`, which has not seen these notes' ranks) and the notes' stored
    features; empty (the signal drops out) where either is missing. Read like `human_signals`: no
    declared dependency (note_scorer reads rollout_scores, so a declared one would close a cycle)."""
    path = ScorerStore(resolve_path(warehouse.data_dir)).day_file(prediction_day)
    if not path.exists() or not warehouse.exists(FEATURES_TABLE, prediction_day):
        return {}
    state = ScorerStore(resolve_path(warehouse.data_dir)).load(path)
    lookup = feature_lookup(warehouse.read(FEATURES_TABLE, prediction_day), state.spec_key)
    if not lookup:
        return {}
    keys = list(lookup)
    scores = state.scores(np.stack([lookup[k] for k in keys]))
    return {(h, i): 1.0 / (1.0 + math.exp(-max(min(float(s), 50.0), -50.0))) for (_, h, i), s in zip(keys, scores)}
