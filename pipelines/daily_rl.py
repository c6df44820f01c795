"""Daily outcome RL: headlines -> 8 rollouts -> next-day judge ranks -> GSPO -> dated checkpoints.

Backfills must be *asset* backfills (UI: select the assets, Materialize, pick a date range; or
GraphQL `launchPartitionBackfill`): they honour the self-dependency of `daily_update` and run the
days in order. A job backfill ignores it and runs days in parallel.
"""

import dagster as dg

from assets.daily_rl.daily_report import daily_report
from assets.daily_rl.daily_update import daily_update
from assets.daily_rl.headlines import headlines
from assets.partitions import daily_partitions
from resources.daily_rl import FeedsResource, JudgeResource

daily_rl_job = dg.define_asset_job(
    "daily_rl_job",
    selection=dg.AssetSelection.groups("daily_rl"),
    partitions_def=daily_partitions,
    description="One day of the loop: headlines, daily_update (score, train, generate), daily_report.",
)

# 06:00 in FLYWHEEL_TIMEZONE (the partitions' timezone), for the day that has just ended.
daily_rl_schedule = dg.build_schedule_from_partitioned_job(daily_rl_job, hour_of_day=6, minute_of_hour=0)


def daily_rl_resources() -> dict:
    return {"feeds": FeedsResource.from_env(), "judge": JudgeResource.from_env()}


defs = dg.Definitions(
    assets=[headlines, daily_update, daily_report],
    jobs=[daily_rl_job],
    schedules=[daily_rl_schedule],
    resources=daily_rl_resources(),
)
