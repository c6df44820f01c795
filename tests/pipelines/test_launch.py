"""`run_job` (pipelines/launch.py), the demos' way to run a job: a run whose process was killed
(`kill -9`) mid-step keeps its pool slot claimed, and the next run of the pool waited for it for good
(until `reconcile_dead_runs` was called by hand). The next `run_job` must fail the dead run and free
its slot before it launches, then run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import dagster as dg

from pipelines.launch import CREATOR_TAG, live_runs
from tests import PROJECT_ROOT
from tests.service.test_service_workers import _wait_for  # the same polling as the service's dead-run test

DAY = "2025-11-03"
POOL = "duckdb"  # note_feedback's; `daily_update`'s `accelerator` slot is claimed and freed the same way
# One run of note_feedback_job for DAY through `run_job`, as scripts/demo_daily_rl.py runs a day.
RUN_JOB = (
    "import dagster as dg\n"
    "from pipelines.launch import IN_PROCESS, run_job\n"
    f"run_job('note_feedback_job', dg.DagsterInstance.get(), partition_key={DAY!r}, run_config=IN_PROCESS)\n"
    "print('run_job finished')\n"
)


def _run_job_process(env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", RUN_JOB],
        cwd=PROJECT_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_run_job_frees_the_slot_of_a_run_killed_mid_step(tmp_path):
    home, root = tmp_path / "dagster_home", tmp_path / "data"
    home.mkdir()
    root.mkdir()
    # The project's instance settings: every pool has limit 1.
    (home / "dagster.yaml").write_text((PROJECT_ROOT / "scripts" / "dagster.yaml").read_text())
    log = tmp_path / "feedback.jsonl"
    # note_feedback claims the duckdb slot, then opens the feedback log: a FIFO with no writer holds it
    # there, mid-step, until the process is killed.
    os.mkfifo(log)
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "FLYWHEEL_DATA_DIR": str(root),
        "FLYWHEEL_FEEDBACK_LOG": str(log),
        "OMP_NUM_THREADS": "1",
    }
    instance = dg.DagsterInstance.from_config(str(home))
    first = _run_job_process(env)
    try:
        dead = _wait_for(lambda: live_runs(instance), timeout=240)[0]
        _wait_for(lambda: dead.run_id in instance.event_log_storage.get_concurrency_info(POOL).active_run_ids, 240)
        assert dead.tags[CREATOR_TAG].split(":")[0] == str(first.pid)
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=60)
    log.unlink()
    log.write_text("")  # an empty feedback log: the next run's step has nothing to wait for
    assert instance.get_run_by_id(dead.run_id).status == dg.DagsterRunStatus.STARTED  # nobody failed it yet

    second = _run_job_process(env)
    try:
        output, _ = second.communicate(timeout=120)  # waiting for the dead run's slot: never returns
    except subprocess.TimeoutExpired:
        second.kill()
        output, _ = second.communicate()
        raise AssertionError(f"the next run_job waited for the dead run's {POOL} slot:\n{output[-3000:]}")
    assert second.returncode == 0 and "run_job finished" in output, output[-3000:]
    assert f"run {dead.run_id} had lost its process: failed, its pool slots freed" in output
    assert instance.get_run_by_id(dead.run_id).status == dg.DagsterRunStatus.FAILURE
    assert instance.event_log_storage.get_concurrency_info(POOL).active_run_ids == set()
    runs = instance.get_run_records(filters=dg.RunsFilter(tags={"dagster/partition": DAY}))
    assert [r.dagster_run.status for r in runs] == [dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE]
