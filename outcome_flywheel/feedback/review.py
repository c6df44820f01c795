"""What a reviewer sees of one day of the daily loop: each headline with its notes, and for each
note what is known so far — structure score, the judge's rank and reward (the next day, once it is
scored), the call's outcome (once prices matured) and people's ratings."""

from __future__ import annotations

from typing import Any

import pandas as pd

from outcome_flywheel.feedback.curation import note_ratings
from outcome_flywheel.json_rows import records


def find_note(notes: pd.DataFrame, headline_id: str, rollout_index: int) -> dict[str, Any] | None:
    """The row of `notes` (rollouts of one day) for one note, or None."""
    if notes.empty:
        return None
    match = notes[(notes["headline_id"] == headline_id) & (notes["rollout_index"] == rollout_index)]
    return match.iloc[0].to_dict() if len(match) else None


def review_days(warehouse) -> list[str]:
    """Days with rollouts, newest first."""
    return sorted(warehouse.partitions("rollouts"), reverse=True)


def _by_note(frame: pd.DataFrame, columns: list[str]) -> dict[tuple[str, int], dict[str, Any]]:
    if frame.empty:
        return {}
    return {
        (r["headline_id"], int(r["rollout_index"])): r
        for r in records(frame, ["headline_id", "rollout_index", *columns])
    }


def notes_for_review(warehouse, day: str, feedback_table: pd.DataFrame | None = None) -> list[dict[str, Any]]:
    """Headlines of `day` in feed order, each with its notes (rollout index order)."""
    rollouts = warehouse.read("rollouts", day)
    if rollouts.empty:
        return []
    scores = warehouse.read_all("rollout_scores")
    if len(scores):
        scores = scores[scores["prediction_date"] == day]
    outcomes = warehouse.read("rollout_outcomes", day)
    if len(outcomes):
        outcomes = outcomes[outcomes["source"] == "policy"]
    ranked = _by_note(scores, ["rank", "reward", "judge_placed"])
    realised = _by_note(outcomes, ["symbol", "side", "status", "reason", "vs_spy_pct"])
    rated = {}
    if feedback_table is not None and len(feedback_table):
        ratings = note_ratings(feedback_table[feedback_table["date"] == day])
        rated = {
            (r.headline_id, int(r.rollout_index)): (round(float(r.rating), 3), len(r.feedback_ids))
            for r in ratings.itertuples(index=False)
        }
    headlines = warehouse.read("headlines", day)
    order = {h: i for i, h in enumerate(headlines["headline_id"])} if len(headlines) else {}
    info = (
        {r["headline_id"]: r for r in records(headlines, ["headline_id", "title", "summary", "source", "link"])}
        if len(headlines)
        else {}
    )
    out = []
    for headline_id, group in sorted(rollouts.groupby("headline_id"), key=lambda item: order.get(item[0], len(order))):
        first = group.iloc[0]
        head = info.get(
            headline_id, {"title": first["title"], "summary": first["summary"], "source": None, "link": None}
        )
        notes = []
        for r in group.sort_values("rollout_index").itertuples(index=False):
            key = (headline_id, int(r.rollout_index))
            rating, n_feedback = rated.get(key, (None, 0))
            notes.append(
                {
                    "rollout_index": int(r.rollout_index),
                    "response": r.response,
                    "structure_score": float(r.structure_score),
                    "policy_version": r.policy_version,
                    "score": ranked.get(key),
                    "outcome": realised.get(key),
                    "rating": rating,
                    "n_feedback": n_feedback,
                }
            )
        out.append(
            {
                "headline_id": headline_id,
                "title": head["title"],
                "summary": head["summary"],
                "source": head.get("source"),
                "link": head.get("link"),
                "notes": notes,
            }
        )
    return out
