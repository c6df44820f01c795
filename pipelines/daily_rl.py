"""Daily outcome RL: headlines -> 8 rollouts -> next-day judge ranks -> GSPO -> dated checkpoints.

Backfills must be *asset* backfills (UI: select the assets, Materialize, pick a date range; or
GraphQL `launchPartitionBackfill`): they honour the self-dependency of `daily_update` and run the
days in order. A job backfill ignores it and runs days in parallel.
"""

from datetime import datetime, timezone

import dagster as dg

from assets.daily_rl.backtest import backtest
from assets.daily_rl.baseline import baseline_rollouts
from assets.daily_rl.daily_report import daily_report
from assets.daily_rl.daily_update import daily_update
from assets.daily_rl.distillation import distill_samples, distilled_policy
from assets.daily_rl.headlines import headlines
from assets.daily_rl.note_scorer import note_scorer
from assets.daily_rl.outcomes import rollout_outcomes
from assets.daily_rl.pairs import rollout_pairs
from assets.daily_rl.policy_eval import policy_eval
from assets.partitions import daily_rl_partitions
from outcome_flywheel.daily_rl.distillation.step import ready_to_distill
from outcome_flywheel.daily_rl.notes.outcomes import pending_days_ready
from outcome_flywheel.storage import Warehouse
from resources.daily_rl import FeedsResource, JudgeResource

DAILY_RL_ASSETS = [
    headlines,
    daily_update,
    rollout_pairs,
    baseline_rollouts,
    rollout_outcomes,
    policy_eval,
    backtest,
    daily_report,
]

daily_rl_job = dg.define_asset_job(
    "daily_rl_job",
    selection=dg.AssetSelection.groups("daily_rl"),
    partitions_def=daily_rl_partitions,
    description="One day of the loop: headlines, daily_update (score yesterday's notes, train, gate, generate), rollout_pairs, "
    "baseline_rollouts, rollout_outcomes, policy_eval, backtest, daily_report, note_scorer. Several days: use an asset backfill (it runs "
    "them in order), not a backfill of this job.",
)

daily_rl_outcomes_job = dg.define_asset_job(
    "daily_rl_outcomes_job",
    selection=dg.AssetSelection.assets(rollout_outcomes, policy_eval, backtest, daily_report),
    partitions_def=daily_rl_partitions,
    description="Re-evaluate a day once its calls can mature: rollout_outcomes, policy_eval, backtest, daily_report.",
)


@dg.schedule(
    job=daily_rl_outcomes_job,
    cron_schedule="30 17 * * 1-5",  # after the NYSE close (and its 13:00 half days)
    execution_timezone="America/New_York",
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Re-runs the evaluation of every day whose pending call outcomes can now mature (their exit session has closed).",
)
def daily_rl_outcomes_schedule(context: dg.ScheduleEvaluationContext, warehouse: dg.ResourceParam[Warehouse]):
    now = context.scheduled_execution_time or datetime.now(timezone.utc)
    keys = set(daily_rl_partitions.get_partition_keys(current_time=now))
    ready = [d for d in pending_days_ready(warehouse.read_all("rollout_outcomes"), now) if d in keys]
    if not ready:
        return dg.SkipReason("no pending call outcome can mature yet")
    return [
        dg.RunRequest(
            run_key=f"pending-{d}-{now:%Y-%m-%d}",
            partition_key=d,
            tags={"flywheel/reason": "pending call outcomes may mature"},
        )
        for d in ready
    ]


# 06:00 in FLYWHEEL_TIMEZONE (the partitions' timezone), for the day that has just ended.
daily_rl_schedule = dg.build_schedule_from_partitioned_job(
    daily_rl_job,
    hour_of_day=6,
    minute_of_hour=0,
    default_status=dg.DefaultScheduleStatus.STOPPED,
    description="Every day at 06:00 (FLYWHEEL_TIMEZONE): daily_rl_job for the day that has just ended. Off by default: "
    "the embedded defaults read the bundled feed archive (November 2025), which has no feeds for yesterday, so every "
    "tick would fail the minimum_headlines check; and each day trains the previous day's checkpoint, so the days "
    "before must be materialised first. Turn it on once FLYWHEEL_FEED_URLS is set and the days up to yesterday "
    "are materialised (asset backfill).",
)


# Tier 3 (docs/tiers.md, "Distillation"): a day's teacher samples, and a gated SFT run once enough are new.
distill_samples_job = dg.define_asset_job(
    "distill_samples_job",
    selection=dg.AssetSelection.assets(distill_samples),
    partitions_def=daily_rl_partitions,
    description="The teacher answers a day's sampled headlines; with the day's verified corrections, distill_samples(D).",
)
distillation_job = dg.define_asset_job(
    "distillation_job",
    selection=dg.AssetSelection.assets(distilled_policy),
    description="One distillation run: SFT in phases on the unused samples, the daily gate, a verified checkpoint, `latest` moved if accepted.",
)


@dg.sensor(
    job=distillation_job,
    minimum_interval_seconds=300,
    default_status=dg.DefaultSensorStatus.STOPPED,
    description="Starts distillation_job when at least FLYWHEEL_DISTILL_MIN_SAMPLES (default 100) distillation samples "
    "no run has used exist.",
)
def distillation_sensor(context: dg.SensorEvaluationContext, warehouse: dg.ResourceParam[Warehouse]):
    ready, count, need = ready_to_distill(warehouse)
    if not ready:
        return dg.SkipReason(f"{count} new distillation samples, fewer than {need}")
    return dg.RunRequest(
        run_key=f"distill-{count}-{warehouse.partitions('distill_samples')[-1]}",
        tags={"flywheel/reason": f"{count} new distillation samples (>= {need})"},
    )


def daily_rl_resources() -> dict:
    return {"feeds": FeedsResource.from_env(), "judge": JudgeResource.from_env()}


defs = dg.Definitions(
    assets=dg.with_source_code_references(
        [*DAILY_RL_ASSETS, note_scorer, distill_samples, distilled_policy]
    ),  # tiers: docs/tiers.md
    jobs=[daily_rl_job, daily_rl_outcomes_job, distill_samples_job, distillation_job],
    sensors=[distillation_sensor],
    schedules=[daily_rl_schedule, daily_rl_outcomes_schedule],
    resources=daily_rl_resources(),
)
