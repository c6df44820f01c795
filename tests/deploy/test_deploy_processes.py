"""A recorded piece killed with kill -9 leaves what it started running (the MLflow server's uvicorn workers, which
hold its port; the code server's run workers): `make down` (deploy.processes.stop) stops what is left of its
process group, and nothing else. Real processes: a shell recorded as `make up` records a piece, its child a sleep."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from deploy import processes


def _wait_gone(pid: int, timeout_s: float = 10) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def _children(record: processes.ProcessRecord, timeout_s: float) -> list[psutil.Process]:
    """The recorded piece's children once it has started one (empty after `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    while not (children := record.process().children()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return children


def _signals(pid: int) -> str:
    """The process's signal state (blocked, ignored, caught) and state, for a failure's message."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError as err:
        return str(err)
    return "; ".join(line for line in lines if line.startswith(("State", "SigBlk", "SigIgn", "SigCgt", "PPid")))


def test_down_stops_what_a_killed_piece_left_running_and_nothing_else(tmp_path):
    home = tmp_path / "home"
    record = processes.start(home, "mlflow", ["sh", "-c", "sleep 600 & wait"], dict(os.environ), tmp_path)
    children = _children(record, timeout_s=10)
    (worker,) = children
    bystander = subprocess.Popen(["sleep", "600"])  # another process, not of the piece's group
    try:
        os.kill(record.pid, signal.SIGKILL)
        assert _wait_gone(record.pid) and worker.is_running()  # the worker outlives it
        assert processes.running(home, "mlflow") is None
        assert [p.pid for p in processes.orphans(record)] == [worker.pid]
        before = _signals(worker.pid)
        line = processes.stop(home, "mlflow")
        assert line == (
            f"mlflow: pid {record.pid} was not running (stale pid file removed); stopped 1 process(es) it had started"
        ), before
        assert _wait_gone(worker.pid) and bystander.poll() is None
        assert processes.read_record(home, "mlflow") is None
    finally:
        bystander.kill()
        bystander.wait()
        if worker.is_running():
            worker.kill()


def test_a_live_piece_has_no_orphans(tmp_path):
    record = processes.start(tmp_path / "home", "daemon", ["sleep", "600"], dict(os.environ), tmp_path)
    try:
        assert processes.orphans(record) == []  # alive: its group is stopped with it, not as orphans
    finally:
        processes.stop(tmp_path / "home", "daemon", grace_s=5)


def test_an_exited_child_its_parent_has_not_reaped_is_not_counted_as_killed(tmp_path):
    """A zombie has exited: only its parent's reaping is left (an orphan's parent is init, which in a container may
    reap late). A piece that ignores TERM leaves its child a zombie when TERM ends the child: `stop` kills the piece
    after the grace period and says so, and counts the zombie as stopped, not as killed."""
    home = tmp_path / "home"
    code = (
        "import signal, subprocess, time; child = subprocess.Popen(['sleep', '600']); "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"  # after the child: it would inherit SIG_IGN
    )
    record = processes.start(home, "daemon", [sys.executable, "-c", code], dict(os.environ), tmp_path)
    children = _children(record, timeout_s=20)
    (child,) = children
    before = _signals(child.pid)
    line = processes.stop(home, "daemon", grace_s=1)
    # the piece alone was killed: its child had exited (a zombie its living parent never reaped)
    assert line.endswith("and 1 process(es) it started, 1 killed after the grace period"), (line, before)
    assert _wait_gone(child.pid) and _wait_gone(record.pid)


def test_a_piece_started_where_term_is_blocked_or_ignored_still_stops_on_term(tmp_path):
    """A blocked or ignored TERM is inherited through exec: `start` gives each piece the defaults, so `stop`'s
    TERM ends it (and what it starts) without waiting out the grace period for a KILL."""
    import threading

    home, result = tmp_path / "home", {}

    def start_with_term_blocked():
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # this thread only
        result["record"] = processes.start(home, "daemon", ["sh", "-c", "sleep 600 & wait"], dict(os.environ), tmp_path)

    thread = threading.Thread(target=start_with_term_blocked)
    thread.start()
    thread.join()
    record = result["record"]
    children = _children(record, timeout_s=10)
    assert children and "SigBlk:\t0000000000000000" in _signals(children[0].pid), _signals(children[0].pid)
    started = time.monotonic()
    line = processes.stop(home, "daemon", grace_s=20)
    assert "killed" not in line and time.monotonic() - started < 10, line
