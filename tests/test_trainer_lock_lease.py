"""The trainer lock's lease and the crash rows (docs/tiers.md, "Safety"): a lock held on another host
(a Kubernetes pod) is judged by its lease, which its holder's heartbeat renews while it lives, not by
a PID; a training killed with SIGKILL leaves its `training_audit` row `running`, and the next
training of any tier clears its lock and rewrites that row `crashed` with the reason. Real
processes, short leases (`FLYWHEEL_TRAINER_LOCK_LEASE_S`) so that it runs in seconds."""

import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest

from outcome_flywheel.storage import Warehouse
from outcome_flywheel.trainer_lock import LOCK_FILE, TrainerBusy, TrainerLock, read_holder
from outcome_flywheel.training_audit import audited_training, read_audit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LEASE = "FLYWHEEL_TRAINER_LOCK_LEASE_S"
POD = "trainer-pod-7f9c"


def _iso(seconds_from_now: float) -> str:
    return (datetime.now(timezone.utc) + timedelta(seconds=seconds_from_now)).isoformat()


def _pod_lock(path, expires_in: float | None, started_ago: float = 120.0) -> dict:
    """A lock written by a trainer in another pod; `expires_in` None: one without a lease (older version)."""
    holder = {"pid": 1, "host": POD, "tier": "dpo", "started_at": _iso(-started_ago)}
    if expires_in is not None:
        holder.update(
            token=uuid.uuid4().hex, heartbeat_at=_iso(expires_in - 60), lease_s=60.0, lease_expires_at=_iso(expires_in)
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(holder))
    return holder


@pytest.fixture
def elsewhere(monkeypatch):
    """This test process plays a trainer on another host: the holders it meets (this host's
    subprocesses too) cannot be checked by PID, only by their lease."""
    monkeypatch.setattr(socket, "gethostname", lambda: "observer-host")


def test_a_pod_s_lock_whose_lease_expired_is_cleared(tmp_path):
    path = tmp_path / "trainer.lock"
    gone = _pod_lock(path, expires_in=-5)
    with TrainerLock(path, tier="distillation", wait_s=0) as report:
        assert report.stale_cleared == gone and "no heartbeat since" in report.stale_reason
        assert f"stale lock of PID 1 on {POD}" in report.describe()
        mine = read_holder(path)
        assert mine["pid"] == os.getpid() and mine["lease_expires_at"] > _iso(0)
    assert not path.exists()


def test_a_pod_s_live_lease_is_waited_for_then_refused_or_taken_once_it_expires(tmp_path):
    path = tmp_path / "trainer.lock"
    live = _pod_lock(path, expires_in=60)
    with pytest.raises(TrainerBusy, match=f"PID 1 on {POD} .*lease to"):
        TrainerLock(path, tier="dpo", wait_s=0.5, poll_s=0.1).acquire()
    assert read_holder(path) == live  # a live lease is left alone
    ending = _pod_lock(path, expires_in=1.5)  # its holder stops renewing: killed with its pod
    with TrainerLock(path, tier="dpo", wait_s=8, poll_s=0.1) as report:
        assert report.stale_cleared["token"] == ending["token"] and 0.8 <= report.waited_s < 8
    assert not path.exists()


def test_a_lock_without_a_lease_from_another_host_is_held_for_12_hours_from_its_start(tmp_path):
    """A lock the previous version wrote (no lease) in another pod: held, unless started over 12 h ago."""
    path = tmp_path / "trainer.lock"
    _pod_lock(path, expires_in=None, started_ago=3600)
    with pytest.raises(TrainerBusy, match="no lease"):
        TrainerLock(path, tier="dpo", wait_s=0).acquire()
    old = _pod_lock(path, expires_in=None, started_ago=13 * 3600)
    with TrainerLock(path, tier="dpo", wait_s=0) as report:
        assert report.stale_cleared == old and "without a lease" in report.stale_reason


HOLDER = """
import sys, time
from outcome_flywheel.trainer_lock import TrainerLock
with TrainerLock(sys.argv[1], tier="holder", wait_s=0):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def test_a_live_holder_s_heartbeat_keeps_its_lock_past_several_leases_and_a_killed_one_loses_it(
    tmp_path, monkeypatch, elsewhere
):
    """Seen from another host: a live holder (a real process) renews its lease, atomically (the lock
    file is never missing nor half-written), and keeps the lock for 3+ leases; SIGKILLed, its lease
    runs out and the lock is cleared, though no PID could be checked."""
    lease = 1.5
    monkeypatch.setenv(LEASE, str(lease))
    path = tmp_path / "trainer.lock"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path), "60"], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        assert proc.stdout.readline().strip() == "held"
        first = read_holder(path)
        seen, done = [], threading.Event()

        def watch():
            while not done.is_set():
                seen.append(read_holder(path))
                time.sleep(0.005)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            with pytest.raises(TrainerBusy, match=f"PID {proc.pid}"):
                TrainerLock(path, tier="dpo", wait_s=3.5 * lease, poll_s=0.1).acquire()
        finally:
            done.set()
            watcher.join()
        assert all(
            h and h["token"] == first["token"] and h["pid"] == proc.pid for h in seen
        )  # never missing, never another
        beats = {h["heartbeat_at"] for h in seen}
        assert len(beats) >= 8 and read_holder(path)["lease_expires_at"] > first["lease_expires_at"]
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        with TrainerLock(path, tier="dpo", wait_s=10, poll_s=0.05) as report:
            assert report.stale_cleared["pid"] == proc.pid and "no heartbeat since" in report.stale_reason
            assert report.waited_s <= lease + 1.0
    finally:
        proc.kill()
        proc.wait()


def test_a_holder_never_overwrites_a_lock_it_lost_and_takes_back_its_own_after_a_stall(tmp_path):
    path = tmp_path / "trainer.lock"
    lock = TrainerLock(path, tier="dpo", wait_s=0, lease_s=60)
    lock.acquire()
    try:
        token = read_holder(path)["token"]
        lock._expires = time.time()  # as if stalled until its lease's end: taken again the safe way
        assert lock.renew() and read_holder(path)["token"] == token and not lock.lost
        assert read_holder(path)["lease_expires_at"] > _iso(50)
        other = _pod_lock(path, expires_in=60)  # meanwhile another trainer judged it stale and took it
        assert not lock.renew() and "lost" in lock.lost
        assert read_holder(path) == other
    finally:
        lock.release()
    assert read_holder(path) == other  # the release left the other trainer's lock alone


KILLED = """
import sys, time
from outcome_flywheel.storage import Warehouse
from outcome_flywheel.training_audit import audited_training
warehouse = Warehouse(data_dir=sys.argv[1])
with audited_training(warehouse, "dpo", "dpo:killed", "test", {"pairs": 3}):
    print("training", flush=True)
    time.sleep(120)
"""


@pytest.mark.parametrize("where", ["this host", "another host"])
def test_a_sigkilled_training_is_marked_crashed_by_the_next_one(tmp_path, monkeypatch, where):
    """A real training process SIGKILLed inside `audited_training`: its row says `running`; the next
    training (another tier) clears its lock, by its dead PID on this host or by its lease seen from
    another, and rewrites the row `crashed` with the reason; a re-run of it replaces that row."""
    monkeypatch.setenv(LEASE, "1.0")
    warehouse = Warehouse(data_dir=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-c", KILLED, str(tmp_path)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stdout.readline().strip() == "training"
        row = read_audit(warehouse).set_index("training_id").loc["dpo:killed"]
        assert row["status"] == "running" and row["pid"] == proc.pid and row["finished_at"] == ""
        proc.send_signal(signal.SIGKILL)  # the out-of-memory killer: no except, no finally runs
        proc.wait()
    finally:
        proc.kill()
        proc.wait()
    assert read_holder(warehouse.path(*LOCK_FILE))["pid"] == proc.pid  # the killed holder's lock stayed
    if where == "another host":
        monkeypatch.setattr(socket, "gethostname", lambda: "observer-host")
    said = []
    with audited_training(warehouse, "gspo_daily", "gspo:next", "test", wait_s=10, log=said.append):
        audit = read_audit(warehouse).set_index("training_id")
        crashed = audit.loc["dpo:killed"]
        assert crashed["status"] == "crashed" and crashed["finished_at"] == "" and math.isnan(crashed["duration_s"])
        assert "SIGKILL" in crashed["error"] and "found at" in crashed["error"] and "by gspo:next" in crashed["error"]
        why = f"PID {proc.pid} is dead on this host" if where == "this host" else "no heartbeat since"
        assert why in crashed["error"]
        assert audit.loc["gspo:next", "status"] == "running"
    assert any("dpo:killed" in line and "crashed" in line for line in said)
    audit = read_audit(warehouse).set_index("training_id")
    assert audit.loc["gspo:next", "status"] == "succeeded"
    cleared = json.loads(audit.loc["gspo:next", "stale_lock_cleared"])
    assert cleared["pid"] == proc.pid and cleared["training_id"] == "dpo:killed" and why in cleared["reason"]
    with audited_training(warehouse, "dpo", "dpo:killed", "re-run", wait_s=0):
        pass
    audit = read_audit(warehouse)
    assert audit["training_id"].tolist().count("dpo:killed") == 1
    assert set(audit["status"]) == {"succeeded"} and not warehouse.path(*LOCK_FILE).exists()


def test_a_wait_that_ends_during_a_renewal_names_the_holder(tmp_path):
    """The fence's mutex busy through the last moments of a wait (a live holder renewing on a loaded box)
    is the lock being held, by whom its file says, not a holder stopped while publishing."""
    from outcome_flywheel.fencing import file_mutex, mutex_path

    path = tmp_path / "trainer.lock"
    _pod_lock(path, expires_in=60)
    held, done = threading.Event(), threading.Event()

    def renewing():  # another open file description: flock excludes it as it would another process
        with file_mutex(mutex_path(path)):
            held.set()
            done.wait(10)

    renewal = threading.Thread(target=renewing)
    renewal.start()
    try:
        held.wait(10)
        with pytest.raises(TrainerBusy, match=f"PID 1 on {POD} .*lease to") as busy:
            TrainerLock(path, tier="dpo", wait_s=0.2, poll_s=0.05).acquire()
        assert busy.value.report.waited_for["host"] == POD and busy.value.waited_s >= 0.2
    finally:
        done.set()
        renewal.join()
