"""The online note scorer as a reward signal of the daily update (the `scorer` weight, off by default):
each of D-1's notes scored by the scorer's state after D-1."""

from __future__ import annotations

import math

import numpy as np

from outcome_flywheel.daily_rl.note_scorer.features import feature_lookup


def scorer_signals(state, features) -> dict[tuple[str, int], float]:
    """(headline_id, rollout_index) -> sigmoid of the online note scorer's score of D-1's note, by its
    state after D-1 (`note_scorer(D-1)`, which has not seen these notes' ranks) and the notes' stored
    `features` (the FEATURES_TABLE rows of D-1); empty (the signal drops out) where either is missing (None).
    Read like people's ratings: no declared dependency (note_scorer reads rollout_scores, so a declared
    one would close a cycle)."""
    if state is None or features is None:
        return {}
    lookup = feature_lookup(features, state.spec_key)
    if not lookup:
        return {}
    keys = list(lookup)
    scores = state.scores(np.stack([lookup[k] for k in keys]))
    return {(h, i): 1.0 / (1.0 + math.exp(-max(min(float(s), 50.0), -50.0))) for (_, h, i), s in zip(keys, scores)}
