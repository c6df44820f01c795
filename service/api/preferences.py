"""The preference flywheel: extraction and training runs, the operator's fingerprint, the dataset and
the style-match score."""

from __future__ import annotations

import json
import time
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from outcome_flywheel.json_rows import records
from outcome_flywheel.preferences.audit_log import Proposal, records_frame
from outcome_flywheel.preferences.fingerprint import style_fingerprint
from outcome_flywheel.preferences.weighting import PAIR_COLUMNS
from outcome_flywheel.settings import env
from service import launching
from service.limits import proposal_size_problem
from service.security import bearer
from service.state import NoDagsterInstance

router = APIRouter(prefix="/api/preferences", tags=["preferences"])


def _state(request: Request):
    return request.app.state.service


def no_instance(err: NoDagsterInstance) -> HTTPException:
    return HTTPException(status_code=503, detail=str(err))


@router.post("/extract", dependencies=[Depends(bearer)])
def extract(request: Request) -> dict:
    """Launch `flywheel_decisions` (operator_decisions + decision_outcomes) for the decision dates
    whose audit-log rows differ from their partitions, and for partitions whose pending outcomes may
    now mature: one run per span of consecutive dates, on the Dagster instance. Idempotent: the same
    changes return the runs already launched."""
    try:
        return launching.extract(_state(request))
    except NoDagsterInstance as err:
        raise no_instance(err) from None


@router.get("/stats")
def stats(request: Request) -> dict:
    """The operator's style fingerprint from every decision in the audit log (and the live log):
    sector tilts, top rejected names, turnover bias, approval rate by sector and size."""
    frame = records_frame(_state(request).audit_log.parse(), env("FLYWHEEL_TIMEZONE"))
    return style_fingerprint(frame)


@router.get("/dataset")
def dataset(
    request: Request, limit: int = Query(20, ge=1, le=500, description="How many pairs, newest decisions first.")
) -> dict:
    """The latest DPO pairs of `dpo_dataset` (newest decision dates first), every column of a pair
    (`weighting.PAIR_COLUMNS`)."""
    pairs = _state(request).warehouse.read("dpo_dataset")
    if pairs.empty:
        return {"n_pairs": 0, "pairs": []}
    latest = pairs.sort_values(["decision_date", "decision_id"], ascending=False).head(limit)
    rows = records(latest, PAIR_COLUMNS)
    for row in rows:
        row["prompt"] = json.loads(row["prompt"])
    return {"n_pairs": int(len(pairs)), "pairs": rows}


@router.get("/training_status")
def training_status(request: Request) -> dict:
    """Readiness to train, with the blocking reasons (new pairs since the last adapter, the holdout,
    one training at a time, the cooldown), the last evaluation and drift."""
    return launching.training_plan(_state(request))


@router.post(
    "/train", dependencies=[Depends(bearer)], responses={409: {"description": "not ready: the blocking reasons"}}
)
def train(
    request: Request, response: Response, dry_run: bool = Query(True, description="true: only say what would happen.")
) -> dict:
    """Launch `flywheel_training` (dpo_dataset -> preference_adapter -> holdout_eval -> style_drift)
    as a run on the Dagster instance when ready; `dry_run=true` (the default) launches nothing."""
    try:
        accepted, body = launching.train(_state(request), dry_run=dry_run)
    except NoDagsterInstance as err:
        raise no_instance(err) from None
    if not accepted:
        raise HTTPException(
            status_code=409, detail={"message": "not ready to train", "blocking_reasons": body["blocking_reasons"]}
        )
    if body["launched"]:
        response.status_code = 202
    return body


class StyleScoreIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    candidate: Proposal = Field(
        description="The proposal: its orders ({symbol, side, weight}) and optional note (`text`)."
    )
    prompt: dict[str, Any] | str | None = Field(
        default=None,
        description="The decision context (an object, rendered as the adapter's "
        "pairs were) or the prompt's text verbatim; none = an empty context.",
    )


class StyleScoreOut(BaseModel):
    available: bool
    style_match_score: float | None
    margin_logp: float | None
    comment: str
    adapter_path: str | None
    adapter_loads: int
    elapsed_ms: float


@router.post("/style_score", dependencies=[Depends(bearer)], response_model=StyleScoreOut)
def style_score(body: StyleScoreIn, request: Request) -> dict:
    """A proposal's style-match score against the latest preference adapter: sigmoid(beta * margin),
    margin = the adapter's DPO implicit reward of the plan minus that of holding. The model stays
    loaded; the adapter is reloaded when `latest` moves. `available` is false before the first adapter."""
    if not body.candidate.orders:
        raise HTTPException(
            status_code=422, detail="candidate.orders is empty: a proposal needs an order to score against holding"
        )
    context = body.prompt if isinstance(body.prompt, dict) else None
    text_prompt = body.prompt if isinstance(body.prompt, str) else None
    problem = proposal_size_problem(body.candidate.orders, context, body.candidate.text, text_prompt)
    if problem:
        raise HTTPException(status_code=422, detail=problem)
    scorer = _state(request).scorer
    started = time.perf_counter()
    try:
        result = scorer.score(
            [o.model_dump() for o in body.candidate.orders], context, body.candidate.text, prompt=text_prompt
        )
    except FileNotFoundError as err:
        raise HTTPException(status_code=503, detail=str(err)) from None
    return {**result, "adapter_loads": scorer.loads, "elapsed_ms": round((time.perf_counter() - started) * 1000, 1)}
