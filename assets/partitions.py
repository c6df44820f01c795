"""Daily partitions shared by both loops: one per calendar day in FLYWHEEL_TIMEZONE."""

import dagster as dg

from outcome_flywheel.settings import env

daily_partitions = dg.DailyPartitionsDefinition(
    start_date=env("FLYWHEEL_START_DATE"),
    timezone=env("FLYWHEEL_TIMEZONE"),
)
