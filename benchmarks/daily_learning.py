"""Does the daily loop learn, and is the trained policy better than the base? Runs 6-10 days of the
bundled archive on tiny-local through the real assets (the whole daily_rl group, in order) and
compares the last day's rollouts with the first day's (base policy) by Welch's t-test on the
structure score, and the reward of the last scored day vs the first scored day. Then the A/B of
the last day (policy vs the frozen base on the same prompts and seeds: structure, judge win rate,
price hit rate and mean vs SPY, each with its 95% interval and label) and the back-test over all
matured days.

    python -m benchmarks.daily_learning [--days 8] [--headlines 16] [--objective token] [--learning-rate 2e-3]

`--objective` is GSPOConfig's: `token` (the default) trains every signal; a sequence-level one (`gspo`,
`reward_weighted`) trains whole-note signals only, so the call's signals (price, relevance) get weight 0 with it.
"""

from __future__ import annotations

import argparse
import json
import time

from scipy import stats as scipy_stats

from benchmarks._daily_common import archive_days, resources, tiny_local_data_dir
from benchmarks._results import add_record_argument, finish


def run(
    days: int = 8,
    headlines: int = 16,
    objective: str = "token",
    learning_rate: float = 2e-3,
    max_new_tokens: int = 128,
    data_dir: str | None = None,
) -> dict:
    import dagster as dg

    from pipelines.daily_rl import DAILY_RL_ASSETS

    root = tiny_local_data_dir(data_dir)
    res = resources(root, headlines)
    warehouse = res["warehouse"]
    settings = {"objective": objective, "learning_rate": learning_rate, "max_new_tokens": max_new_tokens}
    if objective != "token":  # a sequence-level objective trains whole-note signals only (day_settings.check_objective)
        from outcome_flywheel.daily_rl.reward.signals import SIGNAL_SPANS, RewardConfig

        weights = dict(RewardConfig().weights)
        settings["reward_weights"] = {k: (w if SIGNAL_SPANS[k] == "note" else 0.0) for k, w in weights.items()}
    config = {"ops": {"daily_update": {"config": settings}}}
    per_day = []
    started = time.perf_counter()
    for day in archive_days(days):
        t0 = time.perf_counter()
        result = dg.materialize(DAILY_RL_ASSETS, partition_key=day, resources=res, run_config=config)
        assert result.success
        rollouts = warehouse.read("rollouts", day)
        scores = warehouse.read("rollout_scores", day)
        training = warehouse.read("policy_training", day).iloc[0]
        row = dict(
            date=day,
            rollouts=len(rollouts),
            mean_structure=round(float(rollouts["structure_score"].mean()), 4),
            full_structure_share=round(float((rollouts["structure_score"] == 1.0).mean()), 4),
            finished_share=round(float(rollouts["finished"].mean()), 4),
            mean_reward=round(float(scores["reward"].mean()), 4) if len(scores) else None,
            usable_share=round(float(scores["usable"].mean()), 4) if len(scores) else None,
            steps=int(training["steps"]),
            loss=round(float(training["loss"]), 5) if training["trained"] else None,
            kl=round(float(training["kl_to_base"]), 5),
            clip_fraction=round(float(training["clip_fraction"]), 3) if training["trained"] else None,
            gate=str(training["gate"]),
            seconds=round(time.perf_counter() - t0, 1),
        )
        per_day.append(row)
        print(json.dumps(row))
    first_day, last_day = per_day[0]["date"], per_day[-1]["date"]
    first = warehouse.read("rollouts", first_day)["structure_score"].to_numpy()
    last = warehouse.read("rollouts", last_day)["structure_score"].to_numpy()
    t_struct = scipy_stats.ttest_ind(last, first, equal_var=False)
    first_scored, last_scored = per_day[1]["date"], per_day[-1]["date"]
    r_first = warehouse.read("rollout_scores", first_scored)["reward"].to_numpy()
    r_last = warehouse.read("rollout_scores", last_scored)["reward"].to_numpy()
    t_reward = scipy_stats.ttest_ind(r_last, r_first, equal_var=False)
    from outcome_flywheel.daily_rl.reward.rollout_scores import position_bias

    bias = position_bias(warehouse.read_all("rollout_scores"))  # the judge's, over every scored day
    ab = {
        r.metric: dict(
            policy=_round(r.policy),
            base=_round(r.base),
            difference=_round(r.difference),
            ci=[_round(r.ci_low), _round(r.ci_high)],
            n=int(r.n),
            label=r.label,
            test=r.test,
            status=r.status,
        )
        for r in warehouse.read("policy_eval", last_day).itertuples(index=False)
    }
    bt = warehouse.read("backtest_summary", last_day).iloc[0].to_dict()
    backtest = {k: (_round(v) if isinstance(v, float) else v) for k, v in bt.items() if k != "bootstrap_method"}
    summary = dict(
        benchmark="daily_learning",
        days=len(per_day),
        headlines_per_day=headlines,
        objective=objective,
        learning_rate=learning_rate,
        first_day=first_day,
        last_day=last_day,
        structure_first_mean=round(float(first.mean()), 4),
        structure_last_mean=round(float(last.mean()), 4),
        structure_welch_t=round(float(t_struct.statistic), 3),
        structure_p=float(t_struct.pvalue),
        reward_first_mean=round(float(r_first.mean()), 4),
        reward_last_mean=round(float(r_last.mean()), 4),
        reward_welch_t=round(float(t_reward.statistic), 3),
        reward_p=float(t_reward.pvalue),
        learned=bool(last.mean() > first.mean() and t_struct.pvalue < 0.05),
        judge_mean_rank_by_shown_position=bias["by_shown_position"],
        judge_mean_rank_by_rollout_index=bias["by_rollout_index"],
        ab_last_day=ab,
        backtest=backtest,
        final_kl=per_day[-1]["kl"],
        final_finished_share=per_day[-1]["finished_share"],
        wall_s=round(time.perf_counter() - started, 1),
        data_dir=str(root),
    )
    print(
        f"structure score: first day {summary['structure_first_mean']} -> last day {summary['structure_last_mean']}, "
        f"Welch t={summary['structure_welch_t']}, p={summary['structure_p']:.3g}"
    )
    print(
        f"reward (scored days {first_scored} -> {last_scored}): {summary['reward_first_mean']} -> "
        f"{summary['reward_last_mean']}, Welch t={summary['reward_welch_t']}, p={summary['reward_p']:.3g}"
    )
    for metric, row in ab.items():
        print(
            f"A/B {last_day} {metric}: policy {row['policy']} vs base {row['base']}, 95% interval {row['ci']} (n={row['n']}): "
            f"{row['label']} [{row['test']}; {row['status']}]"
        )
    print(
        f"back-test over {backtest['days']} matured days: policy {backtest['policy_total_return_pct']}% vs base "
        f"{backtest['base_total_return_pct']}% vs SPY {backtest['spy_total_return_pct']}%; mean daily excess over the base "
        f"{backtest['mean_excess_vs_base_pct']} pp [{backtest['excess_vs_base_ci_low']}, {backtest['excess_vs_base_ci_high']}]: "
        f"{backtest['label_vs_base']}; vs SPY: {backtest['label_vs_spy']}"
    )
    return summary


def _round(value):
    value = float(value)
    return round(value, 4) if value == value else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--days", type=int, default=8)
    parser.add_argument("--headlines", type=int, default=16)
    parser.add_argument("--objective", default="token", choices=["token", "gspo", "reward_weighted"])
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--data-dir", default=None)
    add_record_argument(parser)
    args = parser.parse_args()
    summary = run(args.days, args.headlines, args.objective, args.learning_rate, args.max_new_tokens, args.data_dir)
    finish("daily_learning", summary, args.record)


if __name__ == "__main__":
    main()
