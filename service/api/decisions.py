"""`POST /api/decisions`: one operator decision, appended durably to the live audit log."""

from __future__ import annotations

from fastapi import APIRouter, Depends, HTTPException, Request, Response

from outcome_flywheel.preferences.audit_log import AuditRecord, decision_date
from outcome_flywheel.preferences.audit_log_file import DecisionConflict
from outcome_flywheel.settings import env
from service.security import bearer

router = APIRouter(prefix="/api", tags=["decisions"])


def record_decision(state, record: AuditRecord) -> tuple[int, dict]:
    """(HTTP status, body): 201 appended, 200 the same decision was there already; 409 raised on a
    known id with another body."""
    try:
        outcome = state.audit_log.append(record)
    except DecisionConflict as err:
        raise HTTPException(status_code=409, detail={"message": str(err), "existing": err.existing}) from None
    body = {
        "status": outcome,
        "decision_id": record.decision_id,
        "decision_date": decision_date(record.ts, env("FLYWHEEL_TIMEZONE")),
        "live_log": str(state.audit_log.live_file),
    }
    return (201 if outcome == "created" else 200), body


@router.post(
    "/decisions",
    status_code=201,
    dependencies=[Depends(bearer)],
    responses={
        200: {"description": "the same decision was already in the log (nothing written)"},
        409: {"description": "the decision_id is in the log with a different body"},
    },
)
def post_decision(record: AuditRecord, request: Request, response: Response) -> dict:
    """One operator decision in the audit-log line format. It is appended to the live audit log
    (FLYWHEEL_LIVE_AUDIT_LOG) under an exclusive lock and fsynced before the answer; a repeated
    `decision_id` with the same body is a no-op (200), with a different body a 409. The bundled
    sample log is never written. `POST /api/preferences/extract` then materialises it."""
    status, body = record_decision(request.app.state.service, record)
    response.status_code = status
    return body
