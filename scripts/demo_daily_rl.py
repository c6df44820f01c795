"""Demo of the daily loop: the first few days of the bundled feed archive, in order, on the
embedded defaults (tiny-local), as runs of the code location's `daily_rl_job` (one per day),
recorded in a Dagster instance so they show in the UI (job page, timeline, re-execute).

    python -m scripts.demo_daily_rl [--days 3]      (uses $DAGSTER_HOME's instance)

Assumes `base_model` is materialised (tiny-local built into $FLYWHEEL_DATA_DIR/models/).
"""

from __future__ import annotations

import argparse
import json

import dagster as dg

from outcome_flywheel.daily_rl.report.summary import prices_note
from outcome_flywheel.market_data import BUNDLED_PRICES
from outcome_flywheel.settings import SAMPLE_DATA, env, resolve_path
from outcome_flywheel.storage import Warehouse
from pipelines.launch import IN_PROCESS, run_job
from scripts import QUIET_CONSOLE

DEMO_MAX_NEW_TOKENS = 96  # tiny-local's notes end within ~80 tokens; keeps `make demo` to minutes
DEMO_MAX_HEADLINES = 12  # of the archive's ~30 a day; FLYWHEEL_MAX_HEADLINES (or max_headlines=None) for all


def archive_days(days: int) -> list[str]:
    folder = SAMPLE_DATA / "feeds_archive"
    return sorted(p.name for p in folder.iterdir() if p.is_dir())[:days]


def demo_run_config(max_headlines: int | None = DEMO_MAX_HEADLINES) -> dict:
    """The demo's smaller days as run config (shown in the UI's launchpad, reused by a re-execution)."""
    config: dict = {
        "ops": {"daily_update": {"config": {"max_new_tokens": DEMO_MAX_NEW_TOKENS}}},
        **QUIET_CONSOLE,
        **IN_PROCESS,
    }
    if max_headlines is not None:
        config["resources"] = {"feeds": {"config": {"max_headlines": max_headlines}}}
    return config


def run(instance: dg.DagsterInstance, days: int = 3, max_headlines: int | None = DEMO_MAX_HEADLINES) -> dict:
    """Run `daily_rl_job` (headlines, daily_update, daily_report) for the first `days` archive days, in order."""
    run_config = demo_run_config(max_headlines)
    warehouse = Warehouse.from_env()  # plain values: the resources may hold EnvVars
    summary: dict = {"days": []}
    for day in archive_days(days):
        result = run_job("daily_rl_job", instance, partition_key=day, run_config=run_config)
        report = warehouse.read("daily_report", day).iloc[0]
        training = warehouse.read("policy_training", day).iloc[0]
        summary["days"].append(
            dict(
                date=day,
                run_id=result.run_id,
                headlines=int(report["headlines"]),
                rollouts=int(report["rollouts"]),
                usable_share=_num(report["usable_share"]),
                mean_structure=_num(report["mean_structure"]),
                mean_reward=_num(report["reward_avg"]),
                train_loss=_num(report["loss"]),
                steps=int(report["steps"]),
                kl_to_base=_num(report["kl_to_base"]),
                policy_version=str(training["policy_version"]),
                gate=str(training["gate"]),
                gate_reason=str(training["gate_reason"]),
            )
        )
    summary["latest_checkpoint"] = str(warehouse.path("checkpoints", "policy", "latest"))
    last = summary["days"][-1]["date"] if summary["days"] else None
    if last:
        summary["ab_vs_base"] = ab_summary(warehouse.read("policy_eval", last))
        summary["backtest"] = backtest_summary(warehouse.read("backtest_summary", last))
    summary["prices"] = prices_line()
    return summary


def prices_line() -> str:
    """What the outcome figures can show on the prices this run reads: on the bundled real closes no
    edge is expected (and the summary says so); a world file is synthetic."""
    prices_file = resolve_path(env("FLYWHEEL_PRICES_FILE", str(BUNDLED_PRICES)))
    return prices_note(env("FLYWHEEL_MARKET_DATA", "file"), str(prices_file), str(BUNDLED_PRICES))


def ab_summary(evals) -> dict:
    """The last day's A/B: each metric's policy and base values, interval of the difference and label."""
    return {
        r.metric: dict(
            policy=_num(r.policy),
            base=_num(r.base),
            ci=[_num(r.ci_low), _num(r.ci_high)],
            n=int(r.n),
            label=r.label,
            status=r.status,
        )
        for r in evals.itertuples(index=False)
    }


def backtest_summary(summary) -> dict:
    """The back-test over the matured days: returns, the excess over the base with its interval, the labels."""
    if summary.empty:
        return {}
    s = summary.iloc[0]
    keys = (
        "days",
        "policy_total_return_pct",
        "base_total_return_pct",
        "spy_total_return_pct",
        "mean_excess_vs_base_pct",
        "excess_vs_base_ci_low",
        "excess_vs_base_ci_high",
        "policy_hit_rate",
        "policy_sharpe",
        "policy_max_drawdown_pct",
    )
    out = {k: _num(s[k]) for k in keys}
    out["days"] = int(s["days"])
    out.update(label_vs_base=s["label_vs_base"], label_vs_spy=s["label_vs_spy"])
    return out


def _num(value):
    value = float(value)
    return round(value, 4) if value == value else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--days", type=int, default=3)
    parser.add_argument("--max-headlines", type=int, default=DEMO_MAX_HEADLINES)
    args = parser.parse_args()
    with dg.DagsterInstance.get() as instance:
        print(json.dumps(run(instance, args.days, args.max_headlines), indent=1))


if __name__ == "__main__":
    main()
