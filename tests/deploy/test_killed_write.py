"""A partition write killed midway (kill -9 of a real writer process) leaves its temp file
`.part.parquet.<random>.tmp`; readers never see it, and the next write of that partition removes it,
but never the temp file of a writer still at work (issue 47, item 9)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pandas as pd

from outcome_flywheel.settings import PROJECT_ROOT
from outcome_flywheel.storage import Warehouse

# A writer that stops inside the write (its temp file made, locked and filled, not yet renamed):
# it says so, then waits for `go` to appear before it finishes.
WRITER = """
import os, sys, time
import pandas as pd
from outcome_flywheel.storage import Warehouse
fsync, go = os.fsync, sys.argv[2]
def held(fd):
    print("writing", flush=True)
    while not os.path.exists(go):
        time.sleep(0.05)
    fsync(fd)
os.fsync = held
Warehouse(data_dir=sys.argv[1]).write("rollouts", pd.DataFrame({"who": [sys.argv[3]]}), "2025-06-11")
"""


def _writer(root, go, who: str) -> subprocess.Popen:
    process = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(root), str(go), who], cwd=PROJECT_ROOT, stdout=subprocess.PIPE, text=True
    )
    assert process.stdout.readline().strip() == "writing"
    return process


def test_the_next_write_removes_a_killed_writers_temp_file_not_a_live_ones(tmp_path):
    root, go = tmp_path / "data", tmp_path / "go"
    warehouse = Warehouse(data_dir=str(root))
    folder = root / "warehouse" / "rollouts" / "date=2025-06-11"
    killed = _writer(root, go, "killed")
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait()
    (left,) = folder.glob(".part.parquet.*.tmp")
    assert warehouse.read("rollouts", "2025-06-11").empty and warehouse.files("rollouts") == []  # never read
    live = _writer(root, go, "live")
    try:
        (live_tmp,) = set(folder.glob(".part.parquet.*.tmp")) - {left}
        warehouse.write("rollouts", pd.DataFrame({"who": ["next"]}), "2025-06-11")
        assert list(warehouse.read("rollouts", "2025-06-11")["who"]) == ["next"]
        assert not left.exists(), "the killed writer's temp file is still there"
        assert live_tmp.exists()  # its writer holds it: left alone
        go.touch()
        assert live.wait(timeout=120) == 0
    finally:
        live.kill()
        live.wait()
    assert list(warehouse.read("rollouts", "2025-06-11")["who"]) == ["live"]  # the last write wins, whole
    assert sorted(p.name for p in folder.iterdir()) == ["part.parquet"]
