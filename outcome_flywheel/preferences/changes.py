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


def _text(value) -> str | None:
    """One spelling per value: Parquet gives 2.0 where the log gave 2 (a column with gaps is float)."""
    if value is None or (not isinstance(value, (list, dict)) and pd.isna(value)):
        return None
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def rows_digest(rows: pd.DataFrame, columns: Iterable[str] = tuple(DECISION_COLUMNS), key: str = "decision_id") -> str:
    """Digest of a partition's rows (default: decisions), the same for rows built from a log and
    the stored Parquet rows (dtypes and missing values normalised)."""
    if rows is None or rows.empty:
        return "empty"
    table = rows[list(columns)].sort_values(key)
    values = [[_text(v) for v in row] for row in table.itertuples(index=False)]
    return hashlib.sha256(json.dumps(values).encode()).hexdigest()[:16]


def changed_dates(
    log_rows: pd.DataFrame,
    stored: Callable[[str], pd.DataFrame],
    stored_dates: Iterable[str],
    columns: Iterable[str] = tuple(DECISION_COLUMNS),
    key: str = "decision_id",
) -> dict[str, tuple[str, str]]:
    """{date: (log digest, stored digest)} for every date (`decision_date`) whose log rows differ from
    the stored partition (`stored(date)`), over `columns`; `stored_dates` are the materialised
    partitions, so a date that lost all its rows counts too."""
    dates = set(log_rows["decision_date"]) if len(log_rows) else set()
    out = {}
    for day in sorted(dates | set(stored_dates)):
        log_digest = rows_digest(log_rows[log_rows["decision_date"] == day] if len(log_rows) else None, columns, key)
        stored_digest = rows_digest(stored(day), columns, key)
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
