"""Which decision partitions the audit log has changed since they were materialised: what the
service's `/api/preferences/extract` launches. A partition's content is its rows (every column of
`records_frame`, ids sorted) as canonical JSON; a date whose log rows differ from the stored
partition's (new, edited or moved decisions) has changed."""

from __future__ import annotations

import hashlib
import json
from typing import Callable, Iterable

import pandas as pd

from outcome_flywheel.preferences.audit_log import DECISION_COLUMNS


def rows_digest(rows: pd.DataFrame) -> str:
    """Digest of a partition's decisions, the same for the log's rows and the stored Parquet rows
    (dtypes and missing values normalised)."""
    if rows is None or rows.empty:
        return "empty"
    table = rows[list(DECISION_COLUMNS)].sort_values("decision_id")
    values = [[None if pd.isna(v) else str(v) for v in row] for row in table.itertuples(index=False)]
    return hashlib.sha256(json.dumps(values).encode()).hexdigest()[:16]


def changed_dates(log_rows: pd.DataFrame, stored: Callable[[str], pd.DataFrame], stored_dates: Iterable[str]) -> dict[str, tuple[str, str]]:
    """{date: (log digest, stored digest)} for every date whose log rows differ from the stored
    partition (`stored(date)`); `stored_dates` are the materialised partitions, so a date that lost
    all its decisions counts too."""
    dates = set(log_rows["decision_date"]) if len(log_rows) else set()
    out = {}
    for day in sorted(dates | set(stored_dates)):
        log_digest = rows_digest(log_rows[log_rows["decision_date"] == day] if len(log_rows) else None)
        stored_digest = rows_digest(stored(day))
        if log_digest != stored_digest:
            out[day] = (log_digest, stored_digest)
    return out


def contiguous_ranges(days: Iterable[str]) -> list[tuple[str, str]]:
    """Sorted days as (first, last) runs of consecutive calendar days: one Dagster run each."""
    ranges: list[list] = []
    for day in sorted(set(days)):
        current = pd.Timestamp(day)
        if ranges and (current - pd.Timestamp(ranges[-1][1])).days == 1:
            ranges[-1][1] = day
        else:
            ranges.append([day, day])
    return [tuple(r) for r in ranges]
