"""One daily partition at full size on tiny-local: 30 headlines x 8 rollouts x 64 new tokens,
judge and training included. The previous day is run first (untimed) so the timed day has
240 rollouts to score and train on. Prints the time of each stage and tokens/s.

    python -m benchmarks.partition_speed [--headlines 30] [--rollouts 8] [--max-new-tokens 64]
"""

from __future__ import annotations

import argparse
import time

from benchmarks._daily_common import archive_days, resources, tiny_local_data_dir
from benchmarks._results import add_record_argument, finish

BUDGET_S = 180.0


def run(headlines: int = 30, rollouts: int = 8, max_new_tokens: int = 64) -> dict:
    import dagster as dg

    from assets.daily_rl.daily_update import daily_update
    from assets.daily_rl.headlines import headlines as headlines_asset

    root = tiny_local_data_dir()
    res = resources(root, headlines)
    config = {
        "ops": {"daily_update": {"config": {"rollouts_per_headline": rollouts, "max_new_tokens": max_new_tokens}}}
    }
    first, second = archive_days(2)
    assert dg.materialize(
        [headlines_asset, daily_update], partition_key=first, resources=res, run_config=config
    ).success
    # the timed partition: headlines, then score + train + generate
    started = time.perf_counter()
    assert dg.materialize([headlines_asset], partition_key=second, resources=res).success
    headlines_s = time.perf_counter() - started
    t0 = time.perf_counter()
    assert dg.materialize(
        [headlines_asset, daily_update],
        partition_key=second,
        resources=res,
        run_config=config,
        selection=[daily_update],
    ).success
    update_s = time.perf_counter() - t0
    total_s = time.perf_counter() - started
    row = res["warehouse"].read("policy_training", second).iloc[0]
    summary = dict(
        benchmark="partition_speed",
        date=second,
        headlines=int(row["headlines"]),
        rollouts=int(row["rollouts"]),
        scored=int(row["scored"]),
        max_new_tokens=max_new_tokens,
        train_examples=int(row["examples"]),
        train_steps=int(row["steps"]),
        headlines_s=round(headlines_s, 2),
        score_s=round(float(row["score_s"]), 2),
        train_s=round(float(row["train_s"]), 2),
        generate_s=round(float(row["generate_s"]), 2),
        kl_s=round(float(row["kl_s"]), 2),
        daily_update_s=round(update_s, 2),
        total_s=round(total_s, 2),
        generated_tokens=int(row["generated_tokens"]),
        generate_tokens_per_s=round(float(row["generated_tokens"]) / float(row["generate_s"]), 1),
        under_budget=bool(total_s < BUDGET_S),
        budget_s=BUDGET_S,
    )
    for stage in ("headlines_s", "score_s", "train_s", "generate_s", "kl_s", "total_s"):
        print(f"{stage:>12}: {summary[stage]:8.2f}")
    print(f"generated {summary['generated_tokens']} tokens at {summary['generate_tokens_per_s']} tokens/s")
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--headlines", type=int, default=30)
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    add_record_argument(parser)
    args = parser.parse_args()
    finish("partition_speed", run(args.headlines, args.rollouts, args.max_new_tokens), args.record)


if __name__ == "__main__":
    main()
