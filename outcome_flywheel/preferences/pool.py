"""The preference pair pool's safety (docs/tiers.md, "Safety"): a cap on its size, and a backup
taken before a training that is restored if the training fails.

- `cap_pool`: at most `POOL_CAP` (5,000) pairs; the oldest decisions are dropped first (by
  `decision_date`, then `decision_id`), and how many were dropped is returned (the asset's metadata).
- `pool_backup`: the table's rows copied to the table `backups_<table>`, partition `run=<label>` (through `Warehouse`)
  before the body runs; if the body raises, the table is written back from the copy, so a failed
  training never leaves the pool changed or half-written. The copy is removed once it is not needed:
  after a success, and after the pool is written back.
- `restore_pool`: the same write-back for a step that was killed (SIGKILL, the out-of-memory killer)
  and so never ran its own: the `preference_adapter` asset calls it for its run once the step process
  has ended. A copy is left only by a step killed that way.
- A copy that even the asset could not restore (the run's own process was killed too) is found by
  the next `pool_backup` and removed: it holds the trainer lock, so the copy's run is over. The pool is
  kept as it is then: the pool is rebuilt from the decisions (`dpo_dataset`, which the training job
  runs first) and no training writes it, so a pool newer than the copy is the rebuilt one.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import pandas as pd

from outcome_flywheel.storage import Warehouse

POOL_CAP = 5_000
RUN_KEY = "run"


def backup_table(table: str) -> str:
    return f"backups_{table}"


def cap_pool(
    pairs: pd.DataFrame, cap: int = POOL_CAP, order: tuple[str, ...] = ("decision_date", "decision_id")
) -> tuple[pd.DataFrame, int]:
    """(the newest `cap` pairs in their original order, how many older ones were dropped)."""
    if cap < 1:
        raise ValueError(f"the pair pool cap must be at least 1, got {cap}")
    if len(pairs) <= cap:
        return pairs, 0
    keys = [c for c in order if c in pairs.columns]
    newest = pairs.sort_values(keys, kind="stable").tail(cap).index if keys else pairs.index[-cap:]
    kept = pairs.loc[pairs.index.isin(newest)]
    return kept, len(pairs) - len(kept)


def restore_pool(warehouse: Warehouse, table: str, label: str) -> bool:
    """Write `table` back from its copy of run `label`, then remove the copy; False when there is no
    copy (the run ended by itself: succeeded, or failed and restored it)."""
    backups = backup_table(table)
    if not warehouse.exists(backups, label, key=RUN_KEY):
        return False
    warehouse.write(table, warehouse.read(backups, label, key=RUN_KEY))
    warehouse.delete(backups, label, key=RUN_KEY)
    return True


def leftover_backups(warehouse: Warehouse, table: str) -> list[str]:
    """The runs whose copy of `table` is still there (each a run that was killed)."""
    return warehouse.partitions(backup_table(table))


def drop_leftover_backups(warehouse: Warehouse, table: str, log: Callable[[str], None] | None = None) -> list[str]:
    """Remove the copies older runs left (see the module's note); returns their runs. Call it holding
    the trainer lock: no copy's run can still be training then."""
    dropped = []
    backups = backup_table(table)
    for label in leftover_backups(warehouse, table):
        copy, pool = warehouse.stat(backups, label, key=RUN_KEY), warehouse.stat(table)
        newer = pool is not None and copy is not None and pool.mtime_ns > copy.mtime_ns
        warehouse.delete(backups, label, key=RUN_KEY)
        dropped.append(label)
        if log:
            log(
                f"removed {backups} run={label}, left by a killed run that nothing restored; {table} kept as it is "
                f"({'written after the copy: rebuilt since' if newer else 'not written since the copy: the same rows'})"
            )
    return dropped


@contextmanager
def pool_backup(
    warehouse: Warehouse, table: str, label: str, log: Callable[[str], None] | None = None
) -> Iterator[pd.DataFrame]:
    """Back `table` up before the body (yields the backed-up rows); restore it if the body raises.
    The copy is gone when the body ends either way; copies older runs left are removed first."""
    drop_leftover_backups(warehouse, table, log)
    backups = backup_table(table)
    rows = warehouse.read(table) if warehouse.exists(table) else None
    if rows is not None:
        warehouse.write(backups, rows, partition=label, key=RUN_KEY)
    try:
        yield rows if rows is not None else pd.DataFrame()
    except BaseException:
        if rows is not None:
            restore_pool(warehouse, table, label)
        raise
    if rows is not None:
        warehouse.delete(backups, label, key=RUN_KEY)
