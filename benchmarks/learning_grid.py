"""Does a run configuration (an arm) learn what the prices reward, over seeds? A grid of training seeds x world seeds
per world, each cell one `benchmarks.outcome_learning.run_world` (the whole daily loop on tiny-local, the first
`--train-days` days training, the rest held out) in its own process, and each figure pooled over the cells with a
headline-clustered bootstrap interval (`benchmarks/_grid_table.py` says which figures and how).

    python -m benchmarks.learning_grid --out-dir DIR [--arm defaults] [--config '{"epochs": 1}']
        [--worlds news,inverted] [--world-seeds 0,1] [--train-seeds 0,1,2] [--days 26] [--train-days 11]
        [--parallel 2] [--record]
    python -m benchmarks.learning_grid --ablation    # every recorded arm, one markdown row each

- Cells run `--parallel` at a time, each process with one torch thread; a cell's log goes to DIR/logs/<cell>.log and
  its result, when it ends, to DIR/cells/<world>-w<world seed>-t<training seed>.json (written atomically). The CPU
  sets no training memory budget: give a real model's cells one (FLYWHEEL_TRAIN_MEMORY_GIB=4 for SmolLM2 at 8 x 8
  notes; without it one cell's GSPO step reached 12 GB and two cells ran out of 24 GiB, docs/models.md).
- Resume: run the same command again with the same --out-dir; cells whose JSON exists are skipped. The grid's
  arguments and the FLYWHEEL_* variables its cells inherit (FLYWHEEL_NOTE_FORMAT, ...) are recorded in DIR/grid.json
  and a run with other ones is refused (use another --out-dir).
- DIR/results.json: the table (per world, each figure's policy, base and difference with 95% intervals, and the
  per-cell spread), the arm's config, the machine, the date and the git commit. `--record` also adds it to (or
  replaces the same arm and grid in) benchmarks/results/learning_grid.json.
- `--ablation` runs nothing: it prints the recorded arms as one markdown table, each figure with its 95% interval
  (`_grid_table.ablation_rows`), the table the ablation's notes quote.
The last printed line is one JSON object (exit 1 when a cell failed; the figures are over the cells that ended).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from benchmarks._grid_table import ablation_markdown, ablation_rows, cell_name, opposite_sides, print_table, world_table
from benchmarks._results import git_commit, machine

WORLDS = ("news", "inverted", "null")
PROJECT = Path(__file__).resolve().parents[1]
RECORD = PROJECT / "benchmarks" / "results" / "learning_grid.json"
# The arguments that make a grid: a resumed run must give the same ones.
GRID_KEYS = (
    "arm",
    "config",
    "worlds",
    "world_seeds",
    "train_seeds",
    "days",
    "train_days",
    "headlines",
    "max_new_tokens",
    "learning_rate",
    "epochs",
    "reward_weights",
    "move_pct",
    "noise_pct",
    "model",
    "synthetic_days",
    "device",
    "settings",
)
# Variables a cell sets itself (its world's prices and archive, its data dir): not the grid's settings.
CELL_VARIABLES = ("FLYWHEEL_PRICES_FILE", "FLYWHEEL_FEEDS_ARCHIVE", "FLYWHEEL_DATA_DIR")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def grid_of(args: argparse.Namespace) -> dict:
    grid = {k: getattr(args, k, None) for k in GRID_KEYS}
    grid.update(
        config=json.loads(args.config) if args.config else {},
        reward_weights=json.loads(args.reward_weights) if args.reward_weights else None,
        worlds=[w.strip() for w in args.worlds.split(",") if w.strip()],
        world_seeds=_ints(args.world_seeds),
        train_seeds=_ints(args.train_seeds),
        settings=flywheel_settings(os.environ),
    )
    return grid


def flywheel_settings(environ) -> dict:
    """The FLYWHEEL_* variables the cells inherit (FLYWHEEL_NOTE_FORMAT, FLYWHEEL_ROLLOUTS_PER_HEADLINE, ...): they
    shape what a cell computes as much as its arguments do."""
    return {k: v for k, v in sorted(environ.items()) if k.startswith("FLYWHEEL_") and k not in CELL_VARIABLES}


def check_grid(out_dir: Path, grid: dict) -> str | None:
    """Record the grid's arguments in out_dir/grid.json, or say why they differ from those recorded there."""
    path = out_dir / "grid.json"
    if path.exists():
        recorded = json.loads(path.read_text())
        # a grid recorded before its settings were: run without any
        recorded.setdefault("settings", {})
        differ = {k: (recorded.get(k), grid.get(k)) for k in GRID_KEYS if recorded.get(k) != grid.get(k)}
        if differ:
            return (
                f"{out_dir} holds a grid with other arguments (recorded vs given: {differ}); "
                "give the recorded arguments to resume it, or another --out-dir"
            )
        return None
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(path, grid)
    return None


def write_json(path: Path, value) -> None:
    """Atomically: a temp file beside it, then a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(value, default=str))
    os.replace(tmp, path)


def cells_of(grid: dict) -> list[tuple[str, int, int]]:
    return [(w, ws, ts) for ws in grid["world_seeds"] for ts in grid["train_seeds"] for w in grid["worlds"]]


# -- one cell, in its own process -------------------------------------------------------------------------------------
def run_cell(out_dir: Path, world: str, world_seed: int, train_seed: int) -> None:
    import pandas as pd
    import torch

    from benchmarks.outcome_learning import model_settings, prepare_days, run_world
    from outcome_flywheel.cli_arguments import quiet_libraries

    torch.set_num_threads(1)  # two cells share the box's cores
    quiet_libraries()
    grid = json.loads((out_dir / "grid.json").read_text())
    name = cell_name(world, world_seed, train_seed)
    root = out_dir / "runs" / name
    shutil.rmtree(root, ignore_errors=True)  # a cell cut off before it wrote its JSON starts again
    root.mkdir(parents=True)
    days, archive = prepare_days(root, grid["days"], grid["headlines"], world_seed, grid["synthetic_days"])
    own = model_settings(grid["model"]).reward.weights
    weights = dict(own if grid["reward_weights"] is None else grid["reward_weights"])
    started = time.perf_counter()
    result = run_world(
        world,
        root,
        days,
        grid["train_days"],
        grid["headlines"],
        world_seed,
        grid["move_pct"],
        grid["noise_pct"],
        weights,
        grid["learning_rate"],
        grid["max_new_tokens"],
        grid["epochs"],
        grid["model"],
        grid["config"] or None,
        train_seed,
        archive,
        grid["device"],
    )
    held = result["held_out"]

    def split(frame: pd.DataFrame) -> dict:
        return json.loads(frame.to_json(orient="split", index=False))

    cell = dict(
        name=name,
        world=world,
        world_seed=world_seed,
        train_seed=train_seed,
        days=days,
        train_days=grid["train_days"],
        planted_moves=result["planted_moves"],
        per_day=result["per_day"],
        held_out={k: held[k] for k in ("ab", "backtest", "policy_long_share", "base_long_share")},
        notes=split(held["notes"]),
        sides=split(held["sides"]),
        wall_s=round(time.perf_counter() - started, 1),
        git=git_commit(),
        machine=machine(),
        finished=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )
    write_json(out_dir / "cells" / f"{name}.json", cell)
    if grid.get("drop_runs"):
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(dict(cell=name, wall_s=cell["wall_s"])))


# -- the grid ---------------------------------------------------------------------------------------------------------
def run_cells(out_dir: Path, todo: list[tuple[str, int, int]], parallel: int) -> list[str]:
    """Run the cells, `parallel` at a time, each `python -m benchmarks.learning_grid --cell ...`; the failed cells."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    queue, running, failed = list(todo), {}, []
    try:
        while queue or running:
            while queue and len(running) < max(1, parallel):
                world, ws, ts = queue.pop(0)
                name = cell_name(world, ws, ts)
                log = open(out_dir / "logs" / f"{name}.log", "w")
                command = [sys.executable, "-m", "benchmarks.learning_grid", "--out-dir", str(out_dir)]
                command += ["--cell", f"{world}:{ws}:{ts}"]
                proc = subprocess.Popen(command, cwd=PROJECT, env=env, stdout=log, stderr=subprocess.STDOUT)
                running[name] = (proc, log, time.perf_counter())
                print(f"cell {name}: started (process {proc.pid})", flush=True)
            time.sleep(0.5)
            for name, (proc, log, t0) in list(running.items()):
                if proc.poll() is None:
                    continue
                log.close()
                del running[name]
                seconds = round(time.perf_counter() - t0)
                if proc.returncode == 0 and (out_dir / "cells" / f"{name}.json").exists():
                    print(f"cell {name}: done in {seconds} s", flush=True)
                else:
                    failed.append(name)
                    tail = (out_dir / "logs" / f"{name}.log").read_text(errors="replace").splitlines()[-15:]
                    print(f"cell {name}: FAILED (exit {proc.returncode}) after {seconds} s; its log ends:", flush=True)
                    print("\n".join("    " + line for line in tail), flush=True)
    finally:
        for proc, log, _ in running.values():  # interrupted: stop the cells this run started
            proc.terminate()
            proc.wait(timeout=30)
            log.close()
    return failed


def summarise(out_dir: Path, grid: dict, n_boot: int = 2000) -> dict:
    cells = []
    for world, ws, ts in cells_of(grid):
        path = out_dir / "cells" / f"{cell_name(world, ws, ts)}.json"
        if path.exists():
            cells.append(json.loads(path.read_text()))
    expected = cells_of(grid)
    return dict(
        benchmark="learning_grid",
        arm=grid["arm"],
        config=grid["config"],
        grid={k: grid[k] for k in GRID_KEYS},
        cells=dict(
            done=len(cells),
            expected=len(expected),
            missing=[cell_name(*c) for c in expected if cell_name(*c) not in {x["name"] for x in cells}],
            wall_s=round(sum(c.get("wall_s", 0) for c in cells), 1),
            commits=sorted({str((c.get("git") or {}).get("commit")) for c in cells}),
        ),
        worlds={w: world_table([c for c in cells if c["world"] == w], w, n_boot=n_boot) for w in grid["worlds"]},
        opposite_sides=opposite_sides(cells, n_boot=n_boot),
        machine=machine(),
        date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        git=git_commit(),
        out_dir=str(out_dir),
    )


def record(results: dict, path: Path = RECORD) -> None:
    """Add the results to `path` (a JSON list), replacing an entry of the same arm and grid."""
    entries = json.loads(path.read_text()) if path.exists() else []
    entries = [e for e in entries if not (e.get("arm") == results["arm"] and e.get("grid") == results["grid"])]
    write_json(path, [*entries, results])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", default=None, help="the grid's folder (cells, logs, results.json); resumable")
    parser.add_argument("--arm", default="defaults", help="the run configuration's name, in the results")
    parser.add_argument("--config", default=None, help="JSON object of daily_update run-config fields (the arm)")
    parser.add_argument("--worlds", default="news,inverted", help="comma-separated, from news, inverted, null")
    parser.add_argument("--world-seeds", default="0,1", help="the worlds' seeds (their walks)")
    parser.add_argument("--train-seeds", default="0,1,2", help="FLYWHEEL_SEED of each training run")
    parser.add_argument("--days", type=int, default=26, help="archive days from its first (26 = all)")
    parser.add_argument("--train-days", type=int, default=11, help="the first N days train; the rest are held out")
    parser.add_argument("--headlines", type=int, default=8, help="headlines per day")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument(
        "--learning-rate", type=float, default=None, help="the model's own (MODEL_RUN_DEFAULTS), else GSPOConfig's"
    )
    parser.add_argument("--epochs", type=int, default=None, help="passes over each day's examples (GSPOConfig's)")
    parser.add_argument(
        "--reward-weights", default=None, help="JSON object, signal -> weight (the model's own, else RewardConfig's)"
    )
    parser.add_argument("--move-pct", type=float, default=2.0)
    parser.add_argument("--noise-pct", type=float, default=1.0)
    parser.add_argument("--model", default="tiny-local", help="tiny-local, smollm2-135m-instruct or a folder")
    parser.add_argument("--synthetic-days", type=int, default=0, help="a SYNTHETIC archive of N days instead")
    parser.add_argument("--device", default="cpu", help="the torch device of each cell (cpu, cuda, ...)")
    parser.add_argument("--parallel", type=int, default=2, help="cells at a time (each with one torch thread)")
    parser.add_argument("--n-boot", type=int, default=2000, help="bootstrap resamples per interval")
    parser.add_argument("--record", action="store_true", help="also add the results to " + str(RECORD.name))
    parser.add_argument("--drop-runs", action="store_true", help="delete each cell's data dir once its JSON is written")
    parser.add_argument("--ablation", action="store_true", help="print the recorded arms' table and exit")
    parser.add_argument("--cell", default=None, help=argparse.SUPPRESS)  # world:world_seed:train_seed, in a child
    args = parser.parse_args()
    if args.ablation:
        rows = ablation_rows(json.loads(RECORD.read_text()) if RECORD.exists() else [])
        print(ablation_markdown(rows))
        print(json.dumps(dict(arms=len(rows), record=str(RECORD))))
        return
    if not args.out_dir:
        parser.error("--out-dir is required (or --ablation)")
    out_dir = Path(args.out_dir).resolve()
    if args.cell:
        world, ws, ts = args.cell.split(":")
        run_cell(out_dir, world, int(ws), int(ts))
        return
    grid = grid_of(args)
    unknown = sorted(set(grid["worlds"]) - set(WORLDS))
    if unknown or not grid["worlds"]:
        parser.error(f"unknown world(s) {unknown}: choose from {', '.join(WORLDS)}")
    if not grid["world_seeds"] or not grid["train_seeds"]:
        parser.error("--world-seeds and --train-seeds need at least one seed each")
    if not 0 < args.train_days < args.days:
        parser.error(f"--train-days must be between 1 and --days - 1, got {args.train_days} of {args.days}")
    problem = check_grid(out_dir, grid)
    if problem:
        parser.error(problem)
    # how the cells clean up, not what they compute: not a grid argument, so each run says it anew
    write_json(out_dir / "grid.json", dict(json.loads((out_dir / "grid.json").read_text()), drop_runs=args.drop_runs))
    todo = [c for c in cells_of(grid) if not (out_dir / "cells" / f"{cell_name(*c)}.json").exists()]
    print(f"grid {out_dir}: {len(cells_of(grid))} cells, {len(todo)} to run, {args.parallel} at a time", flush=True)
    started = time.perf_counter()
    failed = run_cells(out_dir, todo, args.parallel) if todo else []
    results = summarise(out_dir, grid, n_boot=args.n_boot)
    results.update(failed=failed, wall_s=round(time.perf_counter() - started, 1))
    write_json(out_dir / "results.json", results)
    if args.record:
        record(results)
    print_table(results)
    print(json.dumps(results, default=str))
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
