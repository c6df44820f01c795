"""Launching the flywheel's jobs from the service, as runs of the code location on the Dagster
instance (they show in `make ui` like any run), executed by a worker process
(`pipelines.launch.start_worker`) so the service keeps answering.

Every launch is idempotent: its runs carry `flywheel/request=<digest of what they would change>`,
and a request whose digest already has a queued, running or successful run returns those runs
instead of launching again.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from typing import Any

import dagster as dg

from assets.partitions import preference_partitions
from assets.preferences.outcomes import pending_partitions_ready
from outcome_flywheel.preferences.audit_log import records_frame
from outcome_flywheel.preferences.changes import changed_dates, contiguous_ranges
from outcome_flywheel.preferences.status import min_new_pairs, training_status
from outcome_flywheel.settings import env
from pipelines.launch import IN_PROCESS, create_run, start_worker
from pipelines.preferences import train_cooldown_s, training_decision
from service.state import ServiceState

REQUEST_TAG = "flywheel/request"
REASON_TAG = "flywheel/reason"
LIVE = (dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED)
DONE_OR_LIVE = LIVE + (dg.DagsterRunStatus.SUCCESS,)
DECISIONS_JOB = "flywheel_decisions"
TRAINING_JOB = "flywheel_training"


def run_summary(run: dg.DagsterRun) -> dict[str, Any]:
    tags = run.tags
    return {
        "run_id": run.run_id, "job": run.job_name, "status": run.status.value,
        "partition": tags.get("dagster/partition"),
        "partition_range": [tags["dagster/asset_partition_range_start"], tags["dagster/asset_partition_range_end"]]
        if "dagster/asset_partition_range_start" in tags else None,
    }


def _digest(payload: Any) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:20]


def _existing(instance: dg.DagsterInstance, digest: str) -> list[dg.DagsterRun]:
    runs = instance.get_runs(filters=dg.RunsFilter(tags={REQUEST_TAG: digest}))
    return [r for r in runs if r.status in DONE_OR_LIVE]


def _launch(state: ServiceState, job: str, ranges: list[tuple[str, str] | None], digest: str, reason: str) -> tuple[bool, list[dg.DagsterRun]]:
    """(launched, runs): the runs of an earlier identical request, or new runs handed to a worker."""
    instance = state.instance()
    with state.launch_lock:
        existing = _existing(instance, digest)
        if existing:
            return False, existing
        tags = {REQUEST_TAG: digest, REASON_TAG: reason[:200]}
        runs = []
        for block in ranges:
            if block is None:
                runs.append(create_run(job, instance, run_config=IN_PROCESS, tags=tags))
            elif block[0] == block[1]:
                runs.append(create_run(job, instance, partition_key=block[0], run_config=IN_PROCESS, tags=tags))
            else:
                runs.append(create_run(job, instance, partition_range=block, run_config=IN_PROCESS, tags=tags))
        log = state.warehouse.path("service", "runs", f"{runs[0].run_id}.log")
        state.workers.append(start_worker([r.run_id for r in runs], log))
    return True, runs


def extraction_plan(state: ServiceState, now: datetime | None = None) -> dict[str, Any]:
    """Decision dates whose log rows differ from their partitions, and partitions whose pending
    outcomes may now mature; dates that have no partition yet wait (with the reason)."""
    now = now or datetime.now(timezone.utc)
    frame = records_frame(state.audit_log.parse(), env("FLYWHEEL_TIMEZONE"))
    warehouse = state.warehouse
    changed = changed_dates(frame, lambda d: warehouse.read("operator_decisions", d), warehouse.partitions("operator_decisions"))
    keys = set(preference_partitions.get_partition_keys(current_time=now))
    ready = [d for d in pending_partitions_ready(warehouse.read_all("decision_outcomes"), now) if d in keys]
    first = preference_partitions.start.strftime("%Y-%m-%d")
    waiting = {d: ("before the first preference partition " + first if d < first else
                   "no partition yet: a day's partition opens when the day ends (FLYWHEEL_TIMEZONE); "
                   "the flywheel_outcomes_schedule or a later extract picks it up")
               for d in changed if d not in keys}
    dates = sorted((set(changed) & keys) | set(ready))
    return {"changed_dates": sorted(set(changed) & keys), "pending_outcomes_ready": ready, "waiting": waiting, "dates": dates,
            "digest": _digest({"changed": {d: changed[d] for d in sorted(set(changed) & keys)}, "ready": ready, "day": now.date().isoformat() if ready else None})}


def extract(state: ServiceState, now: datetime | None = None) -> dict[str, Any]:
    plan = extraction_plan(state, now)
    if not plan["dates"]:
        return {**plan, "launched": False, "runs": [], "message": "nothing changed: every decision partition matches the audit log"}
    launched, runs = _launch(state, DECISIONS_JOB, list(contiguous_ranges(plan["dates"])), plan["digest"],
                             f"service: {len(plan['dates'])} decision date(s) changed or have outcomes to mature")
    message = "launched" if launched else "already launched for these changes"
    return {**plan, "launched": launched, "runs": [run_summary(r) for r in runs], "message": message}


def training_plan(state: ServiceState, now: datetime | None = None) -> dict[str, Any]:
    """The readiness of `training_status` and the training sensor's own rule (one training at a
    time, the cooldown, the new-pairs threshold)."""
    now = now or datetime.now(timezone.utc)
    status = training_status(state.warehouse)
    try:
        instance = state.instance()
        in_progress = len(instance.get_runs(filters=dg.RunsFilter(job_name=TRAINING_JOB, statuses=list(LIVE))))
    except Exception as err:  # no instance: status still answers, launching will say why not
        in_progress, status["instance_error"] = 0, str(err)
    start, reason, run_key = training_decision(state.warehouse, now, in_progress, min_new_pairs(), train_cooldown_s())
    reasons = list(status["blocking_reasons"])
    if not start and reason not in " ".join(reasons):
        reasons.append(reason)
    return {**status, "ready_to_train": start and status["ready_to_train"], "blocking_reasons": reasons,
            "training_in_progress": in_progress, "cooldown_s": train_cooldown_s(), "run_key": run_key or None}


def train(state: ServiceState, dry_run: bool = True, now: datetime | None = None) -> tuple[bool, dict[str, Any]]:
    """(accepted, body): a dry run says what would happen; a real one launches `flywheel_training`
    when ready, else is refused with the blocking reasons."""
    plan = training_plan(state, now)
    if dry_run or not plan["ready_to_train"]:
        return plan["ready_to_train"] or dry_run, {**plan, "dry_run": dry_run, "launched": False, "runs": []}
    launched, runs = _launch(state, TRAINING_JOB, [None], plan["run_key"], "service: " + ", ".join(plan["blocking_reasons"]) if plan["blocking_reasons"] else "service: training requested")
    return True, {**plan, "dry_run": False, "launched": launched, "runs": [run_summary(r) for r in runs]}
