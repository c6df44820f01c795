"""Run a job of this code location in the calling process, recorded as that code location's run.

`dg.materialize` and `JobDefinition.execute_in_process` record runs that belong to no code location
(no repository origin): the Dagster UI leaves them off the job's page and the overview timeline and
cannot re-execute them. The demo therefore runs the named jobs of `pipelines.definitions.defs`
with the origin `dagster dev -w workspace.yaml` gives them (same location and repository name), so
those runs look like runs launched from the UI: job pages, timeline, re-execute and backfill
history all work. The run still executes here, in this process, without a daemon or a code server.

The review service (service/launching.py) creates runs the same way (`create_run`) and hands them
to a worker process, `python -m pipelines.launch RUN_ID...`, which executes them in order
(`execute_created_run`), so a training never runs inside the service.

Dead executors are found and failed (`reconcile_dead_runs`): every run made here carries the process
that made it (`flywheel/created_by`) and, once handed to a worker, the worker (`flywheel/worker`), each
as pid and start time (a reused pid is another process). A live run whose executor is gone (a
`kill -9`, an OOM kill, a reboot) is reported failed and its concurrency-pool slots are freed, as
Dagster's run monitoring does for runs the daemon launched; otherwise its `duckdb` slot stays claimed
and every later run waits "blocked by limit for pool duckdb" for good. Workers form one queue: each
takes an exclusive lock in $DAGSTER_HOME before executing, so two launches never run at once.

Dagster has no public call for "execute in process with a remote origin", so this module is the one
place that reaches into `dagster._core` for it (what `dagster job launch` and the run worker do).
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

import dagster as dg
import psutil
from dagster._core.definitions.reconstruct import ReconstructableRepository
from dagster._core.execution.api import create_execution_plan, execute_run
from dagster._core.execution.job_execution_result import JobExecutionResult
from dagster._core.remote_origin import CodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin
from dagster._core.workspace.load_target import WorkspaceFileTarget

from outcome_flywheel.settings import PROJECT_ROOT

WORKSPACE_FILE = PROJECT_ROOT / "workspace.yaml"
DEFS_MODULE = "pipelines.definitions"
DEFS_ATTRIBUTE = "defs"
REPOSITORY_NAME = "__repository__"  # the one repository of a `Definitions` object
# Run config: every step in the calling process. The default executor starts a process per step,
# each importing torch and the code location again (minutes over a demo on 2 cores). It is recorded
# with the run, so a re-execution from the UI runs the same way.
IN_PROCESS = {"execution": {"config": {"in_process": {}}}}
RANGE_START = "dagster/asset_partition_range_start"
RANGE_END = "dagster/asset_partition_range_end"
CREATOR_TAG = "flywheel/created_by"  # "<pid>:<start time>" of the process that created the run
WORKER_TAG = "flywheel/worker"  # "<pid>:<start time>" of the worker process that executes it
PARENT_RUN_TAG = "dagster/parent_run_id"  # a re-execution from the UI copies tags but runs elsewhere
LIVE_STATUSES = (dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED)
QUEUE_LOCK = "flywheel_launch_queue.lock"


def process_identity(pid: int) -> str:
    """`<pid>:<start time>`: names one process, not a pid the system may hand out again."""
    try:
        return f"{pid}:{psutil.Process(pid).create_time()!r}"
    except psutil.NoSuchProcess:
        return f"{pid}:gone"


def process_alive(identity: str) -> bool:
    pid, _, started = identity.partition(":")
    try:
        process = psutil.Process(int(pid))
        return process.status() != psutil.STATUS_ZOMBIE and repr(process.create_time()) == started
    except (psutil.NoSuchProcess, ValueError):
        return False


def executor_of(run: dg.DagsterRun) -> str | None:
    """The identity of the process that executes (or will hand over) the run; None for runs not made here."""
    if PARENT_RUN_TAG in run.tags:
        return None
    return run.tags.get(WORKER_TAG) or run.tags.get(CREATOR_TAG)


def reconcile_dead_runs(instance: dg.DagsterInstance) -> list[str]:
    """Fail every live run made here whose executing process is gone, and free its pool slots.
    Returns the run ids failed."""
    failed = []
    for run in instance.get_runs(filters=dg.RunsFilter(statuses=list(LIVE_STATUSES))):
        identity = executor_of(run)
        if identity is None or process_alive(identity):
            continue
        who = "worker" if WORKER_TAG in run.tags else "process that created it"
        instance.report_run_failed(run, f"the {who} ({identity.split(':')[0]}) is gone: failed by reconciliation, its pool slots freed")
        failed.append(run.run_id)
    if failed and instance.event_log_storage.supports_global_concurrency_limits:
        for run_id in failed:
            instance.event_log_storage.free_concurrency_slots_for_run(run_id)
    return failed


@contextmanager
def launch_queue(instance: dg.DagsterInstance) -> Iterator[None]:
    """One worker at a time per instance (an exclusive lock in its root directory, released by the
    kernel when the holder dies, `kill -9` included)."""
    root = Path(instance.root_directory)
    root.mkdir(parents=True, exist_ok=True)
    with open(root / QUEUE_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@lru_cache(maxsize=1)
def code_location_origin() -> CodeLocationOrigin:
    """The code location `dagster dev -w workspace.yaml` loads (read from that file, nothing started)."""
    origins = WorkspaceFileTarget(paths=[str(WORKSPACE_FILE)]).create_origins()
    if len(origins) != 1:
        raise ValueError(f"{WORKSPACE_FILE} must name exactly one code location, found {len(origins)}")
    return origins[0]


def code_location_name() -> str:
    return code_location_origin().location_name


def create_run(
    job_name: str,
    instance: dg.DagsterInstance,
    *,
    partition_key: str | None = None,
    partition_range: tuple[str, str] | None = None,
    run_config: Mapping[str, object] | None = None,
    tags: Mapping[str, str] | None = None,
) -> dg.DagsterRun:
    """Record a run of `job_name` (status NOT_STARTED) in `instance` as a run of the workspace's code
    location; `partition_range` = (first, last) makes one run over the range (assets with a
    single-run backfill policy). `execute_created_run` executes it, here or in a worker process."""
    job = _reconstructable(job_name)
    job_def = job.get_definition()
    run_tags = dict(job_def.run_tags)
    if partition_key is not None:
        run_tags.update(job_def.get_tags_for_partition_key(partition_key, selected_asset_keys=None))
    if partition_range is not None:
        run_tags.update({RANGE_START: partition_range[0], RANGE_END: partition_range[1]})
    run_tags.update(tags or {})
    run_tags[CREATOR_TAG] = process_identity(os.getpid())
    run_config = dict(run_config or {})
    plan = create_execution_plan(job, run_config=run_config, instance_ref=instance.get_ref() if instance.is_persistent else None,
                                 tags=run_tags)
    origin = RemoteJobOrigin(RemoteRepositoryOrigin(code_location_origin(), REPOSITORY_NAME), job_name)
    return instance.create_run_for_job(
        job_def=job_def, execution_plan=plan, run_config=run_config, tags=run_tags,
        remote_job_origin=origin, job_code_origin=job.get_python_origin(),
    )


def _reconstructable(job_name: str):
    repository = ReconstructableRepository.for_module(DEFS_MODULE, DEFS_ATTRIBUTE, working_directory=str(PROJECT_ROOT))
    return repository.get_reconstructable_job(job_name)


def execute_created_run(run_id: str, instance: dg.DagsterInstance, raise_on_error: bool = False) -> JobExecutionResult:
    """Execute a run made by `create_run` (still NOT_STARTED) in this process."""
    run = instance.get_run_by_id(run_id)
    if run is None:
        raise ValueError(f"no run {run_id} in this Dagster instance")
    return execute_run(_reconstructable(run.job_name), run, instance, raise_on_error=raise_on_error)


def run_job(job_name: str, instance: dg.DagsterInstance, *, raise_on_error: bool = True, **run_options) -> JobExecutionResult:
    """Execute `job_name` of `pipelines.definitions.defs` here, recorded in `instance` as a run of the
    workspace's code location: `create_run(job_name, instance, **run_options)` (partition_key,
    partition_range, run_config, tags), then `execute_created_run`."""
    run = create_run(job_name, instance, **run_options)
    result = execute_created_run(run.run_id, instance, raise_on_error=raise_on_error)
    if raise_on_error and not result.success:
        raise RuntimeError(f"{job_name} failed (run {result.run_id})")
    return result


def start_worker(run_ids: list[str], log_path: Path, instance: dg.DagsterInstance) -> subprocess.Popen:
    """Execute created runs, one after another, in a new process (`python -m pipelines.launch`), so a
    long training never runs inside the caller (the review service). The worker outlives its caller;
    its output goes to `log_path`, the runs' events to the instance ($DAGSTER_HOME) as usual. The
    runs are tagged with the worker (`WORKER_TAG`) before this returns."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        worker = subprocess.Popen([sys.executable, "-m", "pipelines.launch", *run_ids], cwd=PROJECT_ROOT, stdout=log,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    identity = process_identity(worker.pid)
    for run_id in run_ids:
        instance.add_run_tags(run_id, {WORKER_TAG: identity})
    return worker


def main(argv: list[str] | None = None) -> int:
    """`python -m pipelines.launch RUN_ID...`: execute created runs of $DAGSTER_HOME's instance in
    order, after the workers before it (`launch_queue`) and after failing the runs of any dead one;
    a run that fails does not stop the next. A run left unstarted (this process stops before it) is
    marked failed, so nothing waits on it forever."""
    run_ids = list(sys.argv[1:] if argv is None else argv)
    instance = dg.DagsterInstance.get()
    failed = 0
    try:
        with launch_queue(instance):
            reconcile_dead_runs(instance)
            for run_id in run_ids:
                run = instance.get_run_by_id(run_id)
                if run is None or run.status != dg.DagsterRunStatus.NOT_STARTED:  # failed while it waited in the queue
                    failed += 1
                    continue
                result = execute_created_run(run_id, instance)
                failed += not result.success
    finally:
        for run_id in run_ids:
            run = instance.get_run_by_id(run_id)
            if run is not None and run.status == dg.DagsterRunStatus.NOT_STARTED:
                instance.report_run_failed(run, "the launch worker stopped before this run started")
                failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
