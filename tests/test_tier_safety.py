"""Safety every training tier shares (docs/tiers.md, "Safety"): the single trainer lock (a second
trainer waits then is refused; a dead holder's lock is cleared), the training_audit table, the
preference pool's cap, and its backup restored when a training fails."""

import json
import os
import subprocess
import sys
import time

import pandas as pd
import pytest

from outcome_flywheel.preferences.pool import POOL_CAP, cap_pool, pool_backup
from outcome_flywheel.storage import Warehouse
from outcome_flywheel.trainer_lock import LOCK_FILE, TrainerBusy, TrainerLock, read_holder
from outcome_flywheel.training_audit import audited_training, read_audit

HOLDER = """
import sys, time
from outcome_flywheel.trainer_lock import TrainerLock
with TrainerLock(sys.argv[1], tier="holder", wait_s=0):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def _holder(path, seconds):
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), str(seconds)], stdout=subprocess.PIPE, text=True,
                            cwd=os.path.dirname(os.path.dirname(__file__)))
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_trainer_waits_then_is_refused_naming_the_holder(tmp_path):
    path = tmp_path / "trainer.lock"
    proc = _holder(path, 30)
    try:
        started = time.monotonic()
        with pytest.raises(TrainerBusy, match=f"PID {proc.pid}.*holder"):
            TrainerLock(path, tier="dpo", wait_s=0.6, poll_s=0.1).acquire()
        assert time.monotonic() - started >= 0.6
        assert read_holder(path)["pid"] == proc.pid  # the refused trainer left the holder's lock alone
    finally:
        proc.kill()
        proc.wait()


def test_a_waiting_trainer_gets_the_lock_when_the_holder_finishes(tmp_path):
    path = tmp_path / "trainer.lock"
    proc = _holder(path, 1.0)
    try:
        with TrainerLock(path, tier="dpo", wait_s=30, poll_s=0.1) as report:
            assert report.waited_for["pid"] == proc.pid and report.waited_s > 0.2
            assert read_holder(path)["pid"] == os.getpid()
        assert not path.exists()
    finally:
        proc.wait()


def test_a_stale_lock_of_a_dead_pid_is_cleared_and_reported(tmp_path):
    path = tmp_path / "trainer.lock"
    proc = _holder(path, 30)
    proc.kill()  # SIGKILL: the holder never released its lock
    proc.wait()
    assert read_holder(path)["pid"] == proc.pid
    with TrainerLock(path, tier="distillation", wait_s=0) as report:
        assert report.stale_cleared["pid"] == proc.pid
        assert "stale lock of dead PID" in report.describe()
    assert not path.exists()


def test_audit_rows_are_idempotent_and_a_refusal_is_recorded(tmp_path):
    warehouse = Warehouse(data_dir=str(tmp_path))
    for _ in range(2):  # a re-run of the same training replaces its row
        with audited_training(warehouse, "dpo", "dpo:run-1", "test", {"pairs": 3}) as entry:
            entry.gate_verdict = "none"
    with pytest.raises(RuntimeError):
        with audited_training(warehouse, "gspo_daily", "gspo:day", "test"):
            raise RuntimeError("injected")
    lock = warehouse.path(*LOCK_FILE)
    lock.write_text(json.dumps({"pid": os.getppid(), "host": os.uname().nodename, "tier": "other", "started_at": "x"}))
    with pytest.raises(TrainerBusy):
        with audited_training(warehouse, "distillation", "distillation:r", "test", wait_s=0):
            pass
    lock.unlink()
    audit = read_audit(warehouse).set_index("training_id")
    assert len(audit) == 3
    assert audit.loc["dpo:run-1", "status"] == "succeeded" and json.loads(audit.loc["dpo:run-1", "inputs"]) == {"pairs": 3}
    assert audit.loc["gspo:day", "status"] == "failed" and "injected" in audit.loc["gspo:day", "error"]
    assert audit.loc["distillation:r", "status"] == "refused"


def test_the_pair_pool_is_capped_oldest_first():
    n = POOL_CAP + 3
    pairs = pd.DataFrame({"decision_id": [f"d{i:05d}" for i in range(n)],
                          "decision_date": [f"2025-{1 + i % 12:02d}-{1 + i % 28:02d}" for i in range(n)]})
    kept, dropped = cap_pool(pairs)
    assert len(kept) == POOL_CAP and dropped == 3
    gone = set(pairs["decision_id"]) - set(kept["decision_id"])
    assert max(pairs.set_index("decision_id").loc[sorted(gone), "decision_date"]) <= kept["decision_date"].min()
    assert cap_pool(pairs.head(10))[1] == 0


def test_the_pool_is_restored_when_a_training_fails(tmp_path):
    warehouse = Warehouse(data_dir=str(tmp_path))
    pool = pd.DataFrame({"decision_id": ["a", "b", "c"], "weight": [1.0, 0.3, 0.5]})
    warehouse.write("dpo_dataset", pool)
    with pytest.raises(RuntimeError, match="injected"):
        with pool_backup(warehouse, "dpo_dataset", "run-1"):
            warehouse.write("dpo_dataset", pool.head(1))  # a training that damaged the pool, then failed
            raise RuntimeError("injected training failure")
    pd.testing.assert_frame_equal(warehouse.read("dpo_dataset"), pool)
    with pool_backup(warehouse, "dpo_dataset", "run-2"):
        pass
    assert not warehouse.exists("backups_dpo_dataset", "run-2", key="run")  # a success keeps no copy
