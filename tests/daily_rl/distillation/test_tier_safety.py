"""Safety every training tier shares (docs/tiers.md, "Safety"): the single trainer lock (a second
trainer waits then is refused; a dead holder's lock is cleared), the training_audit table (with the
wait it really took), the preference pool's cap, and its backup: restored when a training fails or is
killed, and never left behind (no copy, no empty folder)."""

import json
import os
import re
import subprocess
import sys
import threading
import time

import pandas as pd
import pytest

from outcome_flywheel.preferences.pool import POOL_CAP, cap_pool, leftover_backups, pool_backup, restore_pool
from outcome_flywheel.storage import Warehouse
from outcome_flywheel.trainer_lock import LOCK_FILE, TrainerBusy, TrainerLock, read_holder
from outcome_flywheel.training_audit import audited_training, read_audit
from tests import PROJECT_ROOT

HOLDER = """
import sys, time
from outcome_flywheel.trainer_lock import TrainerLock
with TrainerLock(sys.argv[1], tier="holder", wait_s=0):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def _holder(path, seconds):
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path), str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=str(PROJECT_ROOT),
    )
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
    assert audit.loc["dpo:run-1", "status"] == "succeeded" and json.loads(audit.loc["dpo:run-1", "inputs"]) == {
        "pairs": 3
    }
    assert audit.loc["gspo:day", "status"] == "failed" and "injected" in audit.loc["gspo:day", "error"]
    assert audit.loc["distillation:r", "status"] == "refused"


def test_the_pair_pool_is_capped_oldest_first():
    n = POOL_CAP + 3
    pairs = pd.DataFrame(
        {
            "decision_id": [f"d{i:05d}" for i in range(n)],
            "decision_date": [f"2025-{1 + i % 12:02d}-{1 + i % 28:02d}" for i in range(n)],
        }
    )
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


def _busy(warehouse: Warehouse) -> None:
    """A lock held by a live process of this host (this test's parent), which nobody releases."""
    warehouse.path(*LOCK_FILE).parent.mkdir(parents=True, exist_ok=True)
    warehouse.path(*LOCK_FILE).write_text(
        json.dumps({"pid": os.getppid(), "host": os.uname().nodename, "tier": "other", "started_at": "x"})
    )


def test_the_audit_row_records_the_wait_the_lock_really_took(tmp_path):
    """A refused training waited its whole `wait_s` (the row said 0.0 while its error said 0.6 s); a
    wait on a lock file still being written (unreadable) counts as a wait too."""
    warehouse = Warehouse(data_dir=str(tmp_path))
    _busy(warehouse)
    with pytest.raises(TrainerBusy) as refused:
        with audited_training(warehouse, "dpo", "dpo:busy", "test", wait_s=0.6):
            pass
    stated = float(re.search(r"waited ([0-9.]+) s", str(refused.value)).group(1))
    row = read_audit(warehouse).set_index("training_id").loc["dpo:busy"]
    assert row["status"] == "refused" and row["lock_waited_s"] >= 0.6
    assert abs(row["lock_waited_s"] - stated) <= 0.05 and refused.value.waited_s == pytest.approx(
        row["lock_waited_s"], abs=1e-3
    )
    # An unreadable lock (a holder still writing it) released after ~0.5 s: the wait is recorded.
    lock = warehouse.path(*LOCK_FILE)
    lock.write_text("")
    threading.Timer(0.5, lambda: lock.unlink(missing_ok=True)).start()
    with audited_training(warehouse, "distillation", "distillation:after-wait", "test", wait_s=30):
        pass
    waited = read_audit(warehouse).set_index("training_id").loc["distillation:after-wait", "lock_waited_s"]
    assert 0.4 <= waited < 10
    with audited_training(warehouse, "gspo_daily", "gspo:free", "test", wait_s=0):
        pass  # a free lock: no wait
    assert read_audit(warehouse).set_index("training_id").loc["gspo:free", "lock_waited_s"] == 0.0


def _backup_folders(warehouse: Warehouse) -> list[str]:
    folder = warehouse.store.folder / "backups_dpo_dataset"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


POOL = pd.DataFrame({"decision_id": ["a", "b", "c"], "weight": [1.0, 0.3, 0.5]})


def test_a_training_leaves_no_copy_and_no_empty_folder_however_it_ends(tmp_path):
    warehouse = Warehouse(data_dir=str(tmp_path))
    warehouse.write("dpo_dataset", POOL)
    with pool_backup(warehouse, "dpo_dataset", "run-ok") as rows:
        assert _backup_folders(warehouse) == ["run=run-ok"] and len(rows) == 3
    assert _backup_folders(warehouse) == [] and not (warehouse.store.folder / "backups_dpo_dataset").exists()
    with pytest.raises(RuntimeError):
        with pool_backup(warehouse, "dpo_dataset", "run-failed"):
            warehouse.write("dpo_dataset", POOL.head(1))
            raise RuntimeError("injected")
    pd.testing.assert_frame_equal(warehouse.read("dpo_dataset"), POOL)  # written back from the copy, which then goes
    assert _backup_folders(warehouse) == [] and leftover_backups(warehouse, "dpo_dataset") == []
    assert "backups_dpo_dataset" not in warehouse.tables()


KILLED = """
import os, signal, sys
import pandas as pd
from outcome_flywheel.preferences.pool import pool_backup
from outcome_flywheel.storage import Warehouse
warehouse = Warehouse(data_dir=sys.argv[1])
with pool_backup(warehouse, "dpo_dataset", sys.argv[2]):
    if sys.argv[3] == "damage":
        warehouse.write("dpo_dataset", pd.DataFrame({"decision_id": ["damaged"], "weight": [9.0]}))
    os.kill(os.getpid(), signal.SIGKILL)  # the out-of-memory killer: no except, no finally runs
"""


def _killed_training(warehouse: Warehouse, label: str, damage: bool) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", KILLED, str(warehouse.root), label, "damage" if damage else "-"],
        cwd=str(PROJECT_ROOT),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -9, proc.stderr[-2000:]


def test_a_killed_training_s_pool_is_restored_from_its_copy(tmp_path):
    """What the `preference_adapter` asset does once its step process was killed: the pool is written
    back from the copy the step left (`restore_pool`), and the copy removed with its folder."""
    warehouse = Warehouse(data_dir=str(tmp_path))
    warehouse.write("dpo_dataset", POOL)
    _killed_training(warehouse, "run-k", damage=True)
    assert leftover_backups(warehouse, "dpo_dataset") == ["run-k"] and warehouse.read("dpo_dataset")[
        "decision_id"
    ].tolist() == ["damaged"]
    assert restore_pool(warehouse, "dpo_dataset", "run-k")
    pd.testing.assert_frame_equal(warehouse.read("dpo_dataset"), POOL)
    assert leftover_backups(warehouse, "dpo_dataset") == [] and _backup_folders(warehouse) == []
    assert not restore_pool(warehouse, "dpo_dataset", "run-k")  # nothing left: a second call changes nothing
    pd.testing.assert_frame_equal(warehouse.read("dpo_dataset"), POOL)


def test_a_copy_nothing_restored_is_removed_by_the_next_training(tmp_path):
    """A run killed with its asset's process too leaves a copy nobody restored: the next training
    (holding the trainer lock, so that run is over) removes it and keeps the pool, rebuilt since."""
    warehouse = Warehouse(data_dir=str(tmp_path))
    warehouse.write("dpo_dataset", POOL)
    _killed_training(warehouse, "run-k1", damage=False)
    assert leftover_backups(warehouse, "dpo_dataset") == ["run-k1"]
    _killed_training(warehouse, "run-k2", damage=False)  # it removed run-k1's copy, then was killed too
    assert leftover_backups(warehouse, "dpo_dataset") == ["run-k2"]
    rebuilt = pd.concat([POOL, pd.DataFrame({"decision_id": ["d"], "weight": [0.7]})], ignore_index=True)
    time.sleep(0.01)
    warehouse.write("dpo_dataset", rebuilt)  # dpo_dataset materialised again (the training job's first asset)
    said = []
    with pool_backup(warehouse, "dpo_dataset", "run-next", log=said.append) as rows:
        assert leftover_backups(warehouse, "dpo_dataset") == ["run-next"]
        pd.testing.assert_frame_equal(rows, rebuilt)
    pd.testing.assert_frame_equal(warehouse.read("dpo_dataset"), rebuilt)
    assert _backup_folders(warehouse) == []
    assert (
        len(said) == 1
        and "backups_dpo_dataset run=run-k2, left by a killed run" in said[0]
        and "rebuilt since" in said[0]
    )
