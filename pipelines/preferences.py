"""The preference flywheel's Dagster definitions: assets, checks, jobs, the outcomes schedule and the
training sensor, and the resource only this area uses (`audit_log`)."""

import hashlib
import os
from datetime import datetime, timezone

import dagster as dg
import pandas as pd

from assets.partitions import preference_partitions
from assets.preferences.adapter import HISTORY_TABLE, preference_adapter
from assets.preferences.dataset import dpo_dataset
from assets.preferences.decisions import operator_decisions
from assets.preferences.evaluation import holdout_eval, style_drift
from assets.preferences.outcomes import decision_outcomes, pending_partitions_ready, unmaterialized_decision_dates
from outcome_flywheel.preferences.audit_log import records_frame
from outcome_flywheel.preferences.audit_log_file import AuditLog
from outcome_flywheel.preferences.status import (
    current_pairs,
    latest_adapter_dir,
    min_new_pairs,
    new_pairs_since,
    trained_state,
)
from outcome_flywheel.settings import env
from outcome_flywheel.storage import Warehouse
from resources.preferences import AuditLogResource

TRAIN_COOLDOWN_S = 3600

flywheel_assets = [operator_decisions, decision_outcomes, dpo_dataset, preference_adapter, holdout_eval, style_drift]

flywheel_decisions_job = dg.define_asset_job(
    "flywheel_decisions",
    selection=dg.AssetSelection.assets(operator_decisions, decision_outcomes),
    partitions_def=preference_partitions,
    description="Read the audit log's decisions of a date and compute their T+5 outcomes (a range of dates runs as one run: "
    "single-run backfill policy).",
)

flywheel_training_job = dg.define_asset_job(
    "flywheel_training",
    selection=dg.AssetSelection.assets(dpo_dataset, preference_adapter, holdout_eval, style_drift),
    description="dpo_dataset -> preference_adapter -> holdout_eval -> style_drift (one at a time: the accelerator pool).",
)


def train_cooldown_s() -> int:
    return int(os.environ.get("FLYWHEEL_TRAIN_COOLDOWN_S") or TRAIN_COOLDOWN_S)


@dg.schedule(
    job=flywheel_decisions_job,
    cron_schedule="30 17 * * 1-5",  # after the NYSE close (and its 13:00 half days)
    execution_timezone="America/New_York",
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Re-materialises decision partitions whose pending outcomes can now mature, and new decision dates of the audit log.",
)
def flywheel_outcomes_schedule(
    context: dg.ScheduleEvaluationContext, warehouse: dg.ResourceParam[Warehouse], audit_log: dg.ResourceParam[AuditLog]
):
    now = context.scheduled_execution_time or datetime.now(timezone.utc)
    outcomes = warehouse.read_all("decision_outcomes")
    ready = pending_partitions_ready(outcomes, now)
    keys = set(preference_partitions.get_partition_keys(current_time=now))
    try:
        log_dates = set(records_frame(audit_log.parse(), env("FLYWHEEL_TIMEZONE"))["decision_date"])
    except FileNotFoundError:
        log_dates = set()
    new_dates = unmaterialized_decision_dates(log_dates, set(warehouse.partitions("operator_decisions")), keys)
    tick = f"{now:%Y-%m-%d}"
    requests = [
        dg.RunRequest(
            run_key=f"pending-{k}-{tick}", partition_key=k, tags={"flywheel/reason": "pending outcome may mature"}
        )
        for k in ready
        if k in keys
    ]
    requests += [
        dg.RunRequest(
            run_key=f"new-{k}-{tick}", partition_key=k, tags={"flywheel/reason": "new decisions in the audit log"}
        )
        for k in new_dates
        if k not in ready
    ]
    if not requests:
        return dg.SkipReason("no pending outcome can mature yet and no new decision date in the audit log")
    return requests


def last_training_finished(warehouse) -> pd.Timestamp | None:
    """When the last preference training finished (UTC), None before the first."""
    hist = warehouse.read_all(HISTORY_TABLE)
    return pd.to_datetime(hist["finished_at"], utc=True).max() if len(hist) else None


def training_decision(
    warehouse, now: datetime, in_progress: int, min_new: int, cooldown_s: int, pairs: pd.DataFrame | None = None
) -> tuple[bool, str, str]:
    """(start?, reason, run key) for the training sensor; plain so tests can call it (`pairs`:
    `current_pairs(warehouse)` when the caller has it already)."""
    if in_progress:
        return False, f"a flywheel_training run is already queued or running ({in_progress})", ""
    last = last_training_finished(warehouse)
    if last is not None:
        waited = (pd.Timestamp(now) - last).total_seconds()
        if waited < cooldown_s:
            return False, f"cooldown: last training finished {waited:.0f}s ago (< {cooldown_s}s)", ""
    pairs = current_pairs(warehouse) if pairs is None else pairs
    new = new_pairs_since(pairs, trained_state(latest_adapter_dir(warehouse)))
    if new < min_new:
        return False, f"{new} new pairs since the last adapter (< {min_new})", ""
    state = "|".join(sorted(f"{d}:{v}" for d, v in zip(pairs["decision_id"], pairs["verdict"])))
    return True, f"{new} new pairs since the last adapter", "train-" + hashlib.sha256(state.encode()).hexdigest()[:16]


@dg.sensor(
    job=flywheel_training_job,
    minimum_interval_seconds=300,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Starts dpo_dataset -> preference_adapter -> holdout_eval -> style_drift when at least FLYWHEEL_MIN_NEW_PAIRS "
    "(10) new training pairs exist since the last adapter; one training at a time, FLYWHEEL_TRAIN_COOLDOWN_S (3600) apart.",
)
def flywheel_training_sensor(context: dg.SensorEvaluationContext, warehouse: dg.ResourceParam[Warehouse]):
    in_progress = context.instance.get_runs_count(
        dg.RunsFilter(
            job_name="flywheel_training",
            statuses=[
                dg.DagsterRunStatus.QUEUED,
                dg.DagsterRunStatus.NOT_STARTED,
                dg.DagsterRunStatus.STARTING,
                dg.DagsterRunStatus.STARTED,
            ],
        )
    )
    start, reason, run_key = training_decision(
        warehouse, datetime.now(timezone.utc), in_progress, min_new_pairs(), train_cooldown_s()
    )
    if not start:
        return dg.SkipReason(reason)
    return dg.RunRequest(run_key=run_key, tags={"flywheel/reason": reason})


def flywheel_resources() -> dict:
    return {"audit_log": AuditLogResource.from_env()}


defs = dg.Definitions(
    assets=dg.with_source_code_references(flywheel_assets),
    jobs=[flywheel_decisions_job, flywheel_training_job],
    schedules=[flywheel_outcomes_schedule],
    sensors=[flywheel_training_sensor],
    resources=flywheel_resources(),
)
