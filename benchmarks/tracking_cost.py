"""What MLflow tracking costs a day of the daily loop on this box, as a share of the day's wall time (goal <= 2%).

A day of tiny-local with training (the previous day is run first, untimed) is materialised with the embedded
store (`sqlite:///<data>/mlflow/mlflow.db`); the day's record (`day_record.record_day`: params, per-step
metrics, the day's figures, the checkpoint's artifact, the registry's mirror) is timed whole. Also measured:
importing mlflow in a fresh interpreter (paid once per step process with the subprocess runner; once per
run process in-process) and creating the store (its schema migrations, once per data dir), reported apart.
The last line is one JSON object.

    python -m benchmarks.tracking_cost [--headlines 10] [--rollouts 4] [--max-new-tokens 48]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from benchmarks._daily_common import archive_days, resources, tiny_local_data_dir
from benchmarks._results import add_record_argument, finish

GOAL_PCT = 2.0


def import_seconds() -> float:
    code = "import time; t = time.perf_counter(); from mlflow import MlflowClient; print(time.perf_counter() - t)"
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def run(headlines: int = 10, rollouts: int = 4, max_new_tokens: int = 48) -> dict:
    import dagster as dg

    import outcome_flywheel.daily_rl.day_step as day_step
    from assets.daily_rl.daily_update import daily_update
    from assets.daily_rl.headlines import headlines as headlines_asset
    from outcome_flywheel.tracking import Tracker

    root = tiny_local_data_dir()
    tracker = Tracker(data_dir=str(root))
    res = {**resources(root, headlines), "tracking": tracker}
    config = {
        "ops": {"daily_update": {"config": {"rollouts_per_headline": rollouts, "max_new_tokens": max_new_tokens}}}
    }
    started = time.perf_counter()
    with tracker.start("daily_rl", "store") as warm:  # makes the store: a one-off per data dir
        pass
    store_s = time.perf_counter() - started
    assert warm.error is None, warm.error

    recorded: list[float] = []
    record_day = day_step.record_day

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return record_day(*args, **kwargs)
        finally:
            recorded.append(time.perf_counter() - t0)

    day_step.record_day = timed
    try:
        first, second = archive_days(2)
        assert dg.materialize(
            [headlines_asset, daily_update], partition_key=first, resources=res, run_config=config
        ).success
        assert dg.materialize([headlines_asset], partition_key=second, resources=res).success
        t0 = time.perf_counter()
        result = dg.materialize([daily_update], partition_key=second, resources=res, run_config=config)
        day_s = time.perf_counter() - t0
    finally:
        day_step.record_day = record_day
    assert result.success
    meta = {
        k: getattr(v, "value", v)
        for e in result.get_asset_materialization_events()
        if e.asset_key.to_user_string() == "policy_checkpoint"
        for k, v in e.materialization.metadata.items()
    }
    assert meta.get("mlflow_record") == "recorded", meta
    record_s, imported_s = recorded[-1], import_seconds()
    return {
        "benchmark": "tracking_cost",
        "day": second,
        "headlines": headlines,
        "rollouts_per_headline": rollouts,
        "max_new_tokens": max_new_tokens,
        "steps": int(meta.get("steps", 0)),
        "day_wall_s": round(day_s, 2),
        "record_s": round(record_s, 3),
        "mlflow_calls_s": float(meta.get("mlflow_seconds", 0.0)),
        "share_pct": round(100 * record_s / day_s, 2),
        "mlflow_import_s": round(imported_s, 2),
        "share_with_import_pct": round(100 * (record_s + imported_s) / day_s, 2),
        "store_create_s": round(store_s, 2),
        "goal_pct": GOAL_PCT,
        "within_goal": 100 * record_s / day_s <= GOAL_PCT,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--headlines", type=int, default=10)
    parser.add_argument("--rollouts", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    add_record_argument(parser)
    args = parser.parse_args()
    out = run(args.headlines, args.rollouts, args.max_new_tokens)
    print(
        f"day {out['day']}: {out['day_wall_s']} s wall, {out['steps']} optimiser steps; record {out['record_s']} s "
        f"({out['share_pct']}%), mlflow import {out['mlflow_import_s']} s ({out['share_with_import_pct']}% with it), "
        f"store made once in {out['store_create_s']} s"
    )
    finish("tracking_cost", out, args.record)


if __name__ == "__main__":
    main()
