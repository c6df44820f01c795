"""Both loops at a glance: `/api/rl/status`, `/api/rl/history` and the online note scorer's `/api/rl/note_scorer`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from outcome_flywheel.daily_rl.report.status import daily_history, daily_status
from outcome_flywheel.feedback.curation import feedback_metrics, feedback_table
from outcome_flywheel.json_rows import records
from service import launching
from service.api.scorer import scorer_status

router = APIRouter(prefix="/api/rl", tags=["status"])


def feedback_status(state, parsed=None, pairs=None) -> dict[str, Any]:
    """The feedback metrics over every note shown (`feedback_metrics`) and the log's quarantined lines."""
    parsed = parsed if parsed is not None else state.feedback_log.read()
    pairs = pairs if pairs is not None else state.warehouse.read("feedback_pairs")
    table = feedback_table(parsed.feedback, parsed.verifications)
    return {
        **feedback_metrics(table, state.warehouse.count_rows("rollouts"), pairs),
        "quarantined_lines": len(parsed.quarantine),
    }


def loops_status(state) -> dict[str, Any]:
    return {
        "daily_rl": daily_status(state.warehouse),
        "preferences": launching.training_plan(state),
        "feedback": feedback_status(state),
    }


def loops_history(state) -> dict[str, Any]:
    return {"daily_rl": daily_history(state.warehouse), "preferences": preference_history(state.warehouse)}


def preference_history(warehouse) -> list[dict[str, Any]]:
    """One row per adapter run: its training (pairs, loss) and its holdout evaluation (AUC)."""
    training = warehouse.read_all("preference_training_history")
    evaluation = warehouse.read_all("holdout_eval_history")
    if training.empty:
        return []
    frame = training[["run", "finished_at", "status", "n_pairs", "n_holdout", "loss_first", "loss_last", "wall_s"]]
    if len(evaluation):
        latest = evaluation.sort_values("evaluated_at").drop_duplicates("adapter_run", keep="last")
        frame = frame.merge(
            latest[["adapter_run", "auc", "auc_low", "auc_high", "label", "n_rejected_winners"]],
            left_on="run",
            right_on="adapter_run",
            how="left",
        ).drop(columns="adapter_run")
    return records(frame.sort_values("finished_at"), list(frame.columns))


@router.get("/status")
def status(request: Request) -> dict:
    """The daily loop's latest checkpoint and its gate, last training and evaluation; the preference
    flywheel's readiness (pending pairs, cooldown, blocking reasons), last evaluation and drift; the
    feedback metrics (rate, positive, corrections, verified, pairs ready to export)."""
    return loops_status(request.app.state.service)


@router.get("/history")
def history(request: Request) -> dict:
    """Over time: the daily loop's reward, GSPO loss, KL to the base and gate per day; the preference
    adapters' loss and holdout AUC per run."""
    return loops_history(request.app.state.service)


@router.get("/note_scorer")
def note_scorer(request: Request) -> dict:
    """The online note scorer (tier 1a): updates, parameters, the state `latest` points at, and its
    held-out (test-then-train) pairwise accuracy against the judge, prices and people, each with a
    95% bootstrap interval, against a constant scorer's 0.5."""
    return scorer_status(request.app.state.service)
