"""The online note scorer in the service (docs/tiers.md, "Online note scorer"): a day's notes shown
best-first by it, and one online step on every rated feedback.

The online step starts from the scorer's `latest` state, applies the feedback's people event (the
same event the `note_scorer` asset takes for that day, so the asset's re-run of the day reproduces it
from the day before), writes `live.safetensors` atomically and moves `latest` to it, all under the scorer's
file lock: two requests (threads or worker processes) never interleave a load and a save. The
feedback is stored first; a scorer that cannot step (no state yet, no features for the note's day)
says why in the response and never fails the request.
"""

from __future__ import annotations

from typing import Any

from outcome_flywheel.daily_rl.note_scorer.events import local_day, people_event
from outcome_flywheel.daily_rl.note_scorer.features import FEATURES_TABLE, feature_lookup
from outcome_flywheel.daily_rl.note_scorer.model import SOURCES, ScorerStore, accuracy_summary, label, learn
from outcome_flywheel.feedback.records import FeedbackRecord
from outcome_flywheel.settings import env, resolve_path


def store_of(state) -> ScorerStore:
    return ScorerStore(resolve_path(state.warehouse.data_dir))


def day_features(state, day: str, spec_key: str) -> dict:
    if not state.warehouse.exists(FEATURES_TABLE, day):
        return {}
    return feature_lookup(state.warehouse.read(FEATURES_TABLE, day), spec_key)


def online_update(state, record: dict) -> dict[str, Any]:
    """One Adam step of the scorer on the feedback just stored (a `FeedbackRecord` as JSON)."""
    feedback = FeedbackRecord.model_validate(record)
    store = store_of(state)
    if not store.latest.exists():
        return {"updated": False, "reason": "the note scorer has no state yet: materialise note_scorer"}
    day = feedback.date.isoformat()
    notes = state.warehouse.read("rollouts", day)
    indices = [int(i) for h, i in zip(notes["headline_id"], notes["rollout_index"]) if h == feedback.headline_id]
    everything = state.feedback_log.read().feedback
    event = people_event(feedback, everything, indices, local_day(feedback.created_at, env("FLYWHEEL_TIMEZONE")))
    if event is None:
        return {
            "updated": False,
            "reason": "the feedback has no thumbs or stars (a correction alone does not rank notes)",
        }
    with store.lock():
        scorer = store.load_latest()
        features = day_features(state, day, scorer.spec_key)
        if not features:
            return {
                "updated": False,
                "reason": f"no note features of {day} for the scorer: materialise note_scorer for {day}",
            }
        counts = learn(scorer, [event], features, store, live=True)
        if not counts["updates"]:
            return {"updated": False, "reason": "no pair to learn from: every note of the headline is rated the same"}
        store.save_live(scorer)
    last = scorer.meta["history"][-1]
    return {"updated": True, "updates": scorer.updates, "pairs": last["pairs"], "held_out_accuracy": last["accuracy"]}


def rank_notes(state, day: str, headlines: list[dict]) -> dict[str, Any]:
    """Sort each headline's notes best-first by the scorer (in place; each note gets `scorer_score`).
    Left in rollout order, with the reason, when the scorer or the day's features are missing."""
    store = store_of(state)
    if not store.latest.exists():
        return {"ranked": False, "reason": "no note scorer yet"}
    scorer = store.load_latest()
    features = day_features(state, day, scorer.spec_key)
    if not features:
        return {"ranked": False, "reason": f"no note features of {day} yet"}
    for head in headlines:
        known = [n for n in head["notes"] if (day, head["headline_id"], n["rollout_index"]) in features]
        if not known:
            continue
        import numpy as np

        scores = scorer.scores(np.stack([features[(day, head["headline_id"], n["rollout_index"])] for n in known]))
        for note, score in zip(known, scores):
            note["scorer_score"] = float(score)
        head["notes"].sort(key=lambda n: (-n.get("scorer_score", float("-inf")), n["rollout_index"]))
    return {"ranked": True, "updates": scorer.updates}


def scorer_status(state) -> dict[str, Any]:
    """The scorer's state: updates, parameters, fresh start, held-out accuracy per source."""
    store = store_of(state)
    if not store.latest.exists():
        return {"state": None, "reason": "the note scorer has no state yet: materialise note_scorer"}
    scorer = store.load_latest()
    accuracy = [{**accuracy_summary(scorer.meta["history"], s), "label": None} for s in SOURCES]
    for row in accuracy:
        row["label"] = label(row)
    return {
        "state": store.latest.resolve().name,
        "updates": scorer.updates,
        "parameters": scorer.parameters(),
        "feature_dim": scorer.feature_dim,
        "rank": scorer.settings.rank,
        "last_day": scorer.meta.get("last_day"),
        "fresh_start": scorer.meta.get("fresh_start"),
        "held_out_accuracy": accuracy,
    }
