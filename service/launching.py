"""Launching the flywheel's jobs from the service, as runs of the code location on the Dagster
instance (they show in `make ui` like any run), executed by a worker process
(`pipelines.launch.start_worker`) so the service keeps answering.

Every launch is idempotent: its runs carry `flywheel/request=<digest of what they would change>`,
and a request whose digest already has a queued, running or successful run returns those runs
instead of launching again. Before each launch (and at the service's start) runs whose worker died
are failed and their pool slots freed (`pipelines.launch.reconcile_dead_runs`); partitions a live run
of the same job already covers are left out, so two launches never materialise one partition.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from typing import Any

import dagster as dg
import pandas as pd

from assets.partitions import daily_rl_partitions, preference_partitions
from assets.preferences.outcomes import pending_partitions_ready
from outcome_flywheel.preferences.audit_log import records_frame
from outcome_flywheel.preferences.changes import changed_dates, contiguous_ranges
from outcome_flywheel.preferences.status import current_pairs, min_new_pairs, training_status
from outcome_flywheel.settings import env
from pipelines.launch import IN_PROCESS, RANGE_END, RANGE_START, create_run, reconcile_dead_runs, start_worker
from pipelines.preferences import last_training_finished, train_cooldown_s, training_decision
from service.state import NoDagsterInstance, ServiceState

REQUEST_TAG = "flywheel/request"
REASON_TAG = "flywheel/reason"
LIVE = (dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED)
DONE_OR_LIVE = LIVE + (dg.DagsterRunStatus.SUCCESS,)
DECISIONS_JOB = "flywheel_decisions"
TRAINING_JOB = "flywheel_training"
# What a note_feedback row holds that the log decides (its human score follows from thumbs and stars).
FEEDBACK_DIGEST = ("feedback_id", "decision_date", "headline_id", "rollout_index", "thumbs", "stars", "correction", "reviewer",
                   "status", "verified_correction", "curator", "verified_at")


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
    return [r for r in reversed(runs) if r.status in DONE_OR_LIVE]  # in the order they were made


def reconcile(state: ServiceState) -> list[str]:
    """Fail the runs whose worker is gone and free their pool slots (the run ids failed)."""
    state.workers[:] = [w for w in state.workers if w.poll() is None]  # reap the finished ones (a dead child is a zombie until then)
    return reconcile_dead_runs(state.instance())


def _days(block: tuple[str, str]) -> list[str]:
    return [d.strftime("%Y-%m-%d") for d in pd.date_range(block[0], block[1], freq="D")]


def covered_partitions(instance: dg.DagsterInstance, job: str) -> dict[str, str]:
    """{partition: run id} of the live runs of `job` (one partition or a range each)."""
    covered = {}
    for run in instance.get_runs(filters=dg.RunsFilter(job_name=job, statuses=list(LIVE))):
        tags = run.tags
        if RANGE_START in tags:
            covered.update({d: run.run_id for d in _days((tags[RANGE_START], tags[RANGE_END]))})
        elif "dagster/partition" in tags:
            covered[tags["dagster/partition"]] = run.run_id
    return covered


def _uncovered(instance: dg.DagsterInstance, specs: list[tuple[str, tuple[str, str] | None]], skipped: dict[str, str]):
    """`specs` without the partitions live runs of the same job already cover (recorded in `skipped`)."""
    out = []
    for job_name, block in specs:
        if block is None:
            out.append((job_name, None))
            continue
        covered = covered_partitions(instance, job_name)
        days = [d for d in _days(block) if d not in covered]
        skipped.update({d: covered[d] for d in _days(block) if d in covered})
        out.extend((job_name, span) for span in contiguous_ranges(days))
    return out


def _launch(state: ServiceState, job: str | list[tuple[str, tuple[str, str] | None]], ranges: list[tuple[str, str] | None] | None,
            digest: str, reason: str, skipped: dict[str, str] | None = None) -> tuple[bool, list[dg.DagsterRun]]:
    """(launched, runs): the runs of an earlier identical request, or new runs handed to one worker
    that executes them in order. `job` with `ranges` (partition spans, None = unpartitioned), or a
    list of (job, span) when the runs belong to several jobs. Partitions that live runs of the same
    job cover are left out and recorded in `skipped` ({partition: run id})."""
    instance = state.instance()
    specs = job if isinstance(job, list) else [(job, block) for block in ranges or [None]]
    skipped = {} if skipped is None else skipped
    with state.launch_lock:
        reconcile(state)
        existing = _existing(instance, digest)
        if existing:
            return False, existing
        specs = _uncovered(instance, specs, skipped)
        if not specs:  # every partition is being materialised by a live run already: those runs
            return False, [instance.get_run_by_id(r) for r in dict.fromkeys(skipped.values())]
        tags = {REQUEST_TAG: digest, REASON_TAG: reason[:200]}
        runs = []
        for job_name, block in specs:
            if block is None:
                runs.append(create_run(job_name, instance, run_config=IN_PROCESS, tags=tags))
            elif block[0] == block[1]:
                runs.append(create_run(job_name, instance, partition_key=block[0], run_config=IN_PROCESS, tags=tags))
            else:
                runs.append(create_run(job_name, instance, partition_range=block, run_config=IN_PROCESS, tags=tags))
        log = state.warehouse.path("service", "runs", f"{runs[0].run_id}.log")
        try:
            state.workers.append(start_worker([r.run_id for r in runs], log, instance))
        except OSError as err:  # no worker: fail the runs, or they would block the next identical request forever
            for run in runs:
                instance.report_run_failed(run, f"the launch worker could not start: {err}")
            raise
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
    launchable = sorted(set(changed) & keys)
    return {"changed_dates": launchable, "pending_outcomes_ready": ready, "waiting": waiting, "dates": sorted(set(launchable) | set(ready)),
            "digest": _digest({"changed": {d: changed[d] for d in launchable}, "ready": ready, "day": now.date().isoformat() if ready else None})}


def extract(state: ServiceState, now: datetime | None = None) -> dict[str, Any]:
    plan = extraction_plan(state, now)
    if not plan["dates"]:
        return {**plan, "launched": False, "runs": [], "message": "nothing changed: every decision partition matches the audit log"}
    skipped: dict[str, str] = {}
    launched, runs = _launch(state, DECISIONS_JOB, list(contiguous_ranges(plan["dates"])), plan["digest"],
                             f"service: {len(plan['dates'])} decision date(s) changed or have outcomes to mature", skipped)
    message = "launched" if launched else "already launched for these changes"
    if launched and skipped:
        message += f" ({len(skipped)} date(s) left to the live runs that cover them)"
    return {**plan, "launched": launched, "runs": [run_summary(r) for r in runs], "in_live_runs": skipped, "message": message}


def training_plan(state: ServiceState, now: datetime | None = None) -> dict[str, Any]:
    """The readiness of `training_status` and the training sensor's own rule (one training at a
    time, the cooldown, the new-pairs threshold)."""
    now = now or datetime.now(timezone.utc)
    pairs = current_pairs(state.warehouse)  # built once for both readings of readiness
    status = training_status(state.warehouse, pairs=pairs)
    try:
        instance = state.instance()
        reconcile(state)  # a dead training run must not count as one in progress
        in_progress = len(instance.get_runs(filters=dg.RunsFilter(job_name=TRAINING_JOB, statuses=list(LIVE))))
    except NoDagsterInstance as err:  # status still answers; launching will say why not
        in_progress, status["instance_error"] = 0, str(err)
    start, reason, run_key = training_decision(state.warehouse, now, in_progress, min_new_pairs(), train_cooldown_s(), pairs)
    reasons = list(status["blocking_reasons"])
    if not start and "new pairs since the last adapter" not in reason:  # that one training_status already gave
        reasons.append(reason)
    last = last_training_finished(state.warehouse)
    remaining = max(0.0, train_cooldown_s() - (pd.Timestamp(now) - last).total_seconds()) if last is not None else 0.0
    return {**status, "ready_to_train": start and status["ready_to_train"], "blocking_reasons": reasons,
            "training_in_progress": in_progress, "cooldown_s": train_cooldown_s(), "cooldown_remaining_s": round(remaining),
            "last_training_finished_at": None if last is None else last.isoformat(), "run_key": run_key or None}


def train(state: ServiceState, dry_run: bool = True, now: datetime | None = None) -> tuple[bool, dict[str, Any]]:
    """(accepted, body): a dry run says what would happen; a real one launches `flywheel_training`
    when ready, else is refused with the blocking reasons."""
    plan = training_plan(state, now)
    if dry_run or not plan["ready_to_train"]:
        return plan["ready_to_train"] or dry_run, {**plan, "dry_run": dry_run, "launched": False, "runs": []}
    launched, runs = _launch(state, TRAINING_JOB, [None], plan["run_key"], "service: " + ", ".join(plan["blocking_reasons"]) if plan["blocking_reasons"] else "service: training requested")
    return True, {**plan, "dry_run": False, "launched": launched, "runs": [run_summary(r) for r in runs]}


FEEDBACK_DAY_JOB = "note_feedback_job"
FEEDBACK_PAIRS_JOB = "feedback_pairs_job"


def feedback_plan(state: ServiceState) -> dict[str, Any]:
    """Days whose feedback (with verdicts) differs from their `note_feedback` partition, and whether
    `feedback_pairs` is older than the feedback it is built from."""
    table = state.feedback_log.table()
    warehouse = state.warehouse
    changed = changed_dates(table.rename(columns={"date": "decision_date"}),
                            lambda d: warehouse.read("note_feedback", d).rename(columns={"date": "decision_date"}),
                            warehouse.partitions("note_feedback"), columns=FEEDBACK_DIGEST, key="feedback_id")
    keys = set(daily_rl_partitions.get_partition_keys())
    days = sorted(set(changed) & keys)
    newest_day = max((f.stat().st_mtime for f in warehouse.files("note_feedback")), default=0.0)
    pairs_file = warehouse.partition_file("feedback_pairs")
    pairs_stale = bool(days) or (newest_day > 0 and (not pairs_file.exists() or pairs_file.stat().st_mtime < newest_day))
    return {"changed_days": days, "waiting": {d: "not a day of the daily loop's partitions" for d in changed if d not in keys},
            "pairs_stale": pairs_stale, "digest": _digest({"changed": {d: changed[d] for d in days}, "pairs_stale": pairs_stale,
                                                           "newest": newest_day if pairs_stale else None})}


def materialize_feedback(state: ServiceState) -> dict[str, Any]:
    """Launch `note_feedback_job` for the changed days, then `feedback_pairs_job`, in one worker."""
    plan = feedback_plan(state)
    if not plan["pairs_stale"]:
        return {**plan, "launched": False, "runs": [], "message": "nothing changed: note_feedback and feedback_pairs match the log"}
    specs = [(FEEDBACK_DAY_JOB, block) for block in contiguous_ranges(plan["changed_days"])] + [(FEEDBACK_PAIRS_JOB, None)]
    skipped: dict[str, str] = {}
    launched, runs = _launch(state, specs, None, plan["digest"], f"service: feedback changed on {len(plan['changed_days'])} day(s)", skipped)
    return {**plan, "launched": launched, "runs": [run_summary(r) for r in runs], "in_live_runs": skipped,
            "message": "launched" if launched else "already launched for these changes"}
