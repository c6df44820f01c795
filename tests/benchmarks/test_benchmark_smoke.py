"""Every benchmark in benchmarks/ runs, so none rots unseen: each as `python -m benchmarks.<name>` with tiny
arguments in its own process (one torch thread, a fresh data dir holding the cached tiny-local), which must exit 0
and print one JSON object on its last line (the project's convention). The processes are forked off a server that
has imported torch, transformers, peft, dagster and the rest once (`fork_server.py`): each benchmark's own
interpreter would spend ~6 CPU-s on them. The figures of such runs mean nothing; the
code paths are what is checked. The CUDA benchmarks (gpu, training_profile) run their CPU smoke versions, and
logprob_memory and data_parallel their CPU paths (data_parallel: gloo under torchrun): none needs CUDA.
training_profile's CPU smoke runs three trainers x three plans on 2 x 2 sequences (no warm-ups) and profiles one
plan a trainer, since parsing the profiler's events was most of its time (on the 2-core box beside a 2-process
benchmark: 280 s at 2 x 4 with every plan profiled, 164 s at 2 x 2, 18 s with one plan a trainer)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from outcome_flywheel.settings import PROJECT_ROOT
from tests.benchmarks.fork_server import ForkServer

TIMEOUT_S = 300  # each; on an idle 2-core box the slowest (the daily loop's) take ~25-60 s
LOOP = ["--headlines", "2", "--max-new-tokens", "16"]  # days of the bundled archive, 2 headlines a day
SMOKE: dict[str, list[str]] = {
    "ab_calibration": ["--runs", "6", "--power-runs", "2"],
    "backends": ["--prompts", "1", "--samples", "2", "--max-new-tokens", "8", "--backends", "torch,mlx"]
    + ["--torch-device", "cpu"],
    "daily_learning": [*LOOP, "--days", "2"],  # the second day trains on the first's scores
    "data_parallel": ["--processes", "2", "--examples", "4", "--headlines", "2", "--device", "cpu"],
    "exact_anchor": ["--model", "tiny-local", "--headlines", "1", "--notes", "2", "--max-new-tokens", "8"]
    + ["--repeats", "1"],
    "flywheel_auc": ["--operators", "random", "--n", "40", "--threads", "1"],
    "generation": ["--prompts", "1", "--samples", "2", "--max-new-tokens", "8"],
    "gpu": ["--smoke"],
    "gspo_batching": ["--headlines", "1", "--rollouts", "2", "--batch-size", "2", "--max-new-tokens", "8"]
    + ["--repeats", "1"],
    # one cell of two days (outcome_learning's run_world, as below: it trains on its second day)
    "learning_grid": [*LOOP, "--days", "2", "--train-days", "1", "--worlds", "news", "--world-seeds", "0"]
    + ["--train-seeds", "0"]
    + ["--parallel", "1", "--n-boot", "100", "--out-dir", "{tmp}/grid"],
    "heldout_sides": ["--model", "tiny-local", "--checkpoint", "base", "--days", "2", "--train-days", "1"]
    + ["--headlines", "1", "--notes", "2", "--max-new-tokens", "8", "--out-dir", "{tmp}/heldout"],
    # the learning grid's smoke cell's second day (held out there) replayed at the grid's rate on the first's notes
    "lean_source": ["--model", "tiny-local", "--run", "{tmp}/grid/runs/news-w0-t0/news", "--day", "2025-11-04"]
    + ["--arms", "all,relevance", "--days", "2", "--train-days", "1", "--headlines", "1", "--n-boot", "50"]
    + ["--out-dir", "{tmp}/lean"],
    "logprob_memory": ["--batch", "1", "--prompt-tokens", "8", "--response-tokens", "8", "--frameworks", "torch"]
    + ["--device", "cpu"],
    "note_scorer": [*LOOP, "--days", "2"],
    "outcome_learning": [*LOOP, "--days", "2", "--train-days", "1", "--worlds", "news", "--train-seeds", "0"]
    + ["--out-dir", "{tmp}/worlds"],
    "partition_speed": ["--headlines", "1", "--rollouts", "2", "--max-new-tokens", "8"],
    "s3_round_trip": ["--repeats", "1"],
    "side_margin": ["--model", "tiny-local", "--checkpoints", "base,base", "--note-format", "sections", "--days", "2"]
    + ["--train-days", "1", "--headlines", "2", "--n-boot", "50", "--out-dir", "{tmp}/margin"],
    "tiny_local_calls": ["--samples", "1", "--headlines", "2"],
    "tracking_cost": ["--headlines", "1", "--rollouts", "2", "--max-new-tokens", "8"],
    "training_profile": ["--smoke", "--no-warm-up"],
    # the same replayed day as lean_source's, trained with the trim on and off
    "trim_speed": ["--model", "tiny-local", "--run", "{tmp}/grid/runs/news-w0-t0/news", "--day", "2025-11-04"],
}


def test_every_benchmark_has_a_smoke_run():
    modules = {p.stem for p in (PROJECT_ROOT / "benchmarks").glob("*.py") if not p.stem.startswith("_")}
    assert modules == set(SMOKE), f"give these a smoke run: {sorted(modules - set(SMOKE))}"


def shared_env() -> dict[str, str]:
    """What every benchmark's process shares, the fork server's own (what libraries read when imported)."""
    return dict(
        os.environ,
        OMP_NUM_THREADS="1",  # more threads than free cores slow a tiny step down many times over
        MKL_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",  # torchrun, weed
    )


@pytest.fixture(scope="module")
def server():
    forks = ForkServer(shared_env(), PROJECT_ROOT)
    yield forks
    forks.close()


def run_benchmark(
    server: ForkServer, name: str, args: list[str], data_dir: Path, tmp: Path
) -> subprocess.CompletedProcess:
    env = dict(
        shared_env(),
        FLYWHEEL_DATA_DIR=str(data_dir),
        BENCHMARK_RESULTS_DIR=str(tmp / "results"),  # a smoke run never writes into benchmarks/results/
    )
    logs = tmp / "logs"
    logs.mkdir(exist_ok=True)
    arguments = [a.replace("{tmp}", str(tmp)) for a in args]
    return server.run(f"benchmarks.{name}", arguments, PROJECT_ROOT, env, logs, TIMEOUT_S)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> Path:
    """Where the benchmarks that take a folder write: one per module, so the grid's resume test finds its cells."""
    return tmp_path_factory.mktemp("benchmark-outputs")


@pytest.mark.parametrize("name", sorted(SMOKE))
def test_the_benchmark_runs_and_ends_with_one_json_object(name, server, data_dir, outputs):
    if name in ("lean_source", "trim_speed"):  # they replay the grid's cell (run alone: the grid runs here)
        grid_cell(server, data_dir, outputs)
    done = run_benchmark(server, name, SMOKE[name], data_dir, outputs)
    tail = (done.stdout[-3000:] + "\n--- stderr ---\n" + done.stderr[-3000:]).strip()
    assert done.returncode == 0, f"benchmarks.{name} exited {done.returncode}:\n{tail}"
    lines = done.stdout.strip().splitlines()
    assert lines, f"benchmarks.{name} printed nothing:\n{tail}"
    assert isinstance(json.loads(lines[-1]), dict), f"benchmarks.{name}'s last line is not one JSON object:\n{tail}"


def grid_cell(server: ForkServer, data_dir: Path, outputs: Path) -> None:
    """The learning grid's smoke cell, run unless it is there."""
    if not (outputs / "grid" / "cells" / "news-w0-t0.json").exists():
        first = run_benchmark(server, "learning_grid", SMOKE["learning_grid"], data_dir, outputs)
        assert first.returncode == 0, first.stderr[-3000:]


def test_a_grid_resumes_and_other_arguments_are_refused(server, data_dir, outputs):
    """The grid of the smoke run again: with its arguments it skips the cell it has; with others it refuses (run
    alone, the first call runs the cell)."""
    args = SMOKE["learning_grid"]
    grid_cell(server, data_dir, outputs)
    again = run_benchmark(server, "learning_grid", args, data_dir, outputs)
    assert again.returncode == 0 and "1 cells, 0 to run" in again.stdout, again.stdout[-2000:]
    assert json.loads(again.stdout.strip().splitlines()[-1])["cells"]["done"] == 1
    other = run_benchmark(server, "learning_grid", [*args, "--arm", "other"], data_dir, outputs)
    assert other.returncode == 2 and "other arguments" in other.stderr
