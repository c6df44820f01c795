"""Feedback on the daily notes and its curation."""

from __future__ import annotations

import json
from typing import Literal

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request

from outcome_flywheel.feedback.curation import FEEDBACK_COLUMNS
from outcome_flywheel.feedback.records import FeedbackIn, FeedbackRecord, VerificationIn, VerificationRecord
from outcome_flywheel.feedback.review import find_note
from outcome_flywheel.json_rows import records
from outcome_flywheel.jsonl_log import append_unless
from service import launching
from service.api.scorer import online_update
from service.security import bearer
from service.state import NoDagsterInstance

router = APIRouter(prefix="/api/feedback", tags=["feedback"])
FEEDBACK_ID = r"^[0-9a-f]{32}$"


def add_feedback(state, feedback: FeedbackIn) -> dict:
    """Append feedback on a note that exists (404 otherwise); returns the record written."""
    day = feedback.date.isoformat()
    if find_note(state.warehouse.read("rollouts", day), feedback.headline_id, feedback.rollout_index) is None:
        raise HTTPException(
            status_code=404, detail=f"no note {feedback.headline_id}#{feedback.rollout_index} in rollouts({day})"
        )
    record = FeedbackRecord(**feedback.model_dump())
    state.feedback_log.append(record)
    out = record.model_dump(mode="json")
    # Stored first; then the online note scorer takes one step on it (never failing the request).
    try:
        out["note_scorer"] = online_update(state, out)
    except (OSError, ValueError, RuntimeError) as err:
        out["note_scorer"] = {"updated": False, "reason": f"{type(err).__name__}: {err}"}
    return out


def verify_feedback(state, feedback_id: str, verdict: VerificationIn) -> dict:
    """Append a curator's verdict on a feedback that has a correction: 404 for an unknown id, 409
    for feedback without a correction. Checked and appended under the log's lock."""
    record = VerificationRecord(feedback_id=feedback_id, **verdict.model_dump())
    problem: dict[str, tuple[int, str]] = {}

    def refuse(lines: list[str]) -> str | None:
        for line in lines:
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict) and obj.get("kind") == "feedback" and obj.get("feedback_id") == feedback_id:
                if not obj.get("correction"):
                    problem["it"] = (409, f"feedback {feedback_id} has no correction to verify")
                    return "no correction"
                return None
        problem["it"] = (404, f"no feedback {feedback_id}")
        return "unknown"

    if append_unless(state.feedback_log.file, record.model_dump_json(), refuse) is not None:
        code, detail = problem["it"]
        raise HTTPException(status_code=code, detail=detail)
    return record.model_dump(mode="json")


def feedback_rows(
    state, status: str = "unverified", day: str | None = None, limit: int = 100
) -> tuple[int, list[dict]]:
    table = state.feedback_log.table()
    if status != "all":
        table = table[table["status"] == status]
    if day:
        table = table[table["date"] == day]
    table = table.sort_values("created_at", ascending=False)
    return int(len(table)), records(table.head(limit), FEEDBACK_COLUMNS)


@router.post(
    "",
    status_code=201,
    dependencies=[Depends(bearer)],
    responses={404: {"description": "no such note in rollouts(date)"}},
)
def post_feedback(body: FeedbackIn, request: Request) -> dict:
    """Feedback on one daily note (`date`, `headline_id`, `rollout_index`): thumbs up/down, stars
    1-5, an optional correction ("what should it have said?"), the reviewer. Appended durably
    (locked, fsynced) to the feedback log (FLYWHEEL_FEEDBACK_LOG); `note_feedback` reads it. Then the
    online note scorer takes one step on a rated feedback: `note_scorer` in the answer says whether
    it did, or why not."""
    return add_feedback(request.app.state.service, body)


@router.get("")
def list_feedback(
    request: Request,
    status: Literal["unverified", "approved", "edited", "rejected", "none", "all"] = Query(
        "unverified", description="unverified = corrections waiting for a curator."
    ),
    date: str | None = Query(None, pattern=r"^\d{4}-\d{2}-\d{2}$"),
    limit: int = Query(100, ge=1, le=1000),
) -> dict:
    """Feedback with its latest verdict folded in, newest first (the curation queue by default)."""
    total, rows = feedback_rows(request.app.state.service, status, date, limit)
    return {"status": status, "n": total, "feedback": rows}


@router.post(
    "/{feedback_id}/verify",
    status_code=201,
    dependencies=[Depends(bearer)],
    responses={404: {"description": "unknown feedback id"}, 409: {"description": "the feedback has no correction"}},
)
def verify(body: VerificationIn, request: Request, feedback_id: str = Path(pattern=FEEDBACK_ID)) -> dict:
    """A curator approves, edits (with the corrected text) or rejects a feedback's correction; the
    latest verdict counts. Verified corrections become `feedback_pairs`."""
    return verify_feedback(request.app.state.service, feedback_id, body)


@router.post("/materialize", dependencies=[Depends(bearer)])
def materialize(request: Request) -> dict:
    """Launch `note_feedback_job` for the days whose feedback or verdicts changed, then
    `feedback_pairs_job` (pairs from verified corrections and up/down ratings, exported once), as
    runs on the Dagster instance. Idempotent: the same changes return the runs already launched."""
    try:
        return launching.materialize_feedback(request.app.state.service)
    except NoDagsterInstance as err:
        raise HTTPException(status_code=503, detail=str(err)) from None
