"""Daily outcome RL: headlines -> 8 rollouts -> next-day judge ranks -> GSPO -> dated checkpoints.

Backfills must be *asset* backfills (UI: select the assets, Materialize, pick a date range; or
GraphQL `launchPartitionBackfill`): they honour the self-dependency of `daily_update` and run the
days in order. A job backfill ignores it and runs days in parallel.
"""

import dagster as dg

from assets.daily_rl.daily_report import daily_report
from assets.daily_rl.daily_update import daily_update
from assets.daily_rl.headlines import headlines
from assets.partitions import daily_rl_partitions
from resources.daily_rl import FeedsResource, JudgeResource

daily_rl_job = dg.define_asset_job(
    "daily_rl_job",
    selection=dg.AssetSelection.groups("daily_rl"),
    partitions_def=daily_rl_partitions,
    description="One day of the loop: headlines, daily_update (score yesterday's notes, train, generate), daily_report. "
    "Several days: use an asset backfill (it runs them in order), not a backfill of this job.",
)

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


def daily_rl_resources() -> dict:
    return {"feeds": FeedsResource.from_env(), "judge": JudgeResource.from_env()}


defs = dg.Definitions(
    assets=dg.with_source_code_references([headlines, daily_update, daily_report]),
    jobs=[daily_rl_job],
    schedules=[daily_rl_schedule],
    resources=daily_rl_resources(),
)
