"""The benchmarks' one way to record a result (benchmarks/_results.py): `--record` writes <benchmark>.json with the
machine, the date and the commit; without it nothing is written; every benchmark takes the flag."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import torch

from benchmarks import _results
from outcome_flywheel.settings import PROJECT_ROOT


def test_every_benchmark_takes_record():
    """learning_grid records its grids its own way (benchmarks/results/learning_grid.json, a list of arms)."""
    for path in sorted((PROJECT_ROOT / "benchmarks").glob("*.py")):
        if path.stem.startswith("_") or path.stem == "learning_grid":
            continue
        assert "add_record_argument(" in path.read_text() and "finish(" in path.read_text(), path.name


def test_write_result_keeps_one_entry_per_arguments_and_machine(tmp_path):
    first = _results.write_result("demo", {"x": 1}, ["--n", "2"], directory=tmp_path)
    _results.write_result("demo", {"x": 2}, ["--n", "2"], directory=tmp_path)  # same arguments: replaces
    _results.write_result("demo", {"x": 3}, ["--n", "3", "--record"], directory=tmp_path)
    assert first == tmp_path / "demo.json" and sorted(os.listdir(tmp_path)) == ["demo.json"]  # no temp file left
    recorded = json.loads(first.read_text())
    assert recorded["benchmark"] == "demo"
    assert [(r["args"], r["result"]) for r in recorded["runs"]] == [(["--n", "2"], {"x": 2}), (["--n", "3"], {"x": 3})]
    run = recorded["runs"][0]
    assert run["machine"]["cpu_count"] == os.cpu_count() and run["machine"]["platform"] and "gpu" in run["machine"]
    # the CPU itself and torch's kernels on it: sampled runs of the same seeds can differ between CPUs
    assert run["machine"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists() and "model name" in cpuinfo.read_text():
        assert run["machine"]["cpu_model"] and run["machine"]["cpu_model"] in cpuinfo.read_text()
    assert datetime.fromisoformat(run["recorded_at"]).utcoffset().total_seconds() == 0
    assert "commit" in run["git"]


def _run(args: list[str], results_dir) -> subprocess.CompletedProcess:
    env = dict(os.environ, BENCHMARK_RESULTS_DIR=str(results_dir), OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.ab_calibration", "--runs", "6", "--power-runs", "0", *args],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_record_writes_the_result_with_machine_and_date(tmp_path):
    plain = _run([], tmp_path)
    assert plain.returncode == 0, plain.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []  # off by default: a run writes nothing
    done = _run(["--record"], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    last = json.loads(done.stdout.strip().splitlines()[-1])  # still the result, one JSON object
    [run] = json.loads((tmp_path / "ab_calibration.json").read_text())["runs"]
    assert run["result"] == last and run["args"] == ["--runs", "6", "--power-runs", "0"]
    assert run["machine"]["cpu_count"] == os.cpu_count() and run["recorded_at"][:4].isdigit()
