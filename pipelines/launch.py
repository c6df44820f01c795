"""Run this code location's jobs through Dagster's public API, without a webserver or a daemon.

`run_job` executes a job of `pipelines.definitions.defs` in the calling process with
`dg.execute_job` on a reconstructable job (`dg.build_reconstructable_job`), recorded in the given
instance (the demo). The runs carry the code location's repository tag (`.dagster/repository`), so
the Dagster UI lists them on the job's page; Dagster's public API cannot give a run the code
location's origin, so the UI does not offer to re-execute them (docs/service.md).

The review service without a webserver (no FLYWHEEL_DAGSTER_URL) queues its runs for a worker
process (`enqueue`: `python -m pipelines.launch QUEUE_FILE`), which executes them in order, one
launch at a time (an exclusive lock in $DAGSTER_HOME), so a training never runs inside the service.
A queued launch is a JSON file under `$DAGSTER_HOME/flywheel_launch_queue/`, locked (`flock`) by the
worker for as long as it lives: the service counts the specs of a locked file as queued runs
(idempotency), and a file nobody holds is a dead worker's, removed.

Dead executors are found and failed (`reconcile_dead_runs`, called by `run_job` before it launches, by
each worker and by the service): every run made here carries the process that executes it
(`flywheel/created_by` for `run_job`, `flywheel/worker` for a worker), as pid and start time (a reused
pid is another process). A live run whose executor is gone (a `kill -9`, an OOM kill, a reboot) is
reported failed and its concurrency-pool slots are freed, as Dagster's run monitoring does for runs the
daemon launched; otherwise its `duckdb` or `accelerator` slot stays claimed and every later run waits
"blocked by limit for pool" for good.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
import traceback
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

import dagster as dg
import psutil
import yaml

from outcome_flywheel.settings import PROJECT_ROOT

WORKSPACE_FILE = PROJECT_ROOT / "workspace.yaml"
LAUNCH_MODULE = "pipelines.launch"  # this module, by name: `python -m` runs it as __main__
REPOSITORY_NAME = "__repository__"  # the one repository of a `Definitions` object
# Run config: every step in the calling process. The default executor starts a process per step,
# each importing torch and the code location again (minutes over a demo on 2 cores).
IN_PROCESS = {"execution": {"config": {"in_process": {}}}}
PARTITION_TAG = "dagster/partition"
RANGE_START = "dagster/asset_partition_range_start"
RANGE_END = "dagster/asset_partition_range_end"
REPOSITORY_TAG = ".dagster/repository"  # "<repository>@<code location>": the UI's job page lists runs by it
LAUNCH_TAG = "flywheel/launch"  # the id of the RunSpec the run executes (known before the run exists)
CREATOR_TAG = "flywheel/created_by"  # "<pid>:<start time>" of the process that ran `run_job`
WORKER_TAG = "flywheel/worker"  # "<pid>:<start time>" of the worker process that executes it
PARENT_RUN_TAG = "dagster/parent_run_id"  # a re-execution copies tags but runs elsewhere
LIVE_STATUSES = (
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
)
QUEUE_LOCK = "flywheel_launch_queue.lock"
QUEUE_DIR = "flywheel_launch_queue"


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


@lru_cache(maxsize=1)
def code_location_name() -> str:
    """The code location `dagster dev -w workspace.yaml` loads, as that file names it."""
    entries = (yaml.safe_load(WORKSPACE_FILE.read_text()) or {}).get("load_from") or []
    if len(entries) != 1:
        raise ValueError(f"{WORKSPACE_FILE} must name exactly one code location, found {len(entries)}")
    ((kind, target),) = entries[0].items()
    return target.get("location_name") or target.get("module_name") or kind


def repository_label() -> str:
    return f"{REPOSITORY_NAME}@{code_location_name()}"


def job_named(job_name: str) -> dg.JobDefinition:
    """The job `job_name` of `pipelines.definitions.defs` (what a reconstructable job rebuilds)."""
    from pipelines.definitions import defs

    return defs.resolve_job_def(job_name)


def reconstructable_job(job_name: str):
    return dg.build_reconstructable_job(
        LAUNCH_MODULE, "job_named", reconstructable_args=(job_name,), reconstructor_working_directory=str(PROJECT_ROOT)
    )


@dataclass(frozen=True)
class RunSpec:
    """One run to make: a job, one partition or a (first, last) range (assets with a single-run
    backfill policy), its run config and tags. `launch_id` names it before the run exists."""

    job: str
    partition_key: str | None = None
    partition_range: tuple[str, str] | None = None
    run_config: Mapping[str, object] = field(default_factory=dict)
    tags: Mapping[str, str] = field(default_factory=dict)
    launch_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    def run_tags(self) -> dict[str, str]:
        tags = {k: str(v) for k, v in self.tags.items()}
        if self.partition_key is not None:
            tags[PARTITION_TAG] = self.partition_key
        if self.partition_range is not None:
            tags.update({RANGE_START: self.partition_range[0], RANGE_END: self.partition_range[1]})
        tags[LAUNCH_TAG] = self.launch_id
        return tags

    @classmethod
    def from_json(cls, data: Mapping) -> "RunSpec":
        span = data.get("partition_range")
        return cls(**{**data, "partition_range": tuple(span) if span else None})


def execute_spec(
    spec: RunSpec, instance: dg.DagsterInstance, executor_tag: str, raise_on_error: bool = False
) -> dg.JobExecutionResult:
    """Execute `spec` here with `dg.execute_job`, tagged with this process as its executor."""
    tags = {**spec.run_tags(), REPOSITORY_TAG: repository_label(), executor_tag: process_identity(os.getpid())}
    return dg.execute_job(
        reconstructable_job(spec.job),
        instance=instance,
        run_config=dict(spec.run_config),
        tags=tags,
        raise_on_error=raise_on_error,
    )


def run_job(
    job_name: str,
    instance: dg.DagsterInstance,
    *,
    raise_on_error: bool = True,
    partition_key: str | None = None,
    partition_range: tuple[str, str] | None = None,
    run_config: Mapping[str, object] | None = None,
    tags: Mapping[str, str] | None = None,
) -> dg.JobExecutionResult:
    """Execute `job_name` of `pipelines.definitions.defs` here, recorded in `instance` (one
    partition, a (first, last) range, or unpartitioned). First the runs whose executing process is gone
    (a demo killed mid-run) are failed and their pool slots freed (`reconcile_dead_runs`): else this run
    would wait for their slots for good."""
    for run_id in reconcile_dead_runs(instance):
        print(f"run_job: run {run_id} had lost its process: failed, its pool slots freed", file=sys.stderr)
    spec = RunSpec(job_name, partition_key, partition_range, dict(run_config or {}), dict(tags or {}))
    result = execute_spec(spec, instance, CREATOR_TAG, raise_on_error=raise_on_error)
    if raise_on_error and not result.success:
        raise RuntimeError(f"{job_name} failed (run {result.run_id})")
    return result


def executor_of(run: dg.DagsterRun) -> str | None:
    """The identity of the process that executes the run; None for runs not executed here."""
    if PARENT_RUN_TAG in run.tags:
        return None
    return run.tags.get(WORKER_TAG) or run.tags.get(CREATOR_TAG)


def live_runs(instance: dg.DagsterInstance, **filters) -> list[dg.DagsterRun]:
    """Live runs (not started, queued, starting, started) matching `filters` (dg.RunsFilter's), oldest first."""
    records = instance.get_run_records(filters=dg.RunsFilter(statuses=list(LIVE_STATUSES), **filters))
    return [r.dagster_run for r in reversed(records)]


def reconcile_dead_runs(instance: dg.DagsterInstance) -> list[str]:
    """Fail every live run executed here whose executing process is gone, free its pool slots, and
    drop the queue files of dead workers. Returns the run ids failed."""
    failed = []
    for run in live_runs(instance):
        identity = executor_of(run)
        if identity is None or process_alive(identity):
            continue
        # What Dagster's run monitoring does for the daemon's runs (`free_slots_after_run_end_seconds`),
        # before the failure is reported: whoever sees the run failed finds its slots free.
        if instance.event_log_storage.supports_global_concurrency_limits:
            instance.event_log_storage.free_concurrency_slots_for_run(run.run_id)
        who = "worker" if WORKER_TAG in run.tags else "process that ran it"
        instance.report_run_failed(
            run, f"the {who} ({identity.split(':')[0]}) is gone: failed by reconciliation, its pool slots freed"
        )
        failed.append(run.run_id)
    queued_launches(instance)  # drops the files nobody holds
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


def _held(path: Path) -> bool:
    """Whether a live process holds `path`'s lock (a worker, or the service handing it over)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing releases a lock taken here
    return False


def queued_launches(instance: dg.DagsterInstance) -> list[list[RunSpec]]:
    """The specs of every launch a live worker holds, in the order they were queued; the files of
    dead workers are removed."""
    folder = Path(instance.root_directory) / QUEUE_DIR
    launches = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        if not _held(path):
            path.unlink(missing_ok=True)
            continue
        try:
            launches.append([RunSpec.from_json(s) for s in json.loads(path.read_text())["specs"]])
        except FileNotFoundError:  # the worker finished meanwhile
            continue
    return launches


def enqueue(specs: list[RunSpec], log_path: Path, instance: dg.DagsterInstance) -> subprocess.Popen:
    """Queue `specs` for a new worker process (`python -m pipelines.launch`) that executes them in
    order after the workers before it, so a long training never runs inside the caller. The queue
    file appears already locked, and the lock passes to the worker (the same open file), so the
    launch counts as queued from this call until the worker ends or dies. The worker outlives its
    caller; its output goes to `log_path`, the runs' events to the instance as usual."""
    folder = Path(instance.root_directory) / QUEUE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    path = folder / f"{time.time_ns()}-{uuid.uuid4().hex[:8]}.json"  # names sort in queue order
    partial = path.with_name(f".{path.name}.tmp")
    fd = os.open(partial, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, json.dumps({"specs": [asdict(s) for s in specs]}).encode())
        os.fsync(fd)
        os.replace(partial, path)
        with open(log_path, "ab") as log:
            return subprocess.Popen(
                [sys.executable, "-m", LAUNCH_MODULE, str(path), str(fd)],
                cwd=PROJECT_ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                pass_fds=(fd,),
            )
    except BaseException:
        path.unlink(missing_ok=True)
        partial.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)  # the worker keeps its copy, and with it the lock


def main(argv: list[str] | None = None) -> int:
    """`python -m pipelines.launch QUEUE_FILE [LOCK_FD]`: execute the queued specs on $DAGSTER_HOME's
    instance in order, after the workers before it (`launch_queue`) and after failing the runs of
    any dead one; a run that fails does not stop the next."""
    args = list(sys.argv[1:] if argv is None else argv)
    path = Path(args[0])
    if len(args) > 1:
        os.set_inheritable(int(args[1]), False)  # the queue lock is this process's, not its children's
    specs = [RunSpec.from_json(s) for s in json.loads(path.read_text())["specs"]]
    instance = dg.DagsterInstance.get()
    failed = 0
    try:
        with launch_queue(instance):
            reconcile_dead_runs(instance)
            for spec in specs:
                try:
                    failed += not execute_spec(spec, instance, WORKER_TAG).success
                except Exception:  # a job that cannot start (bad run config...): say why, go on
                    traceback.print_exc()
                    failed += 1
    finally:
        path.unlink(missing_ok=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
