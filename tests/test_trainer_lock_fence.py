"""Issue 47, item 2: the trainer lock's lease has a fence (`outcome_flywheel/fencing.py`). A holder frozen
(SIGSTOP) past its lease loses the lock to another trainer; resumed (SIGCONT), it trains to the end but
its publish step (the policy checkpoint's folder and `latest`, the preference adapter's `latest`) finds
a later fencing token and publishes nothing: it raises `FencedOut` and its `training_audit` row is
`fenced` with the reason, while the other trainer's publication stands. Real processes, a 1 s lease."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from outcome_flywheel.daily_rl.policy.checkpoints import read_checkpoint
from outcome_flywheel.fencing import FencedOut, last_fence, publishing
from outcome_flywheel.storage import Warehouse
from outcome_flywheel.trainer_lock import LOCK_FILE, TrainerLock, read_holder
from outcome_flywheel.training_audit import read_audit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LEASE_S = 1.0
DAY = "2026-01-05"

# One training, published by the real publish code once the file `go` exists; a fenced-out one exits 1.
TRAINER = """
import sys, time
from pathlib import Path
from outcome_flywheel.daily_rl.policy.checkpoints import mark_verified, publish_checkpoint
from outcome_flywheel.preferences.adapter_step import publish_adapter
from outcome_flywheel.storage import Warehouse
from outcome_flywheel.training_audit import audited_training

data, name, kind, go, day = sys.argv[1:6]
warehouse = Warehouse(data_dir=data)
tier = "gspo_daily" if kind == "checkpoint" else "dpo"
with audited_training(warehouse, tier, name, "test", wait_s=20):
    print("training", flush=True)
    while not Path(go).exists():
        time.sleep(0.02)
    if kind == "checkpoint":
        root = warehouse.path("checkpoints", "policy")
        publish_checkpoint(None, root, day, {"trained_by": name}, is_base=True)
        mark_verified(root, day)
    else:
        root = warehouse.path("adapters", "preference")
        staging = root / f".staging-{name}"
        staging.mkdir(parents=True)
        (staging / "trained_by").write_text(name)
        publish_adapter(staging, root, "run-1")  # the same run: a retry while the first was frozen
print("published", flush=True)
"""


def _trainer(data, name: str, kind: str):
    go = data / f"go-{name}"
    proc = subprocess.Popen(
        [sys.executable, "-c", TRAINER, str(data), name, kind, str(go), DAY],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "FLYWHEEL_TRAINER_LOCK_LEASE_S": str(LEASE_S)},
    )
    line = proc.stdout.readline().strip()
    assert line == "training", f"{name}: {line!r} {proc.stderr.read() if proc.poll() is not None else ''}"
    return proc, go


def _published_by(warehouse: Warehouse, kind: str) -> str:
    if kind == "checkpoint":
        root = warehouse.path("checkpoints", "policy")
        assert (root / "latest").resolve() == (root / DAY).resolve()
        info = read_checkpoint(root / "latest")
        assert info["verified"] is True
        assert not list(root.glob(".*.staging"))  # a fenced-out staging folder is removed
        return info["trained_by"]
    root = warehouse.path("adapters", "preference")
    assert (root / "latest").resolve() == (root / "run-1").resolve()
    return (root / "latest" / "trained_by").read_text()


@pytest.mark.parametrize("kind", ["checkpoint", "adapter"])
@pytest.mark.parametrize("when", ["while the other trains", "after the other published"])
def test_a_holder_frozen_past_its_lease_publishes_nothing_and_says_why(tmp_path, kind, when):
    warehouse = Warehouse(data_dir=str(tmp_path))
    a, go_a = _trainer(tmp_path, "A", kind)
    b = None
    try:
        a.send_signal(signal.SIGSTOP)
        time.sleep(LEASE_S + 0.6)  # A's lease runs out: it is alive, frozen, on this host
        b, go_b = _trainer(tmp_path, "B", kind)  # B clears A's lock (lease expired) and takes the next token
        assert read_holder(warehouse.path(*LOCK_FILE))["fence"] == 2
        if when == "after the other published":
            go_b.touch()
            assert b.wait(timeout=30) == 0, b.stderr.read()
        a.send_signal(signal.SIGCONT)
        go_a.touch()
        out, err = a.communicate(timeout=30)
        assert a.returncode == 1 and "published" not in out
        assert "FencedOut" in err and "token 1 < 2" in err and "not published" in err, err
        if when == "while the other trains":
            go_b.touch()
            assert b.wait(timeout=30) == 0, b.stderr.read()
    finally:
        for proc in (a, b):
            if proc is not None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait()
    assert _published_by(warehouse, kind) == "B"  # B's publication stands
    audit = read_audit(warehouse).set_index("training_id")
    assert audit.loc["B", "status"] == "succeeded"
    assert json.loads(audit.loc["B", "stale_lock_cleared"])["training_id"] == "A"
    fenced = audit.loc["A"]
    assert fenced["status"] == "fenced", fenced.to_dict()
    assert f"trainer lease lost to PID {b.pid}" in fenced["error"] and "(token 1 < 2)" in fenced["error"]
    assert "not published" in fenced["error"]
    assert not warehouse.path(*LOCK_FILE).exists() and last_fence(warehouse.path(*LOCK_FILE))["fence"] == 2


def test_a_holder_frozen_past_its_lease_that_nobody_took_still_publishes(tmp_path):
    """No false alarm: frozen past its lease with no other trainer meanwhile, it resumes, takes its
    lock back (or finds it untouched) and publishes; its token is still the last."""
    warehouse = Warehouse(data_dir=str(tmp_path))
    a, go_a = _trainer(tmp_path, "A", "checkpoint")
    try:
        a.send_signal(signal.SIGSTOP)
        time.sleep(LEASE_S + 0.6)
        a.send_signal(signal.SIGCONT)
        go_a.touch()
        out, err = a.communicate(timeout=30)
        assert a.returncode == 0 and "published" in out, err
    finally:
        a.send_signal(signal.SIGCONT)
        a.kill()
        a.wait()
    assert _published_by(warehouse, "checkpoint") == "A"
    assert read_audit(warehouse).set_index("training_id").loc["A", "status"] == "succeeded"


def test_fencing_tokens_only_grow_and_a_later_one_fences_the_publish(tmp_path):
    path = tmp_path / "locks" / "trainer.lock"
    tokens = []
    for _ in range(3):
        with TrainerLock(path, tier="dpo", wait_s=0) as report:
            tokens.append(report.holder["fence"])
            assert read_holder(path)["fence"] == tokens[-1]
            with publishing("a test"):  # the holder's own token: published
                pass
    assert tokens == [1, 2, 3]
    lock = TrainerLock(path, tier="dpo", wait_s=0)
    lock.acquire()
    try:
        path.unlink()  # judged stale and cleared; another trainer took token 5 and released it
        other = TrainerLock(path, tier="gspo_daily", wait_s=0, training_id="gspo:later")
        other.acquire()
        other.release()
        published = []
        with pytest.raises(FencedOut, match=r"lost to PID \d+ on .* \(gspo_daily, gspo:later\) \(token 4 < 5\)"):
            with publishing("checkpoint X"):
                published.append(True)
        assert not published
    finally:
        lock.release()
    with publishing("outside any training"):  # a process holding no trainer lock publishes unchecked
        pass
