"""A launch worker that dies (`kill -9`) mid-run: its run stays STARTED and its `duckdb` pool slot
claimed, which blocked every later run. The next launch must fail the dead run, free the slot and
launch what is left, and that run must succeed; a launch overlapping a live run leaves its dates to it."""

from __future__ import annotations

import os
import signal
import time

import dagster as dg
import pytest

from outcome_flywheel.preferences.audit_log import parse_file, records_frame
from outcome_flywheel.settings import PROJECT_ROOT
from pipelines.launch import CREATOR_TAG, WORKER_TAG, process_alive, process_identity
from service import launching
from tests.service_fixtures import make_state, make_world


def _wait_for(what, timeout: float, step: float = 0.2):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = what()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout} s")


@pytest.fixture()
def instance_world(tmp_path, tiny_model_dir, monkeypatch):
    root = make_world(tmp_path / "data", tiny_model_dir)
    home = tmp_path / "dagster_home"
    home.mkdir()
    # The project's instance settings: every pool (duckdb included) has limit 1.
    (home / "dagster.yaml").write_text((PROJECT_ROOT / "scripts" / "dagster.yaml").read_text())
    for name, value in {"DAGSTER_HOME": str(home), "FLYWHEEL_DATA_DIR": str(root), "FLYWHEEL_AUDIT_LOG": str(root / "audit_log.jsonl"),
                        "OMP_NUM_THREADS": "1"}.items():
        monkeypatch.setenv(name, value)
    state = make_state(root)
    yield state, root
    for worker in state.workers:
        if worker.poll() is None:
            worker.kill()
        worker.wait(timeout=60)


def test_process_identity_names_one_process_not_a_pid():
    me = process_identity(os.getpid())
    assert process_alive(me)
    pid, _, started = me.partition(":")
    assert not process_alive(f"{pid}:{float(started) - 100.0!r}")  # the pid, reused by another process
    assert not process_alive("999999999:0.0")


def test_a_killed_worker_is_failed_its_slot_freed_and_the_next_run_succeeds(instance_world):
    state, root = instance_world
    log = root / "audit_log.jsonl"
    day = records_frame(parse_file(log), "America/New_York")["decision_date"].iloc[0]
    # The run's first step, operator_decisions, claims the duckdb slot and then opens the audit log:
    # a FIFO with no writer holds it there, mid-run, for as long as the test needs.
    kept = log.read_bytes()
    log.unlink()
    os.mkfifo(log)
    launched, runs = launching._launch(state, launching.DECISIONS_JOB, [(day, day)], "dead-worker-test", "test")
    assert launched and runs[0].tags[CREATOR_TAG] == process_identity(os.getpid())
    worker = state.workers[-1]
    instance = state.instance()
    dead_run = runs[0].run_id
    _wait_for(lambda: dead_run in instance.event_log_storage.get_concurrency_info("duckdb").active_run_ids, timeout=240)
    assert instance.get_run_by_id(dead_run).status == dg.DagsterRunStatus.STARTED
    assert instance.get_run_by_id(dead_run).tags[WORKER_TAG] == process_identity(worker.pid)

    # While it runs, an overlapping launch leaves its date to it (one partition, one run at a time).
    skipped: dict[str, str] = {}
    again, covering = launching._launch(state, launching.DECISIONS_JOB, [(day, day)], "another-request", "test", skipped)
    assert not again and [r.run_id for r in covering] == [dead_run] and skipped == {day: dead_run}

    os.kill(worker.pid, signal.SIGKILL)  # not waited for: a zombie child, as in the service
    _wait_for(lambda: not process_alive(instance.get_run_by_id(dead_run).tags[WORKER_TAG]), timeout=30)
    assert instance.get_run_by_id(dead_run).status == dg.DagsterRunStatus.STARTED  # dead, but nothing says so yet
    log.unlink()
    log.write_bytes(kept)

    result = launching.extract(state)  # reconciles first, then launches the changed dates
    assert instance.get_run_by_id(dead_run).status == dg.DagsterRunStatus.FAILURE
    assert dead_run not in instance.event_log_storage.get_concurrency_info("duckdb").active_run_ids
    assert result["launched"] and day in result["dates"] and result["in_live_runs"] == {}
    new_ids = [r["run_id"] for r in result["runs"]]
    finished = _wait_for(lambda: all(instance.get_run_by_id(r).is_finished for r in new_ids), timeout=400, step=1)
    assert finished and all(instance.get_run_by_id(r).status == dg.DagsterRunStatus.SUCCESS for r in new_ids)
    assert len(state.warehouse.read("operator_decisions", day)) >= 1
