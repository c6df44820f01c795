"""The preference pair pool's safety (docs/tiers.md, "Safety"): a cap on its size, and a backup
taken before a training that is restored if the training fails.

- `cap_pool`: at most `POOL_CAP` (5,000) pairs; the oldest decisions are dropped first (by
  `decision_date`, then `decision_id`), and how many were dropped is returned (the asset's metadata).
- `pool_backup`: the table's rows copied to the table `backups_<table>`, partition `run=<label>` (through `Warehouse`)
  before the body runs; if the body raises, the table is written back from the copy, so a failed
  training never leaves the pool changed or half-written. The copy is removed after a success.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import pandas as pd

from outcome_flywheel.storage import Warehouse

POOL_CAP = 5_000


def cap_pool(pairs: pd.DataFrame, cap: int = POOL_CAP, order: tuple[str, ...] = ("decision_date", "decision_id")) -> tuple[pd.DataFrame, int]:
    """(the newest `cap` pairs in their original order, how many older ones were dropped)."""
    if cap < 1:
        raise ValueError(f"the pair pool cap must be at least 1, got {cap}")
    if len(pairs) <= cap:
        return pairs, 0
    keys = [c for c in order if c in pairs.columns]
    newest = pairs.sort_values(keys, kind="stable").tail(cap).index if keys else pairs.index[-cap:]
    kept = pairs.loc[pairs.index.isin(newest)]
    return kept, len(pairs) - len(kept)


@contextmanager
def pool_backup(warehouse: Warehouse, table: str, label: str) -> Iterator[pd.DataFrame]:
    """Back `table` up before the body (yields the backed-up rows); restore it if the body raises."""
    backup_table = f"backups_{table}"
    rows = warehouse.read(table) if warehouse.exists(table) else None
    if rows is not None:
        warehouse.write(backup_table, rows, partition=label, key="run")
    try:
        yield rows if rows is not None else pd.DataFrame()
    except BaseException:
        if rows is not None:
            warehouse.write(table, warehouse.read(backup_table, label, key="run"))
        raise
    if rows is not None:
        warehouse.delete(backup_table, label, key="run")
