"""Parquet warehouse with DuckDB views on top.

Layout under `$FLYWHEEL_DATA_DIR`:
    warehouse/<table>/date=YYYY-MM-DD/part.parquet   one file per partition (partitioned tables)
    warehouse/<table>/all/part.parquet               unpartitioned tables
    warehouse.duckdb                                 one view per table, over its Parquet files

A partition write replaces the partition's file atomically (temp file in the same folder, then
`os.replace`), so a re-run gives the same rows and a crash never leaves a half-written file.
DuckDB allows one writer process per file: connections to `warehouse.duckdb` are opened for a
single statement batch and closed, and wait (with backoff) while another process holds the file.
A view is created once per table per process; a view update that still finds the file locked
only warns, since the Parquet files are the data.
Reads never touch that file: they go to the Parquet files through an in-memory DuckDB.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from outcome_flywheel.settings import env, resolve_path

_TABLE_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_UNPARTITIONED = "all"
# Views this process has already created: a view globs every partition of its table, so it only
# has to be made once per table, not on every partition write.
_VIEWS_MADE: set[tuple[str, str]] = set()


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temp file in the same folder and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_symlink(target: Path, link: Path) -> None:
    """Point `link` at `target` (e.g. a `latest` pointer) by renaming a fresh symlink over it."""
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = link.parent / f".{link.name}.{uuid.uuid4().hex}.tmp"
    rel = os.path.relpath(target, link.parent)
    os.symlink(rel, tmp)
    os.replace(tmp, link)


def publish_dir(staging: Path, final: Path) -> None:
    """Move a finished folder into place; an older folder at `final` is replaced whole."""
    final.parent.mkdir(parents=True, exist_ok=True)
    if final.exists():
        trash = final.parent / f".{final.name}.{uuid.uuid4().hex}.old"
        os.replace(final, trash)
        os.replace(staging, final)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(staging, final)


@dataclass
class Warehouse:
    """Parquet files per table and partition under `$FLYWHEEL_DATA_DIR/warehouse`, DuckDB views over them."""

    data_dir: str = field(default="./data", metadata={"help": "Root of all project data (FLYWHEEL_DATA_DIR)."})
    lock_wait_s: float = field(default=30.0, metadata={"help": "How long to wait for another process's lock on warehouse.duckdb."})

    @classmethod
    def from_env(cls) -> "Warehouse":
        """FLYWHEEL_DATA_DIR's warehouse (command-line tools; the Dagster resource reads the same variable)."""
        return cls(data_dir=env("FLYWHEEL_DATA_DIR"))

    # -- paths ---------------------------------------------------------------------------
    @property
    def root(self) -> Path:
        return resolve_path(self.data_dir)

    @property
    def warehouse_dir(self) -> Path:
        return self.root / "warehouse"

    @property
    def duckdb_path(self) -> Path:
        return self.root / "warehouse.duckdb"

    def path(self, *parts: str) -> Path:
        """A path under the data dir (checkpoints, adapters, raw feeds, figures...)."""
        return self.root.joinpath(*parts)

    def table_dir(self, table: str) -> Path:
        if not _TABLE_NAME.match(table):
            raise ValueError(f"table name {table!r} must be lower_snake_case")
        return self.warehouse_dir / table

    def partition_file(self, table: str, partition: str | None = None, key: str = "date") -> Path:
        folder = _UNPARTITIONED if partition is None else f"{key}={partition}"
        return self.table_dir(table) / folder / "part.parquet"

    # -- writes --------------------------------------------------------------------------
    def write(
        self, table: str, df: pd.DataFrame, partition: str | None = None, key: str = "date"
    ) -> Path:
        """Replace the rows of one partition (or the whole unpartitioned table), atomically."""
        target = self.partition_file(table, partition, key)
        arrow = pa.Table.from_pandas(df.reset_index(drop=True), preserve_index=False)
        sink = pa.BufferOutputStream()
        pq.write_table(arrow, sink)
        atomic_write_bytes(target, sink.getvalue().to_pybytes())
        if (str(self.duckdb_path), table) not in _VIEWS_MADE or not self.duckdb_path.exists():
            try:
                self.refresh_view(table)
            except duckdb.IOException as err:
                # The Parquet file is the data and is written; the view globs every partition, so
                # it exists already or the next write makes it. Never fail a long step over it.
                logging.getLogger(__name__).warning("view %s not refreshed (%s is locked): %s", table, self.duckdb_path, err)
        return target

    def delete(self, table: str, partition: str | None = None, key: str = "date") -> None:
        target = self.partition_file(table, partition, key)
        if target.exists():
            target.unlink()
        self.refresh_view(table)

    # -- reads ---------------------------------------------------------------------------
    def exists(self, table: str, partition: str | None = None, key: str = "date") -> bool:
        return self.partition_file(table, partition, key).exists()

    def read(self, table: str, partition: str | None = None, key: str = "date") -> pd.DataFrame:
        """One partition's rows (or the unpartitioned table); an empty frame when absent."""
        target = self.partition_file(table, partition, key)
        if not target.exists():
            return pd.DataFrame()
        return pq.read_table(target).to_pandas()

    def read_all(self, table: str) -> pd.DataFrame:
        """Every partition of a table, in partition order."""
        files = self.files(table)
        if not files:
            return pd.DataFrame()
        return pd.concat([pq.read_table(f).to_pandas() for f in files], ignore_index=True)

    def count_rows(self, table: str) -> int:
        """Rows over every partition of a table, from the Parquet footers (no column is read)."""
        return sum(pq.read_metadata(f).num_rows for f in self.files(table))

    def files(self, table: str) -> list[Path]:
        folder = self.table_dir(table)
        return sorted(folder.glob("*/part.parquet")) if folder.exists() else []

    def partitions(self, table: str) -> list[str]:
        """Partition values present on disk, sorted (e.g. dates)."""
        return [f.parent.name.split("=", 1)[1] for f in self.files(table) if "=" in f.parent.name]

    def query(self, sql: str, **params) -> pd.DataFrame:
        """Run SQL in an in-memory DuckDB where every table is a view over its Parquet files.

        It never opens `warehouse.duckdb`, so it can run beside a writer.
        """
        with duckdb.connect(":memory:") as con:
            for table in self.tables():
                con.execute(f"CREATE VIEW {table} AS {self._view_select(table)}")
            return con.execute(sql, params or None).df()

    def tables(self) -> list[str]:
        if not self.warehouse_dir.exists():
            return []
        return sorted(p.name for p in self.warehouse_dir.iterdir() if p.is_dir() and self.files(p.name))

    # -- DuckDB views --------------------------------------------------------------------
    def _view_select(self, table: str) -> str:
        glob = (self.table_dir(table) / "*" / "part.parquet").as_posix().replace("'", "''")
        return f"SELECT * FROM read_parquet('{glob}', union_by_name = true, hive_partitioning = false)"

    @contextmanager
    def connect(self, read_only: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
        """A short-lived connection to `warehouse.duckdb`; waits up to `lock_wait_s` while another
        process holds it."""
        self.root.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + self.lock_wait_s
        delay = 0.05
        while True:
            try:
                con = duckdb.connect(str(self.duckdb_path), read_only=read_only)
                break
            except duckdb.IOException:
                if time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
        try:
            yield con
        finally:
            con.close()

    def refresh_view(self, table: str) -> None:
        """(Re)create the view named after the table; drop it when the table has no files."""
        key = (str(self.duckdb_path), table)
        with self.connect() as con:
            if self.files(table):
                con.execute(f"CREATE OR REPLACE VIEW {table} AS {self._view_select(table)}")
                _VIEWS_MADE.add(key)
            else:
                con.execute(f"DROP VIEW IF EXISTS {table}")
                _VIEWS_MADE.discard(key)
