"""A launch worker that dies (`kill -9`) mid-run: its run stays STARTED and its `duckdb` pool slot
claimed, which blocked every later run. The next worker in the queue (or the next launch) must fail
the dead run and free the slot, and what is left must succeed; a launch overlapping a live or a
queued run leaves its dates to it."""

from __future__ import annotations

import os
import signal
import time

import dagster as dg
import pytest

from outcome_flywheel.preferences.audit_log import parse_file, records_frame
from outcome_flywheel.settings import PROJECT_ROOT
from pipelines.launch import LAUNCH_TAG, REPOSITORY_TAG, WORKER_TAG, process_alive, process_identity
from service import launching
from tests import PROJECT_ROOT
from tests.service_fixtures import make_state, make_world, service_environment


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
    service_environment(monkeypatch, root, home)
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


def _run_of(instance: dg.DagsterInstance, launch_id: str) -> dg.DagsterRun | None:
    records = instance.get_run_records(filters=dg.RunsFilter(tags={LAUNCH_TAG: launch_id}), limit=1)
    return records[0].dagster_run if records else None


def test_a_killed_worker_is_failed_its_slot_freed_and_the_queue_goes_on(instance_world):
    state, root = instance_world
    log = root / "audit_log.jsonl"
    days = sorted(records_frame(parse_file(log), "America/New_York")["decision_date"].unique())
    day, queued_day = days[-1], days[0]
    # The run's first step, operator_decisions, claims the duckdb slot and then opens the audit log:
    # a FIFO with no writer holds it there, mid-run, for as long as the test needs.
    kept = log.read_bytes()
    log.unlink()
    os.mkfifo(log)
    launched, runs = launching._launch(state, launching.DECISIONS_JOB, [(day, day)], "dead-worker-test", "test")
    assert launched and runs[0]["status"] == "QUEUED" and runs[0]["partition"] == day
    worker = state.workers[-1]
    instance = state.instance()
    dead = _wait_for(lambda: _run_of(instance, runs[0]["launch_id"]), timeout=240)
    _wait_for(
        lambda: dead.run_id in instance.event_log_storage.get_concurrency_info("duckdb").active_run_ids, timeout=240
    )
    assert instance.get_run_by_id(dead.run_id).status == dg.DagsterRunStatus.STARTED
    assert (
        dead.tags[WORKER_TAG] == process_identity(worker.pid)
        and dead.tags[REPOSITORY_TAG] == "__repository__@outcome_flywheel"
    )

    # While it runs, an overlapping launch leaves its date to it (one partition, one run at a time).
    skipped: dict[str, str] = {}
    again, covering = launching._launch(
        state, launching.DECISIONS_JOB, [(day, day)], "another-request", "test", skipped
    )
    assert not again and [r["run_id"] for r in covering] == [dead.run_id] and skipped == {day: dead.run_id}

    # Another date waits in the queue behind it: no run yet, yet the same request or its date is not launched twice.
    launched, queued = launching._launch(
        state, launching.DECISIONS_JOB, [(queued_day, queued_day)], "queued-request", "test"
    )
    assert launched and queued[0]["run_id"] is None and _run_of(instance, queued[0]["launch_id"]) is None
    again, same = launching._launch(
        state, launching.DECISIONS_JOB, [(queued_day, queued_day)], "queued-request", "test"
    )
    assert not again and [r["launch_id"] for r in same] == [queued[0]["launch_id"]]
    skipped = {}
    again, _ = launching._launch(
        state, launching.DECISIONS_JOB, [(queued_day, queued_day)], "yet-another-request", "test", skipped
    )
    assert not again and skipped == {queued_day: queued[0]["launch_id"]}
    assert [r["launch_id"] for r in launching.in_progress(instance, launching.DECISIONS_JOB)] == [
        runs[0]["launch_id"],
        queued[0]["launch_id"],
    ]

    log.unlink()  # the stuck open() stays stuck: nobody can open an unlinked FIFO for writing
    log.write_bytes(kept)
    os.kill(worker.pid, signal.SIGKILL)  # not waited for: a zombie child, as in the service
    killed = time.time()
    # The next worker in the queue fails the dead run and frees its slot before it runs its own.
    _wait_for(lambda: instance.get_run_by_id(dead.run_id).status == dg.DagsterRunStatus.FAILURE, timeout=60)
    assert dead.run_id not in instance.event_log_storage.get_concurrency_info("duckdb").active_run_ids
    print(f"dead run failed and its slot freed {time.time() - killed:.1f} s after kill -9")
    behind = _wait_for(
        lambda: (r := _run_of(instance, queued[0]["launch_id"])) is not None and r.is_finished and r,
        timeout=400,
        step=1,
    )
    assert behind.status == dg.DagsterRunStatus.SUCCESS and behind.tags["dagster/partition"] == queued_day

    result = launching.extract(state)  # the dead run's date is still to do: launched again
    assert (
        result["launched"]
        and day in result["dates"]
        and queued_day not in result["dates"]
        and result["in_live_runs"] == {}
    )
    launch_ids = [r["launch_id"] for r in result["runs"]]
    finished = _wait_for(
        lambda: all((r := _run_of(instance, i)) is not None and r.is_finished for i in launch_ids), timeout=400, step=1
    )
    assert finished and all(_run_of(instance, i).status == dg.DagsterRunStatus.SUCCESS for i in launch_ids)
    assert len(state.warehouse.read("operator_decisions", day)) >= 1
    _wait_for(
        lambda: launching.in_progress(instance, launching.DECISIONS_JOB) == [], timeout=60
    )  # the queue files are gone
