"""Launching the flywheel's jobs from the service, as runs of the code location on the Dagster
instance (they show in the Dagster UI like any run), never inside the service:

- with FLYWHEEL_DAGSTER_URL (production: `make up`), each run is submitted to that webserver
  (`DagsterGraphQLClient.submit_job_execution`, partitions through the `dagster/partition` tag or
  the range tags); the instance's run queue and `dagster-daemon` launch and monitor them;
- without it (`make serve` alone), the runs are queued for a worker process that executes them in
  order, one launch at a time (`pipelines.launch.enqueue`).

Every launch is idempotent: its runs carry `flywheel/request=<digest of what they would change>`,
and a request whose digest already has a queued, running or successful run returns those runs
instead of launching again. Partitions a queued or live run of the same job already covers are left
out, so two launches never materialise one partition. Run state is read with the instance's public
`get_run_records`. Before each launch (and at the service's start) runs whose worker died are failed
and their pool slots freed (`pipelines.launch.reconcile_dead_runs`; the daemon's run monitoring does
this for the runs it launched).
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from typing import Any
from urllib.parse import urlsplit

import dagster as dg
import pandas as pd
from dagster_graphql import DagsterGraphQLClient, DagsterGraphQLClientError

from assets.partitions import daily_rl_partitions, preference_partitions
from assets.preferences.outcomes import pending_partitions_ready
from outcome_flywheel.preferences.audit_log import records_frame
from outcome_flywheel.preferences.changes import changed_dates, contiguous_ranges
from outcome_flywheel.preferences.status import current_pairs, min_new_pairs, training_status
from outcome_flywheel.settings import env
from pipelines.launch import (
    IN_PROCESS,
    LAUNCH_TAG,
    LIVE_STATUSES,
    PARTITION_TAG,
    RANGE_END,
    RANGE_START,
    RunSpec,
    enqueue,
    live_runs,
    queued_launches,
    reconcile_dead_runs,
)
from pipelines.preferences import last_training_finished, train_cooldown_s, training_decision
from service.state import DagsterUnavailable, NoDagsterInstance, ServiceState

REQUEST_TAG = "flywheel/request"
REASON_TAG = "flywheel/reason"
# One queue: with the webserver, the instance's run queue launches the service's runs one at a time, in
# order, given `concurrency: runs: tag_concurrency_limits: [{key: flywheel/queue, limit: 1}]` (deploy/dagster.yaml);
# `feedback_pairs_job` must follow the `note_feedback_job` runs it reads.
QUEUE_TAG, QUEUE_NAME = "flywheel/queue", "service"
LIVE = LIVE_STATUSES
DONE_OR_LIVE = LIVE + (dg.DagsterRunStatus.SUCCESS,)
DECISIONS_JOB = "flywheel_decisions"
TRAINING_JOB = "flywheel_training"
# What a note_feedback row holds that the log decides (its human score follows from thumbs and stars).
FEEDBACK_DIGEST = (
    "feedback_id",
    "decision_date",
    "headline_id",
    "rollout_index",
    "thumbs",
    "stars",
    "correction",
    "reviewer",
    "status",
    "verified_correction",
    "curator",
    "verified_at",
)


def run_summary(run: dg.DagsterRun) -> dict[str, Any]:
    tags = run.tags
    return {
        "run_id": run.run_id,
        "launch_id": tags.get(LAUNCH_TAG),
        "job": run.job_name,
        "status": run.status.value,
        "partition": tags.get(PARTITION_TAG),
        "partition_range": [tags[RANGE_START], tags[RANGE_END]] if RANGE_START in tags else None,
    }


def queued_summary(spec: RunSpec) -> dict[str, Any]:
    """A run a worker will make (no run id yet): queued in the service's worker queue."""
    return {
        "run_id": None,
        "launch_id": spec.launch_id,
        "job": spec.job,
        "status": dg.DagsterRunStatus.QUEUED.value,
        "partition": spec.partition_key,
        "partition_range": list(spec.partition_range) if spec.partition_range else None,
    }


def _digest(payload: Any) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:20]


def _runs(instance: dg.DagsterInstance, statuses, **filters) -> list[dg.DagsterRun]:
    """Runs matching `filters` (dg.RunsFilter's) in `statuses`, oldest first."""
    records = instance.get_run_records(filters=dg.RunsFilter(statuses=list(statuses), **filters))
    return [r.dagster_run for r in reversed(records)]


def _queued_specs(instance: dg.DagsterInstance, job: str | None = None, digest: str | None = None) -> list[RunSpec]:
    """Specs live workers hold that have no run yet (embedded mode; none with a webserver)."""
    specs = [
        s
        for launch in queued_launches(instance)
        for s in launch
        if (job is None or s.job == job) and (digest is None or s.tags.get(REQUEST_TAG) == digest)
    ]
    return [
        s for s in specs if not instance.get_run_records(filters=dg.RunsFilter(tags={LAUNCH_TAG: s.launch_id}), limit=1)
    ]


def _existing(instance: dg.DagsterInstance, digest: str) -> list[dict[str, Any]]:
    runs = _runs(instance, DONE_OR_LIVE, tags={REQUEST_TAG: digest})
    return [run_summary(r) for r in runs] + [queued_summary(s) for s in _queued_specs(instance, digest=digest)]


def in_progress(instance: dg.DagsterInstance, job: str) -> list[dict[str, Any]]:
    """The live runs of `job` and the ones queued for a worker, oldest first."""
    return [run_summary(r) for r in live_runs(instance, job_name=job)] + [
        queued_summary(s) for s in _queued_specs(instance, job=job)
    ]


def reconcile(state: ServiceState) -> list[str]:
    """Fail the runs whose worker is gone and free their pool slots (the run ids failed)."""
    state.workers[:] = [
        w for w in state.workers if w.poll() is None
    ]  # reap the finished ones (a dead child is a zombie until then)
    return reconcile_dead_runs(state.instance())


def _days(block: tuple[str, str]) -> list[str]:
    return [d.strftime("%Y-%m-%d") for d in pd.date_range(block[0], block[1], freq="D")]


def covered_partitions(instance: dg.DagsterInstance, job: str) -> dict[str, dict[str, Any]]:
    """{partition: run summary} of the queued or live runs of `job` (one partition or a range each)."""
    covered = {}
    for run in in_progress(instance, job):
        if run["partition_range"]:
            covered.update({d: run for d in _days(tuple(run["partition_range"]))})
        elif run["partition"]:
            covered[run["partition"]] = run
    return covered


def _uncovered(
    instance: dg.DagsterInstance,
    specs: list[tuple[str, tuple[str, str] | None]],
    skipped: dict[str, str],
    covering: dict[str, dict[str, Any]],
):
    """`specs` without the partitions queued or live runs of the same job already cover (recorded in
    `skipped` by run id, or launch id while queued, and their runs in `covering`)."""
    out = []
    for job_name, block in specs:
        if block is None:
            out.append((job_name, None))
            continue
        covered = covered_partitions(instance, job_name)
        days = [d for d in _days(block) if d not in covered]
        for d in _days(block):
            if d in covered:
                run = covered[d]
                skipped[d] = run["run_id"] or run["launch_id"]
                covering[run["run_id"] or run["launch_id"]] = run
        out.extend((job_name, span) for span in contiguous_ranges(days))
    return out


def run_spec(job: str, block: tuple[str, str] | None, tags: dict[str, str]) -> RunSpec:
    """A run of `job` over `block` (one date: the partition; a span: the range), every step in process."""
    if block is None:
        return RunSpec(job, run_config=IN_PROCESS, tags=tags)
    if block[0] == block[1]:
        return RunSpec(job, partition_key=block[0], run_config=IN_PROCESS, tags=tags)
    return RunSpec(job, partition_range=block, run_config=IN_PROCESS, tags=tags)


def graphql_client(url: str) -> DagsterGraphQLClient:
    parts = urlsplit(url)
    return DagsterGraphQLClient(
        parts.hostname,
        port_number=parts.port,
        use_https=parts.scheme == "https",
        path_prefix=parts.path.rstrip("/"),
        timeout=60,
    )


def submit(url: str, specs: list[RunSpec], instance: dg.DagsterInstance) -> list[dict[str, Any]]:
    """Submit each spec to the Dagster webserver at `url` (queued there; its daemon launches it)."""
    client = graphql_client(url)
    runs = []
    for spec in specs:
        try:
            run_id = client.submit_job_execution(spec.job, run_config=dict(spec.run_config), tags=spec.run_tags())
        except DagsterGraphQLClientError as err:
            done = f" ({len(runs)} of {len(specs)} runs were submitted)" if runs else ""
            raise DagsterUnavailable(
                f"the Dagster webserver at {url} did not take the {spec.job} run: {err}{done}"
            ) from None
        run = instance.get_run_by_id(run_id)
        if run is None:  # idempotency reads this instance: without the run, every request would submit again
            raise DagsterUnavailable(
                f"the Dagster webserver at {url} queued run {run_id}, but DAGSTER_HOME's instance does not hold it: "
                "point DAGSTER_HOME at the instance (dagster.yaml) that webserver uses"
            )
        runs.append(run_summary(run))
    return runs


def _launch(
    state: ServiceState,
    job: str | list[tuple[str, tuple[str, str] | None]],
    ranges: list[tuple[str, str] | None] | None,
    digest: str,
    reason: str,
    skipped: dict[str, str] | None = None,
) -> tuple[bool, list[dict[str, Any]]]:
    """(launched, run summaries): the runs of an earlier identical request, or new runs (submitted
    to FLYWHEEL_DAGSTER_URL, else queued for one worker that executes them in order). `job` with
    `ranges` (partition spans, None = unpartitioned), or a list of (job, span) when the runs belong
    to several jobs. Partitions that queued or live runs of the same job cover are left out and
    recorded in `skipped` ({partition: run id, or launch id while queued})."""
    instance = state.instance()
    pairs = job if isinstance(job, list) else [(job, block) for block in ranges or [None]]
    skipped = {} if skipped is None else skipped
    with state.launch_lock:
        reconcile(state)
        existing = _existing(instance, digest)
        if existing:
            return False, existing
        covering: dict[str, dict[str, Any]] = {}
        pairs = _uncovered(instance, pairs, skipped, covering)
        if not pairs:  # every partition is being materialised by a queued or live run already: those runs
            return False, list(covering.values())
        tags = {REQUEST_TAG: digest, REASON_TAG: reason[:200], QUEUE_TAG: QUEUE_NAME}
        specs = [run_spec(job_name, block, tags) for job_name, block in pairs]
        if state.config.dagster_url:
            return True, submit(state.config.dagster_url, specs, instance)
        log = state.warehouse.path("service", "runs", f"{specs[0].launch_id}.log")
        state.workers.append(enqueue(specs, log, instance))
    return True, [queued_summary(s) for s in specs]


def extraction_plan(state: ServiceState, now: datetime | None = None) -> dict[str, Any]:
    """Decision dates whose log rows differ from their partitions, and partitions whose pending
    outcomes may now mature; dates that have no partition yet wait (with the reason)."""
    now = now or datetime.now(timezone.utc)
    frame = records_frame(state.audit_log.parse(), env("FLYWHEEL_TIMEZONE"))
    warehouse = state.warehouse
    changed = changed_dates(
        frame, lambda d: warehouse.read("operator_decisions", d), warehouse.partitions("operator_decisions")
    )
    keys = set(preference_partitions.get_partition_keys(current_time=now))
    ready = [d for d in pending_partitions_ready(warehouse.read_all("decision_outcomes"), now) if d in keys]
    first = preference_partitions.start.strftime("%Y-%m-%d")
    waiting = {
        d: (
            "before the first preference partition " + first
            if d < first
            else "no partition yet: a day's partition opens when the day ends (FLYWHEEL_TIMEZONE); "
            "the flywheel_outcomes_schedule or a later extract picks it up"
        )
        for d in changed
        if d not in keys
    }
    launchable = sorted(set(changed) & keys)
    return {
        "changed_dates": launchable,
        "pending_outcomes_ready": ready,
        "waiting": waiting,
        "dates": sorted(set(launchable) | set(ready)),
        "digest": _digest(
            {
                "changed": {d: changed[d] for d in launchable},
                "ready": ready,
                "day": now.date().isoformat() if ready else None,
            }
        ),
    }


def extract(state: ServiceState, now: datetime | None = None) -> dict[str, Any]:
    plan = extraction_plan(state, now)
    if not plan["dates"]:
        return {
            **plan,
            "launched": False,
            "runs": [],
            "message": "nothing changed: every decision partition matches the audit log",
        }
    skipped: dict[str, str] = {}
    launched, runs = _launch(
        state,
        DECISIONS_JOB,
        list(contiguous_ranges(plan["dates"])),
        plan["digest"],
        f"service: {len(plan['dates'])} decision date(s) changed or have outcomes to mature",
        skipped,
    )
    message = "launched" if launched else "already launched for these changes"
    if launched and skipped:
        message += f" ({len(skipped)} date(s) left to the live runs that cover them)"
    return {**plan, "launched": launched, "runs": runs, "in_live_runs": skipped, "message": message}


def training_plan(state: ServiceState, now: datetime | None = None) -> dict[str, Any]:
    """The readiness of `training_status` and the training sensor's own rule (one training at a
    time, the cooldown, the new-pairs threshold)."""
    now = now or datetime.now(timezone.utc)
    pairs = current_pairs(state.warehouse)  # built once for both readings of readiness
    status = training_status(state.warehouse, pairs=pairs)
    try:
        instance = state.instance()
        reconcile(state)  # a dead training run must not count as one in progress
        trainings = len(in_progress(instance, TRAINING_JOB))
    except NoDagsterInstance as err:  # status still answers; launching will say why not
        trainings, status["instance_error"] = 0, str(err)
    start, reason, run_key = training_decision(
        state.warehouse, now, trainings, min_new_pairs(), train_cooldown_s(), pairs
    )
    reasons = list(status["blocking_reasons"])
    if not start and "new pairs since the last adapter" not in reason:  # that one training_status already gave
        reasons.append(reason)
    last = last_training_finished(state.warehouse)
    remaining = max(0.0, train_cooldown_s() - (pd.Timestamp(now) - last).total_seconds()) if last is not None else 0.0
    return {
        **status,
        "ready_to_train": start and status["ready_to_train"],
        "blocking_reasons": reasons,
        "training_in_progress": trainings,
        "cooldown_s": train_cooldown_s(),
        "cooldown_remaining_s": round(remaining),
        "last_training_finished_at": None if last is None else last.isoformat(),
        "run_key": run_key or None,
    }


def train(state: ServiceState, dry_run: bool = True, now: datetime | None = None) -> tuple[bool, dict[str, Any]]:
    """(accepted, body): a dry run says what would happen; a real one launches `flywheel_training`
    when ready, else is refused with the blocking reasons."""
    plan = training_plan(state, now)
    if dry_run or not plan["ready_to_train"]:
        return plan["ready_to_train"] or dry_run, {**plan, "dry_run": dry_run, "launched": False, "runs": []}
    launched, runs = _launch(
        state,
        TRAINING_JOB,
        [None],
        plan["run_key"],
        "service: " + ", ".join(plan["blocking_reasons"])
        if plan["blocking_reasons"]
        else "service: training requested",
    )
    return True, {**plan, "dry_run": False, "launched": launched, "runs": runs}


FEEDBACK_DAY_JOB = "note_feedback_job"
FEEDBACK_PAIRS_JOB = "feedback_pairs_job"


def feedback_plan(state: ServiceState) -> dict[str, Any]:
    """Days whose feedback (with verdicts) differs from their `note_feedback` partition, and whether
    `feedback_pairs` is older than the feedback it is built from."""
    table = state.feedback_log.table()
    warehouse = state.warehouse
    changed = changed_dates(
        table.rename(columns={"date": "decision_date"}),
        lambda d: warehouse.read("note_feedback", d).rename(columns={"date": "decision_date"}),
        warehouse.partitions("note_feedback"),
        columns=FEEDBACK_DIGEST,
        key="feedback_id",
    )
    keys = set(daily_rl_partitions.get_partition_keys())
    days = sorted(set(changed) & keys)
    newest_day = max((f.mtime_ns / 1e9 for f in warehouse.files("note_feedback")), default=0.0)
    pairs_file = warehouse.stat("feedback_pairs")
    pairs_stale = bool(days) or (newest_day > 0 and (pairs_file is None or pairs_file.mtime_ns / 1e9 < newest_day))
    return {
        "changed_days": days,
        "waiting": {d: "not a day of the daily loop's partitions" for d in changed if d not in keys},
        "pairs_stale": pairs_stale,
        "digest": _digest(
            {
                "changed": {d: changed[d] for d in days},
                "pairs_stale": pairs_stale,
                "newest": newest_day if pairs_stale else None,
            }
        ),
    }


def materialize_feedback(state: ServiceState) -> dict[str, Any]:
    """Launch `note_feedback_job` for the changed days, then `feedback_pairs_job`, in one worker."""
    plan = feedback_plan(state)
    if not plan["pairs_stale"]:
        return {
            **plan,
            "launched": False,
            "runs": [],
            "message": "nothing changed: note_feedback and feedback_pairs match the log",
        }
    specs = [(FEEDBACK_DAY_JOB, block) for block in contiguous_ranges(plan["changed_days"])] + [
        (FEEDBACK_PAIRS_JOB, None)
    ]
    skipped: dict[str, str] = {}
    launched, runs = _launch(
        state, specs, None, plan["digest"], f"service: feedback changed on {len(plan['changed_days'])} day(s)", skipped
    )
    return {
        **plan,
        "launched": launched,
        "runs": runs,
        "in_live_runs": skipped,
        "message": "launched" if launched else "already launched for these changes",
    }
