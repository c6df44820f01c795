"""Step 1 of a day: score D-1's notes. The judge ranks each headline's notes against the outcome
day's headlines; with the structure score, people's ratings (`human`) and whether the call is on the
headline's company (`relevance`) that makes the immediate reward (`loop.score_table`)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from outcome_flywheel.daily_rl.calls import calls_frame
from outcome_flywheel.daily_rl.judge import Judge
from outcome_flywheel.daily_rl.loop import SCORE_COLUMNS, judge_inputs, score_table
from outcome_flywheel.daily_rl.relevance import relevance_column
from outcome_flywheel.daily_rl.rewards import RewardConfig
from outcome_flywheel.daily_rl.worlds import judge_outcome_titles
from outcome_flywheel.feedback.curation import note_ratings
from outcome_flywheel.models import ModelLoader
from outcome_flywheel.storage import Warehouse


class DailyUpdateError(ValueError):
    """The day cannot be updated as asked (bad override date, missing headlines, unverified parent...)."""


def score_previous_rollouts(
    warehouse: Warehouse, models: ModelLoader, judge: Judge, day: str, prediction_day: str, outcome_day: str,
    prev_rollouts: pd.DataFrame, reward: RewardConfig | None = None, universe: set[str] | None = None,
    prices_file: str | None = None,
) -> pd.DataFrame:
    """rollout_scores(D): the judge's ranks of D-1's rollouts against the outcome day's headlines, or,
    when `prices_file` is a synthetic world's, against the world's own follow-ups of the headlines'
    companies (`worlds.judge_outcome_titles`): the archive's real moves say nothing about a world."""
    if prev_rollouts.empty:
        return pd.DataFrame(columns=SCORE_COLUMNS)
    if not warehouse.exists("headlines", outcome_day):
        raise DailyUpdateError(f"headlines of {outcome_day} are not materialised: materialise `headlines` for that day first")
    outcome_titles = judge_outcome_titles(prices_file, prev_rollouts, prediction_day) if prices_file else None
    if outcome_titles is None:
        outcome_titles = list(warehouse.read("headlines", outcome_day).get("title", pd.Series(dtype=str)))
    judge_backend = judge.load(models)
    inputs = judge_inputs(prev_rollouts, outcome_titles, judge.outcome_context, models.seed, day)
    judgements = judge.rank(judge_backend, inputs.groups)
    scorer = scorer_signals(warehouse, prediction_day) if float((reward or RewardConfig()).weights.get("scorer", 0.0)) else None
    return score_table(inputs, judgements, day, prediction_day, outcome_day, reward, human_signals(warehouse, prediction_day),
                       relevance_signals(prev_rollouts, universe), scorer)


def scorer_signals(warehouse: Warehouse, prediction_day: str) -> dict[tuple[str, int], float]:
    """(headline_id, rollout_index) -> sigmoid of the online note scorer's score of D-1's note, by its
    state after D-1 (`note_scorer(D-1)`, which has not seen these notes' ranks) and the notes' stored
    features; empty (the signal drops out) where either is missing. Read like `human_signals`: no
    declared dependency (note_scorer reads rollout_scores, so a declared one would close a cycle)."""
    import math

    from outcome_flywheel.daily_rl.note_scorer import ScorerStore
    from outcome_flywheel.daily_rl.note_scorer_features import FEATURES_TABLE, feature_lookup
    from outcome_flywheel.settings import resolve_path

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


def relevance_signals(rollouts: pd.DataFrame, universe: set[str] | None) -> dict[tuple[str, int], float | None]:
    """(headline_id, rollout_index) -> the `relevance` signal (None where the headline names no known company)."""
    calls = calls_frame(rollouts[["headline_id", "rollout_index", "title", "summary", "response"]], universe)
    values = relevance_column(calls)
    return {(str(h), int(i)): (None if v != v else float(v)) for h, i, v in zip(calls["headline_id"], calls["rollout_index"], values)}


def human_signals(warehouse: Warehouse, prediction_day: str) -> dict[tuple[str, int], float]:
    """(headline_id, rollout_index) -> mean human score of the notes people rated, from
    note_feedback(D-1) as it stands when D is scored (no declared dependency: note_feedback reads
    rollouts, so a declared one would close a cycle; re-run D to take later feedback in)."""
    if not warehouse.exists("note_feedback", prediction_day):
        return {}
    ratings = note_ratings(warehouse.read("note_feedback", prediction_day))
    return {(str(h), int(i)): float(v) for h, i, v in zip(ratings["headline_id"], ratings["rollout_index"], ratings["rating"])}
