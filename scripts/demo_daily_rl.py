"""Demo of the daily loop: the first few days of the bundled feed archive, in order, on the
embedded defaults (tiny-local), recorded in a Dagster instance so the runs show in the UI.

    python -m scripts.demo_daily_rl [--days 3]      (uses $DAGSTER_HOME's instance)

Assumes `base_model` is materialised (tiny-local built into $FLYWHEEL_DATA_DIR/models/).
"""

from __future__ import annotations

import argparse
import json

import dagster as dg

from outcome_flywheel.settings import SAMPLE_DATA, env
from outcome_flywheel.storage import Warehouse
from scripts import QUIET_CONSOLE

DEMO_MAX_NEW_TOKENS = 96  # tiny-local's notes end within ~80 tokens; keeps `make demo` to minutes
DEMO_MAX_HEADLINES = 12  # of the archive's ~30 a day; FLYWHEEL_MAX_HEADLINES (or max_headlines=None) for all


def archive_days(days: int) -> list[str]:
    folder = SAMPLE_DATA / "feeds_archive"
    return sorted(p.name for p in folder.iterdir() if p.is_dir())[:days]


def run(instance: dg.DagsterInstance, days: int = 3, max_headlines: int | None = DEMO_MAX_HEADLINES) -> dict:
    """Materialise headlines + daily_update + daily_report for the first `days` archive days in order."""
    from pipelines.daily_rl import daily_rl_job, daily_rl_resources, defs
    from pipelines.resources import core_resources
    from resources.daily_rl import FeedsResource

    resources = {**core_resources(), **daily_rl_resources()}
    if max_headlines is not None:
        resources["feeds"] = FeedsResource.from_env(max_headlines=max_headlines)
    job = dg.Definitions(assets=list(defs.assets), jobs=[daily_rl_job], resources=resources).resolve_job_def(daily_rl_job.name)
    run_config = {"ops": {"daily_update": {"config": {"max_new_tokens": DEMO_MAX_NEW_TOKENS}}}, **QUIET_CONSOLE}
    warehouse = Warehouse(data_dir=env("FLYWHEEL_DATA_DIR"))  # plain values: the resources may hold EnvVars
    summary: dict = {"days": []}
    for day in archive_days(days):
        result = job.execute_in_process(partition_key=day, instance=instance, run_config=run_config)
        if not result.success:
            raise RuntimeError(f"daily_rl_job failed for {day} (run {result.run_id})")
        report = warehouse.read("daily_report", day).iloc[0]
        training = warehouse.read("policy_training", day).iloc[0]
        summary["days"].append(dict(
            date=day, run_id=result.run_id, headlines=int(report["headlines"]), rollouts=int(report["rollouts"]),
            usable_share=_num(report["usable_share"]), mean_structure=_num(report["mean_structure"]),
            mean_reward=_num(report["reward_avg"]), train_loss=_num(report["loss"]), steps=int(report["steps"]),
            kl_to_base=_num(report["kl_to_base"]), policy_version=str(training["policy_version"]),
        ))
    summary["latest_checkpoint"] = str(warehouse.path("checkpoints", "policy", "latest"))
    return summary


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
