"""Daily partitions, one definition per area, each spanning the days that area can have data for.

One calendar day in FLYWHEEL_TIMEZONE per partition, so the UI's partition bars and "% filled"
count days that can have data, not empty months:

- first partition: the area's own variable (`FLYWHEEL_DAILY_RL_START_DATE`,
  `FLYWHEEL_PREFERENCES_START_DATE`), else `FLYWHEEL_START_DATE` (both areas), else the first day
  of the bundled data (feed archive: 2025-11-03; audit log: 2025-06-03);
- last partition: the daily loop in archive mode (FLYWHEEL_FEED_URLS unset) ends with the archive's
  last day folder, since no other day has feeds; live feeds and the preferences run up to today.
"""

from __future__ import annotations

import re
from datetime import date, timedelta

import dagster as dg

from outcome_flywheel.daily_rl.feeds.source import DEFAULT_ARCHIVE
from outcome_flywheel.settings import env, resolve_path

# The bundled data's first days: sample_data/feeds_archive/2025-11-03/ and the first decision of
# sample_data/audit_log.jsonl (2025-06-03, New York time).
DAILY_RL_FIRST_DAY = "2025-11-03"
PREFERENCES_FIRST_DAY = "2025-06-03"
_DAY = re.compile(r"\d{4}-\d{2}-\d{2}")


def start_date(area_variable: str, bundled_first_day: str) -> str:
    """The area's variable, else FLYWHEEL_START_DATE, else the bundled data's first day."""
    return env(area_variable, env("FLYWHEEL_START_DATE", bundled_first_day))


def archive_end_date(start: str) -> str | None:
    """Archive mode: the day after the archive's last YYYY-MM-DD folder (Dagster's end is exclusive);
    None in live mode, or when the archive has no day on or after `start`."""
    if env("FLYWHEEL_FEED_URLS", "").strip():
        return None
    folder = resolve_path(env("FLYWHEEL_FEEDS_ARCHIVE", DEFAULT_ARCHIVE))
    days = sorted(p.name for p in folder.iterdir() if p.is_dir() and _DAY.fullmatch(p.name)) if folder.is_dir() else []
    if not days or days[-1] < start:
        return None
    return (date.fromisoformat(days[-1]) + timedelta(days=1)).isoformat()


_daily_rl_start = start_date("FLYWHEEL_DAILY_RL_START_DATE", DAILY_RL_FIRST_DAY)

daily_rl_partitions = dg.DailyPartitionsDefinition(
    start_date=_daily_rl_start, end_date=archive_end_date(_daily_rl_start), timezone=env("FLYWHEEL_TIMEZONE")
)
"""Daily loop: one partition per news day (headlines of D, rollouts of D, scores of D-1's rollouts)."""

preference_partitions = dg.DailyPartitionsDefinition(
    start_date=start_date("FLYWHEEL_PREFERENCES_START_DATE", PREFERENCES_FIRST_DAY), timezone=env("FLYWHEEL_TIMEZONE")
)
"""Preference flywheel: one partition per decision date of the operator audit log."""
