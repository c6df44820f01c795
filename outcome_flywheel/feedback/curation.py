"""From the feedback log to a table, preference pairs and metrics.

- `feedback_table`: one row per feedback, the latest curator verdict folded in (`status`: `none`
  without a correction, else `unverified`, `approved`, `edited` or `rejected`).
- `feedback_pairs`: a verified correction is preferred to the note it corrects (the curator's
  edit when there is one); on one headline, a note people rated up is preferred to one they rated
  down (a note's rating: the mean of its human scores, `records.human_signal`; >= 0.75 up,
  <= 0.25 down). Pair ids are stable hashes, so re-running gives the same pairs.
- `new_export`: the pairs not exported before, as the three trainer formats and a sidecar; each
  pair is exported once (`exported_at` records which export held it).
- `feedback_metrics`: feedback rate, positive rate, correction rate, verified share, pairs ready.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Sequence

import pandas as pd

from outcome_flywheel.exports import EXPORT_FORMATS, jsonl_bytes
from outcome_flywheel.feedback.records import FeedbackRecord, VerificationRecord, human_signal

FEEDBACK_COLUMNS = [
    "feedback_id",
    "date",
    "headline_id",
    "rollout_index",
    "thumbs",
    "stars",
    "human_score",
    "correction",
    "reviewer",
    "created_at",
    "status",
    "verified_correction",
    "curator",
    "verified_at",
]
PAIR_COLUMNS = [
    "pair_id",
    "source",
    "date",
    "headline_id",
    "prompt",
    "chosen",
    "rejected",
    "chosen_rollout_index",
    "rejected_rollout_index",
    "feedback_ids",
    "exported_at",
]
UP, DOWN = 0.75, 0.25
STATUS_OF_ACTION = {"approve": "approved", "edit": "edited", "reject": "rejected"}


def feedback_table(feedback: Sequence[FeedbackRecord], verifications: Sequence[VerificationRecord]) -> pd.DataFrame:
    """Feedback rows with their latest verdict; verdicts on unknown ids are ignored (see `orphans`)."""
    latest: dict[str, VerificationRecord] = {}
    for v in sorted(verifications, key=lambda v: v.created_at):
        latest[v.feedback_id] = v
    rows = []
    for f in feedback:
        v = latest.get(f.feedback_id)
        status = "none" if not f.correction else (STATUS_OF_ACTION[v.action] if v else "unverified")
        final = None
        if status == "approved":
            final = f.correction
        elif status == "edited":
            final = v.correction
        rows.append(
            dict(
                feedback_id=f.feedback_id,
                date=f.date.isoformat(),
                headline_id=f.headline_id,
                rollout_index=int(f.rollout_index),
                thumbs=f.thumbs,
                stars=f.stars,
                human_score=human_signal(f.thumbs, f.stars),
                correction=f.correction,
                reviewer=f.reviewer,
                created_at=f.created_at,
                status=status,
                verified_correction=final,
                curator=v.curator if v else None,
                verified_at=v.created_at if v else None,
            )
        )
    return pd.DataFrame(rows, columns=FEEDBACK_COLUMNS)


def orphans(feedback: Sequence[FeedbackRecord], verifications: Sequence[VerificationRecord]) -> list[str]:
    known = {f.feedback_id for f in feedback}
    return sorted({v.feedback_id for v in verifications} - known)


def _pair_id(*parts: Any) -> str:
    return hashlib.sha256("|".join(str(p) for p in parts).encode()).hexdigest()[:16]


def note_ratings(table: pd.DataFrame) -> pd.DataFrame:
    """Per rated note: the mean human score and the feedback ids behind it."""
    rated = table.dropna(subset=["human_score"])
    if rated.empty:
        return pd.DataFrame(columns=["date", "headline_id", "rollout_index", "rating", "feedback_ids"])
    return rated.groupby(["date", "headline_id", "rollout_index"], as_index=False).agg(
        rating=("human_score", "mean"), feedback_ids=("feedback_id", lambda s: sorted(s))
    )


def feedback_pairs(table: pd.DataFrame, notes: pd.DataFrame) -> pd.DataFrame:
    """Pairs from verified corrections and from up- vs down-rated notes of one headline. `notes`:
    rollouts rows (date, headline_id, rollout_index, prompt JSON, response); feedback on a note
    that is not there makes no pair."""
    index = {(str(r.date), r.headline_id, int(r.rollout_index)): r for r in notes.itertuples(index=False)}
    rows = []
    for f in table[table["status"].isin(["approved", "edited"])].itertuples(index=False):
        note = index.get((f.date, f.headline_id, int(f.rollout_index)))
        if note is None or not f.verified_correction or f.verified_correction.strip() == note.response.strip():
            continue
        rows.append(
            dict(
                pair_id=_pair_id("correction", f.feedback_id),
                source="correction",
                date=f.date,
                headline_id=f.headline_id,
                prompt=note.prompt,
                chosen=f.verified_correction,
                rejected=note.response,
                chosen_rollout_index=-1,
                rejected_rollout_index=int(f.rollout_index),
                feedback_ids=json.dumps([f.feedback_id]),
            )
        )
    ratings = note_ratings(table)
    for (day, headline), group in ratings.groupby(["date", "headline_id"]):
        ups = group[group["rating"] >= UP].sort_values("rollout_index")
        downs = group[group["rating"] <= DOWN].sort_values("rollout_index")
        for up in ups.itertuples(index=False):
            for down in downs.itertuples(index=False):
                good, bad = (
                    index.get((day, headline, int(up.rollout_index))),
                    index.get((day, headline, int(down.rollout_index))),
                )
                if good is None or bad is None or good.response.strip() == bad.response.strip():
                    continue
                rows.append(
                    dict(
                        pair_id=_pair_id("thumbs", day, headline, up.rollout_index, down.rollout_index),
                        source="thumbs",
                        date=day,
                        headline_id=headline,
                        prompt=good.prompt,
                        chosen=good.response,
                        rejected=bad.response,
                        chosen_rollout_index=int(up.rollout_index),
                        rejected_rollout_index=int(down.rollout_index),
                        feedback_ids=json.dumps(sorted(up.feedback_ids + down.feedback_ids)),
                    )
                )
    pairs = pd.DataFrame(rows, columns=PAIR_COLUMNS)
    return pairs.drop_duplicates("pair_id").sort_values(["date", "headline_id", "pair_id"]).reset_index(drop=True)


def carry_exports(pairs: pd.DataFrame, previous: pd.DataFrame | None) -> pd.DataFrame:
    """`exported_at` from the previous table: a pair exported once keeps its export id."""
    pairs = pairs.copy()
    done = {} if previous is None or previous.empty else dict(zip(previous["pair_id"], previous["exported_at"]))
    pairs["exported_at"] = [done.get(p) or None for p in pairs["pair_id"]]
    return pairs


def new_export(pairs: pd.DataFrame, export_id: str) -> tuple[pd.DataFrame, dict[str, bytes]]:
    """(pairs with the unexported ones marked `export_id`, that export's files) — no files when
    nothing is new."""
    fresh = pairs["exported_at"].isna()
    if not fresh.any():
        return pairs, {}
    batch = pairs[fresh]
    files: dict[str, bytes] = {}
    for fmt, make in EXPORT_FORMATS.items():
        files[f"{fmt}.jsonl"] = jsonl_bytes(
            make(json.loads(r.prompt), r.chosen, r.rejected) for r in batch.itertuples(index=False)
        )
    sidecar = {
        "source": "feedback_pairs: verified corrections and up- vs down-rated notes of the daily loop",
        "export_id": export_id,
        "rows": int(len(batch)),
        "files": {name: hashlib.sha256(data).hexdigest() for name, data in files.items()},
        "pairs": [
            {
                "pair_id": r.pair_id,
                "source": r.source,
                "date": r.date,
                "headline_id": r.headline_id,
                "chosen_rollout_index": r.chosen_rollout_index,
                "rejected_rollout_index": r.rejected_rollout_index,
                "feedback_ids": json.loads(r.feedback_ids),
            }
            for r in batch.itertuples(index=False)
        ],
    }
    files["pairs.meta.json"] = json.dumps(sidecar, indent=1, sort_keys=True).encode()
    marked = pairs.copy()
    marked.loc[fresh, "exported_at"] = export_id
    return marked, files


def feedback_metrics(table: pd.DataFrame, notes_shown: int, pairs: pd.DataFrame) -> dict[str, float | int | None]:
    """The feedback system's health: how much of what was shown got feedback, how positive it was,
    how often people wrote corrections and how many of those a curator has verified."""

    def share(num: float, den: float) -> float | None:
        return round(num / den, 4) if den else None

    rated = table.dropna(subset=["human_score"])
    corrections = table[table["status"] != "none"]
    verified = corrections[corrections["status"] != "unverified"]
    notes_with_feedback = table[["date", "headline_id", "rollout_index"]].drop_duplicates()
    return {
        "feedback": int(len(table)),
        "notes_with_feedback": int(len(notes_with_feedback)),
        "feedback_rate": share(len(notes_with_feedback), notes_shown),
        "positive_rate": share(float((rated["human_score"] >= 0.5).sum()), len(rated)),
        "correction_rate": share(len(corrections), len(table)),
        "verified_share": share(len(verified), len(corrections)),
        "unverified_corrections": int((corrections["status"] == "unverified").sum()),
        "pairs": int(len(pairs)),
        "pairs_ready_to_export": int(pairs["exported_at"].isna().sum()) if len(pairs) else 0,
    }
