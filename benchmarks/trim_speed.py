"""What `trim_unread_tail` saves on a real day: one trained day of a finished world-run (`learning_grid` /
`outcome_learning`) rebuilt as `lean_source` rebuilds it (the day's examples as its update built them), and the
parent trained on them with the trim on and off, in turns in this one process (`--repeats` pairs, the order
alternating, so a noisy machine's drift falls on both arms alike).

Per arm: the trainer's seconds (`TrainStats.wall_s`) and the response tokens it forwarded; between the arms: the
time ratio (off / on, the median over the pairs), the first step's loss difference (relative: the same update to
rounding, `tests/models/train/test_trim_unread_tail.py` says why) and the largest over the steps, and how far the
two updates of the trained weights differ, relative to the update's size (AdamW divides each step by a running
size, so a weight whose gradient is rounding noise may step either way: a small figure, not 0).

    python -m benchmarks.trim_speed --run RUN_FOLDER --day YYYY-MM-DD [--grid GRID_JSON]
        [--model smollm2-135m-instruct] [--repeats 1]

RUN_FOLDER and `--grid` as in `lean_source`. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from benchmarks._results import add_record_argument, finish
from benchmarks.lean_source import day_examples


def trained_weights(policy) -> np.ndarray:
    """Every trainable weight of the policy (the LoRA adapter's on a LoRA policy), flattened, in float64."""
    return np.concatenate([p.detach().double().flatten().cpu().numpy() for p in policy.trainable_parameters()])


def relative_gap(a: list[float], b: list[float]) -> list[float]:
    """|a - b| / |b| per step (0 where both are 0)."""
    return [abs(x - y) / abs(y) if y else abs(x - y) for x, y in zip(a, b)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, help="a world's folder: prices.csv and data/")
    parser.add_argument("--day", required=True, help="the trained day to replay (its parent is the day before)")
    parser.add_argument("--grid", default=None, help="the run's grid.json (default: two levels above --run)")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="the run's base model")
    parser.add_argument("--repeats", type=int, default=1, help="pairs of trainings (on, off), the order alternating")
    add_record_argument(parser)
    args = parser.parse_args()
    run = Path(args.run)
    grid_file = Path(args.grid) if args.grid else run.parent.parent.parent / "grid.json"
    if not (run / "prices.csv").is_file() or not (run / "data").is_dir():
        parser.error(f"--run {run}: not a world's folder (prices.csv and data/)")
    if not grid_file.is_file():
        parser.error(f"--grid {grid_file}: no such file")
    if args.repeats < 1:
        parser.error("--repeats: at least 1")
    from outcome_flywheel.daily_rl.policy.checkpoints import load_policy
    from outcome_flywheel.models.train.gspo import train_gspo

    started = time.perf_counter()
    grid = json.loads(grid_file.read_text())
    models, (parent_dir, parent_info), gspo, examples, train_seed = day_examples(run, args.day, grid, args.model)
    if not examples:
        parser.error(f"--day {args.day}: the day has nothing to train on")
    arms: dict[bool, dict] = {True: {"seconds": []}, False: {"seconds": []}}
    for repeat in range(args.repeats):
        for trim in (True, False) if repeat % 2 == 0 else (False, True):
            policy = load_policy(models, parent_dir, parent_info)
            before = trained_weights(policy) if policy.has_adapter else None
            policy.framework.seed(train_seed % (2**31))
            stats = train_gspo(policy, examples, replace(gspo, trim_unread_tail=trim))
            after = trained_weights(policy)
            arm = arms[trim]
            arm["seconds"].append(round(stats.wall_s, 1))
            arm.update(
                losses=stats.losses,
                update=after - (before if before is not None and len(before) == len(after) else 0.0),
                response_tokens=stats.extra.get("response_tokens"),
                response_tokens_forwarded=stats.extra.get("response_tokens_forwarded"),
                steps=stats.steps,
            )
            print(json.dumps({"trim": trim, "seconds": arm["seconds"][-1], "steps": stats.steps}), flush=True)
            del policy
    on, off = arms[True], arms[False]
    gaps = relative_gap(on["losses"], off["losses"])
    update_gap = float(np.linalg.norm(on["update"] - off["update"]) / max(np.linalg.norm(off["update"]), 1e-30))
    result = dict(
        run=str(run),
        day=args.day,
        model=args.model,
        examples=len(examples),
        steps=off["steps"],
        repeats=args.repeats,
        response_tokens=off["response_tokens"],
        response_tokens_forwarded=on["response_tokens_forwarded"],
        seconds_trimmed=on["seconds"],
        seconds_whole=off["seconds"],
        speedup=round(float(np.median(np.array(off["seconds"]) / np.maximum(on["seconds"], 1e-9))), 3),
        first_loss_relative_gap=gaps[0] if gaps else None,
        max_loss_relative_gap=max(gaps) if gaps else None,
        update_relative_gap=update_gap,
        seconds=round(time.perf_counter() - started, 1),
    )
    finish("trim_speed", result, args.record)


if __name__ == "__main__":
    main()
