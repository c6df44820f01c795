"""The review pages: notes with their feedback form (`/`), a proposal with its style-match panel
(`/proposal`), the curation queue (`/curation`), both loops' status (`/status`) and sign-in.

Form posts answer 303 to the page they came from (post / redirect / get), with a flash message or
the reason they were refused; they call the same functions as the JSON API."""

from __future__ import annotations

import base64
import hmac
import math
import re
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Depends, Form, HTTPException, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import HTMLResponse, RedirectResponse
from jinja2 import Environment, FileSystemLoader, select_autoescape
from pydantic import ValidationError

from outcome_flywheel.daily_rl.report.status import daily_figures
from outcome_flywheel.feedback.curation import feedback_table
from outcome_flywheel.feedback.records import FeedbackIn, VerificationIn
from outcome_flywheel.feedback.review import find_note, notes_for_review, review_days
from outcome_flywheel.json_rows import records
from outcome_flywheel.preferences.audit_log import AuditRecord
from outcome_flywheel.preferences.metrics import rejected_winners, style_band
from outcome_flywheel.preferences.status import drift, last_eval
from outcome_flywheel.preferences.weighting import render_plan
from service import launching
from service.api.decisions import record_decision
from service.api.feedback import add_feedback, verify_feedback
from service.api.rl import feedback_status, loops_history, loops_status
from service.api.scorer import rank_notes
from service.limits import proposal_size_problem
from service.pages.forms import FormError, parse_context, parse_order_lines, validation_text
from service.security import SESSION_COOKIE, csrf_value, new_session, require_csrf, session_of
from service.state import NoDagsterInstance

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"
# Autoescape everything: notes and corrections are model output and people's text, shown as text.
jinja = Environment(
    loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(default=True, default_for_string=True)
)
router = APIRouter(include_in_schema=False)


def fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


# Status tables: figures to what they can say. Losses, KLs and p-values span orders of magnitude (3 significant
# digits); shares, scores, rates and percentage points get 3 decimals; counts stay whole; times to the minute.
SIGNIFICANT = re.compile(r"(^|_)(loss|kl|p_value)(_|$)")
COUNTS = re.compile(r"(^|_)(n|steps|examples|pairs|calls|trained|days|lines)(_|$)|^n_")
TIMESTAMP = re.compile(r"^(\d{4}-\d{2}-\d{2})T(\d{2}:\d{2})(:\d{2}(\.\d+)?)?(Z|[+-]00:?00)?$")


def cell(value: Any, column: str = "") -> str:
    """One value of a status table, rounded for a person (the JSON API keeps every digit)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if COUNTS.search(column) and value.is_integer():
            return str(int(value))
        if SIGNIFICANT.search(column) or 0 < abs(value) < 0.01:  # 0.0035 is not 0.004
            return f"{value:.3g}"
        return f"{value:.3f}"
    if isinstance(value, str) and (m := TIMESTAMP.match(value)):
        return f"{m.group(1)} {m.group(2)}" + (" UTC" if m.group(5) else "")
    return str(value)


jinja.globals["fmt"] = fmt
jinja.globals["cell"] = cell


def message_signature(config, kind: str, text: str) -> str:
    return config.derived(f"message:{kind}:{text}")[:32]


def signed_message(request: Request, kind: str) -> str | None:
    """The page's `?flash=` / `?error=` text, shown only when this service wrote it (its signature
    in `?sig=`): a link from elsewhere cannot put its words in the page's message box."""
    text = request.query_params.get(kind)
    signature = request.query_params.get("sig", "")
    if not text or not hmac.compare_digest(
        signature.encode("utf-8", "replace"), message_signature(request.app.state.service.config, kind, text).encode()
    ):
        return None
    return text


def render(request: Request, template: str, status_code: int = 200, **values) -> HTMLResponse:
    state = request.app.state.service
    session = session_of(request)
    context = {
        "request": request,
        "logged_in": session is not None,
        "csrf": csrf_value(state.config, session),
        "flash": signed_message(request, "flash"),
        "error": signed_message(request, "error"),
        **values,
    }
    return HTMLResponse(jinja.get_template(template).render(**context), status_code=status_code)


def back(request: Request, path: str, anchor: str = "", **params) -> RedirectResponse:
    """303 to `path` with `params`; a `flash` or `error` message goes with its signature."""
    params = {k: v for k, v in params.items() if v is not None}
    for kind in ("flash", "error"):
        if kind in params:
            params["sig"] = message_signature(request.app.state.service.config, kind, params[kind])
    query = urlencode(params)
    return RedirectResponse(f"{path}?{query}{anchor}" if query else f"{path}{anchor}", status_code=303)


def learning_signal(preferences: dict[str, Any]) -> str:
    """'learning signal: NN% AUC on M held-out plans · stable|drift' from the last holdout evaluation."""
    last = preferences.get("last_eval")
    if not last or last.get("auc") is None:
        return "learning signal: no holdout evaluation yet"
    drift = (preferences.get("drift") or {}).get("drift")
    word = {"low": "stable", "high": "drift"}.get(drift, "too few evaluations to tell drift")
    return f"learning signal: {last['auc'] * 100:.0f}% AUC on {last['n_holdout']} held-out plans · {word}"


# -- notes ---------------------------------------------------------------------------------------


@router.get("/", response_class=HTMLResponse)
def notes_page(request: Request, date: str | None = Query(None, pattern=r"^\d{4}-\d{2}-\d{2}$")):
    state = request.app.state.service
    days = review_days(state.warehouse)
    day = date or (days[0] if days else None)
    headlines = notes_for_review(state.warehouse, day, state.feedback_log.table()) if day else []
    ranking = rank_notes(state, day, headlines) if headlines else {"ranked": False, "reason": "no notes"}
    return render(
        request, "notes.html", title="Notes", active="/", days=days, day=day, headlines=headlines, ranking=ranking
    )


@router.post("/feedback", dependencies=[Depends(require_csrf)])
def feedback_form(
    request: Request,
    date: str = Form(...),
    headline_id: str = Form(...),
    rollout_index: str = Form(...),
    thumbs: str = Form(""),
    stars: str = Form(""),
    correction: str = Form(""),
    reviewer: str = Form(""),
):
    anchor = f"#h-{quote(headline_id)}"
    try:
        body = FeedbackIn(
            date=date,
            headline_id=headline_id,
            rollout_index=rollout_index,
            thumbs=thumbs or None,
            stars=stars or None,
            correction=correction or None,
            reviewer=reviewer,
        )
        record = add_feedback(request.app.state.service, body)
    except ValidationError as err:
        return back(request, "/", anchor, date=date, error="feedback not saved: " + validation_text(err))
    except HTTPException as err:
        return back(request, "/", anchor, date=date, error="feedback not saved: " + str(err.detail))
    flash = f"Thanks: feedback {record['feedback_id'][:8]} saved on {headline_id} #{rollout_index}."
    return back(request, "/", anchor, date=date, flash=flash)


# -- proposal ------------------------------------------------------------------------------------


def holdout_winners(state, preferences: dict[str, Any]) -> list[dict[str, Any]]:
    last = preferences.get("last_eval")
    scored = state.warehouse.read("holdout_eval")
    if not last or scored.empty:
        return []
    scored = scored[scored["adapter_run"] == last["adapter_run"]]
    return records(rejected_winners(scored), ["decision_id", "decision_date", "style_match_score", "vs_spy_pct"])


@router.get("/proposal", response_class=HTMLResponse)
def proposal_page(request: Request, orders: str = "", context: str = "", text: str = ""):
    """The proposal form (filled from the query, e.g. after a decision); scoring is its POST."""
    form = {"orders": orders, "context": context, "text": text}
    return render(request, "proposal.html", title="Proposal", active="/proposal", form=form, score=None)


@router.post("/proposal", response_class=HTMLResponse, dependencies=[Depends(require_csrf)])
def score_proposal(request: Request, orders: str = Form(""), context: str = Form(""), text: str = Form("")):
    """The style-match panel: model work, so only for a signed-in browser (session + CSRF) and
    capped in orders and prompt size."""
    state = request.app.state.service
    form = {"orders": orders, "context": context, "text": text}
    try:
        parsed_orders = parse_order_lines(orders)
        parsed_context = parse_context(context)
        problem = proposal_size_problem(parsed_orders, parsed_context, text)
        if problem or not parsed_orders:
            raise FormError(problem or "type at least one order, like 'buy NVDA 5%'")
        score = state.scorer.score(parsed_orders, parsed_context, text or None)
    except (FormError, ValidationError) as err:
        return render(
            request,
            "proposal.html",
            422,
            title="Proposal",
            active="/proposal",
            form=form,
            score=None,
            error=validation_text(err),
        )
    preferences = {"last_eval": last_eval(state.warehouse), "drift": drift(state.warehouse)}
    return render(
        request,
        "proposal.html",
        title="Proposal",
        active="/proposal",
        form=form,
        score=score,
        band=style_band(score["style_match_score"]),
        learning_signal=learning_signal(preferences),
        rejected_winners=holdout_winners(state, preferences),
        plan=render_plan(parsed_orders),
    )


@router.post("/proposal/decide", dependencies=[Depends(require_csrf)])
def decide_form(
    request: Request,
    orders: str = Form(...),
    context: str = Form(""),
    text: str = Form(""),
    decision: str = Form(""),
    operator_orders: str = Form(""),
    reason: str = Form(""),
):
    here = {"orders": orders, "context": context, "text": text}
    try:
        record = AuditRecord(
            decision_id=f"web-{uuid.uuid4().hex[:12]}",
            ts=datetime.now(timezone.utc),
            decision=decision,
            proposal={"orders": parse_order_lines(orders), "text": text or None},
            reason=reason or None,
            context=parse_context(context),
            operator_orders=parse_order_lines(operator_orders) if decision == "override" else None,
        )
        _, body = record_decision(request.app.state.service, record)
    except (FormError, ValidationError) as err:
        return back(request, "/proposal", **here, error="decision not recorded: " + validation_text(err))
    return back(
        request,
        "/proposal",
        **here,
        flash=f"Decision {body['decision_id']} ({decision}) recorded in {body['live_log']}; "
        "POST /api/preferences/extract materialises it.",
    )


# -- curation ------------------------------------------------------------------------------------


@router.get("/curation", response_class=HTMLResponse)
def curation_page(request: Request):
    state = request.app.state.service
    parsed = state.feedback_log.read()
    table = feedback_table(parsed.feedback, parsed.verifications)
    queue = records(table[table["status"] == "unverified"].sort_values("created_at"), list(table.columns))
    days: dict[str, Any] = {}  # each day's notes read once
    for row in queue:
        notes = days.setdefault(row["date"], state.warehouse.read("rollouts", row["date"]))
        note = find_note(notes, row["headline_id"], row["rollout_index"])
        row["note"] = note["response"] if note else None
    pairs = state.warehouse.read("feedback_pairs")
    metrics = feedback_status(state, parsed, pairs)
    rows = (
        records(pairs, ["pair_id", "source", "date", "headline_id", "chosen", "rejected", "exported_at"])
        if len(pairs)
        else []
    )
    return render(
        request, "curation.html", title="Curation", active="/curation", queue=queue, pairs=rows, metrics=metrics
    )


@router.post("/curation/materialize", dependencies=[Depends(require_csrf)])
def materialize_form(request: Request):
    try:
        result = launching.materialize_feedback(request.app.state.service)
    except NoDagsterInstance as err:
        return back(request, "/curation", error=str(err))
    runs = ", ".join(f"{r['job']} {(r['run_id'] or r['launch_id'])[:8]}" for r in result["runs"])
    return back(
        request,
        "/curation",
        flash=f"{result['message']}: {runs or 'no runs'}. The pairs appear here when the runs finish (Dagster UI: Runs).",
    )


@router.post("/curation/{feedback_id}", dependencies=[Depends(require_csrf)])
def verify_form(
    request: Request,
    feedback_id: str = PathParam(pattern=r"^[0-9a-f]{32}$"),
    action: str = Form(""),
    correction: str = Form(""),
    curator: str = Form(""),
):
    try:
        verdict = VerificationIn(
            action=action, correction=(correction or None) if action == "edit" else None, curator=curator
        )
        verify_feedback(request.app.state.service, feedback_id, verdict)
    except ValidationError as err:
        return back(request, "/curation", error="verdict not saved: " + validation_text(err))
    except HTTPException as err:
        return back(request, "/curation", error="verdict not saved: " + str(err.detail))
    return back(request, "/curation", flash=f"Verdict '{action}' saved on feedback {feedback_id[:8]}.")


# -- status and sign-in --------------------------------------------------------------------------


@router.get("/status", response_class=HTMLResponse)
def status_page(request: Request):
    state = request.app.state.service
    status = loops_status(state)
    history = loops_history(state)
    figures = [
        {
            "title": f["title"],
            "alt": f["alt"],
            "name": f["name"],
            "src": "data:image/png;base64," + base64.b64encode(f["png"]).decode("ascii"),
        }
        for f in daily_figures(state.warehouse)
    ]
    return render(
        request,
        "status.html",
        title="Status",
        active="/status",
        status=status,
        history=history,
        learning_signal=learning_signal(status["preferences"]),
        figures=figures,
    )


def _safe_next(target: str | None) -> str:
    # Only paths of this site: an open redirect would hand the session to another page.
    return target if target and target.startswith("/") and not target.startswith("//") else "/"


def _signed_in(request: Request, target: str) -> RedirectResponse:
    config = request.app.state.service.config
    response = RedirectResponse(_safe_next(target), status_code=303)
    response.set_cookie(
        SESSION_COOKIE,
        new_session(config),
        max_age=config.session_ttl_s,
        httponly=True,
        samesite="strict",
        path="/",
        secure=not config.is_loopback,
    )  # off loopback the service is meant to sit behind HTTPS
    return response


@router.get("/login", response_class=HTMLResponse)
def login_page(request: Request, next: str = "/"):
    """The page to paste the token into. Signing in is its POST: a token in a URL would stay in the
    browser's history and the access log, so `?token=` signs nobody in."""
    if "token" in request.query_params:
        return render(
            request,
            "login.html",
            400,
            title="Sign in",
            active="",
            next=_safe_next(next),
            error="a token in the address is not accepted (it would stay in the history and the logs): paste it below",
        )
    return render(request, "login.html", title="Sign in", active="", next=_safe_next(next))


@router.post("/login")
def login(request: Request, token: str = Form(""), next: str = Form("/")):
    if not request.app.state.service.config.is_token(token.strip()):
        return render(
            request,
            "login.html",
            401,
            title="Sign in",
            active="",
            next=_safe_next(next),
            error="that is not the service's token",
        )
    return _signed_in(request, next)


@router.post("/logout")
def logout():
    response = RedirectResponse("/", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response
