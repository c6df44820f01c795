"""Issue 47, item 1: a training refused at the moment the holder finishes. Every `training_audit` row is
written under the audit table's own mutex (`outcome_flywheel/fencing.py`), so the refused attempt's row
(written without the trainer lock) and the holder's final row never overwrite each other. Two real
processes, long-lived so that each try takes well under a second: holder A (`wait_s=600`) ends at T,
B starts at T - `wait_s` and is refused at T; B's start is swept over ±30 ms around that moment."""

import json
import os
import subprocess
import sys
import time

from outcome_flywheel.storage import Warehouse
from outcome_flywheel.training_audit import audited_training, read_audit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRIES = 20
WAIT_S = 0.3  # B's wait: it is refused WAIT_S after it starts

WORKER = """
import json, sys, time
from outcome_flywheel.storage import Warehouse
from outcome_flywheel.trainer_lock import TrainerBusy
from outcome_flywheel.training_audit import audited_training

def say(word):
    print(word, flush=True)

for line in sys.stdin:
    task = json.loads(line)
    warehouse = Warehouse(data_dir=task["dir"])
    if task["role"] == "holder":
        with audited_training(warehouse, "dpo", task["id"], "test", wait_s=600):
            say("held")
            until = float(sys.stdin.readline())
            time.sleep(max(0.0, until - time.time()))
    else:
        time.sleep(max(0.0, task["start_at"] - time.time()))
        try:
            with audited_training(warehouse, "gspo_daily", task["id"], "test", wait_s=task["wait_s"]):
                pass
        except TrainerBusy:
            pass
    say("done")
"""


def _worker():
    return subprocess.Popen(
        [sys.executable, "-c", WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT
    )


def _send(proc, message) -> None:
    proc.stdin.write(f"{message}\n")
    proc.stdin.flush()


def _expect(proc, word: str) -> None:
    line = proc.stdout.readline().strip()
    assert line == word, f"worker {proc.pid} said {line!r}, not {word!r}"


def test_a_refusal_at_the_holder_s_end_loses_no_row_and_overwrites_none(tmp_path):
    holder, other = _worker(), _worker()
    found = []
    try:
        for i in range(TRIES):
            data = str(tmp_path / f"try{i}")
            _send(holder, json.dumps({"role": "holder", "dir": data, "id": "A"}))
            _expect(holder, "held")
            until = time.time() + WAIT_S + 0.15  # A ends here
            offset = (i - TRIES / 2) * 0.003  # B's refusal swept from 30 ms before A's end to 27 ms after
            start_at = until - WAIT_S + offset
            _send(
                other, json.dumps({"role": "refused", "dir": data, "id": "B", "start_at": start_at, "wait_s": WAIT_S})
            )
            _send(holder, repr(until))
            _expect(holder, "done")
            _expect(other, "done")
            warehouse = Warehouse(data_dir=data)
            rows = read_audit(warehouse).set_index("training_id")["status"].to_dict()
            # The next training finds nothing `running`: A is not rewritten `crashed`.
            with audited_training(warehouse, "distillation", "C", "test", wait_s=5):
                pass
            after = read_audit(warehouse).set_index("training_id")["status"].to_dict()
            found.append((rows, after))
    finally:
        for proc in (holder, other):
            proc.stdin.close()
            proc.wait(timeout=30)
    # B is refused, or takes the lock if A released it just before B's last look; no row is lost.
    wrong = [
        (i, rows, after)
        for i, (rows, after) in enumerate(found)
        if rows.get("A") != "succeeded"
        or rows.get("B") not in ("refused", "succeeded")
        or after != {**rows, "C": "succeeded"}
    ]
    assert not wrong, f"{len(wrong)} of {TRIES} tries lost or overwrote a row: {wrong}"
    assert sum(rows.get("B") == "refused" for rows, _ in found) >= TRIES // 2  # the race was run, not avoided
