"""Parquet warehouse with DuckDB views on top.

Layout (FLYWHEEL_WAREHOUSE_URL, default `$FLYWHEEL_DATA_DIR/warehouse`: a folder or s3://bucket/prefix):
    <warehouse>/<table>/date=YYYY-MM-DD/part.parquet   one file per partition (partitioned tables)
    <warehouse>/<table>/all/part.parquet               unpartitioned tables
    $FLYWHEEL_DATA_DIR/warehouse.duckdb                 one view per table, over its Parquet files (always local)

A partition write replaces the partition's file atomically (a folder: temp file in the same folder,
then `os.replace`; S3: one upload of the finished file, see `object_store`), so a re-run gives the
same rows and a crash never leaves a half-written file (the temp file of a write killed midway is
removed by the next write of that partition). Checkpoints, adapters, models, exports and
reports stay under the data dir, a local or mounted folder (`Warehouse.path`): their `latest`
pointers are symlinks swapped by rename, which object storage has no equivalent of.
DuckDB allows one writer process per file: connections to `warehouse.duckdb` are opened for a
single statement batch and closed, and wait (with backoff) while another process holds the file.
A view is created once per table per process; a view update that still finds the file locked
only warns, since the Parquet files are the data.
Reads never touch that file: they go to the Parquet files through an in-memory DuckDB.
"""

from __future__ import annotations

import fcntl
import glob
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
from typing import Iterable, Iterator

import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from outcome_flywheel.object_store import ArrowStore, S3Store, StoredFile, is_s3_url
from outcome_flywheel.settings import env, resolve_path, s3_endpoint_problem, warehouse_url_problem

_TABLE_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_UNPARTITIONED = "all"
# Views this process has already created: a view globs every partition of its table, so it only
# has to be made once per table, not on every partition write.
_VIEWS_MADE: set[tuple[Path, str]] = set()


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temp file in the same folder and a rename. The temp file is
    locked (flock) from its creation to the rename, so a write removes the temp files of earlier
    writes of `path` whose writer was killed (nothing holds their lock), never a live writer's."""
    fd, tmp = _locked_temp(path)
    try:
        _remove_abandoned_temps(path, tmp)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
            os.replace(tmp, path)  # before the lock goes with the file's closing
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _locked_temp(path: Path) -> tuple[int, str]:
    """A new temp file beside `path` (`.<name>.<random>.tmp`), locked by this process."""
    for _ in range(5):
        path.parent.mkdir(parents=True, exist_ok=True)
        try:  # a delete may remove the empty folder between the two calls (`LocalStore.delete`): make it again
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        except FileNotFoundError:
            continue
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            if os.path.samestat(os.fstat(fd), os.stat(tmp)):
                return fd, tmp
        except FileNotFoundError:  # another write took it for a killed writer's in the instant before the lock
            pass
        os.close(fd)
    raise FileNotFoundError(f"could not make a temp file beside {path}")


def _remove_abandoned_temps(path: Path, own: str) -> None:
    """Remove the temp files of `path` no live writer holds (left by a write killed midway)."""
    for tmp in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        if str(tmp) == own:
            continue
        try:
            fd = os.open(tmp, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: a live writer's
            if os.path.samestat(os.fstat(fd), os.stat(tmp)):  # not renamed into place meanwhile
                tmp.unlink()
        except OSError:
            pass
        finally:
            os.close(fd)


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


class LocalStore(ArrowStore):
    """Parquet files in a folder of this machine (or a mounted one)."""

    def __init__(self, folder: Path):
        super().__init__(pafs.LocalFileSystem(), folder.as_posix())
        self.folder = folder

    def write_bytes(self, key: str, data: bytes) -> None:
        atomic_write_bytes(self.folder / key, data)

    def delete(self, key: str) -> None:
        """Remove the file, then its partition folder and its table folder once they are empty (a
        folder holds nothing else: no empty `run=...` or `date=...` folders stay behind)."""
        path = self.folder / key
        path.unlink(missing_ok=True)
        for folder in path.parents:
            if self.folder not in folder.parents:  # up to the warehouse's own folder, never it
                break
            try:
                folder.rmdir()  # only an empty one; a writer's temp file or another partition keeps it
            except OSError:
                break


@dataclass
class Warehouse:
    """Parquet files per table and partition (a folder, by default `$FLYWHEEL_DATA_DIR/warehouse`, or
    an S3 bucket), DuckDB views over them; checkpoints, adapters and models under the data dir."""

    data_dir: str = field(
        default="./data",
        metadata={
            "help": "Root of all project data (FLYWHEEL_DATA_DIR): warehouse.duckdb, models, checkpoints, adapters, exports, reports; a local or mounted folder."
        },
    )
    warehouse_url: str = field(
        default="",
        metadata={
            "help": "Where the Parquet tables live (FLYWHEEL_WAREHOUSE_URL): empty = <data_dir>/warehouse, a folder path, or s3://bucket/prefix."
        },
    )
    s3_endpoint: str = field(
        default="",
        metadata={
            "help": "http(s)://host[:port] of an S3-compatible server for an s3:// warehouse (FLYWHEEL_S3_ENDPOINT); empty = AWS. Credentials: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, region AWS_REGION (default us-east-1)."
        },
    )
    lock_wait_s: float = field(
        default=30.0, metadata={"help": "How long to wait for another process's lock on warehouse.duckdb."}
    )

    def __post_init__(self) -> None:
        for name, problem in (
            ("warehouse_url", warehouse_url_problem(self.warehouse_url)),
            ("s3_endpoint", s3_endpoint_problem(self.s3_endpoint)),
        ):
            if problem:
                raise ValueError(f"Warehouse {name}={getattr(self, name)!r}: {problem}")
        self._store: ArrowStore | None = None  # made on first use: loading the definitions never reaches S3

    @classmethod
    def from_env(cls) -> "Warehouse":
        """The warehouse of FLYWHEEL_DATA_DIR, FLYWHEEL_WAREHOUSE_URL and FLYWHEEL_S3_ENDPOINT (command-line
        tools and subprocesses; the Dagster resource reads the same variables)."""
        return cls(
            data_dir=env("FLYWHEEL_DATA_DIR"),
            warehouse_url=env("FLYWHEEL_WAREHOUSE_URL", ""),
            s3_endpoint=env("FLYWHEEL_S3_ENDPOINT", ""),
        )

    def environment(self) -> dict[str, str]:
        """The variables that make `Warehouse.from_env()` in another process this warehouse (a Pipes
        subprocess, a worker); AWS credentials are the environment's own and are inherited as they are."""
        return {
            "FLYWHEEL_DATA_DIR": str(self.root),
            "FLYWHEEL_WAREHOUSE_URL": self.url if self.on_s3 else str(self.store.folder),
            "FLYWHEEL_S3_ENDPOINT": self.s3_endpoint,
        }

    # -- where things are ----------------------------------------------------------------
    @property
    def root(self) -> Path:
        """The data dir, a local or mounted folder."""
        return resolve_path(self.data_dir)

    @property
    def on_s3(self) -> bool:
        return is_s3_url(self.warehouse_url)

    @property
    def store(self) -> ArrowStore:
        """Where the Parquet files are: a `LocalStore` folder or an `S3Store` bucket."""
        if self._store is None:
            if self.on_s3:
                self._store = S3Store(self.warehouse_url, self.s3_endpoint)
            else:
                self._store = LocalStore(
                    resolve_path(self.warehouse_url) if self.warehouse_url else self.root / "warehouse"
                )
        return self._store

    @property
    def url(self) -> str:
        """Where the tables are: a folder path or s3://bucket/prefix."""
        return self.store.url

    @property
    def duckdb_path(self) -> Path:
        return self.root / "warehouse.duckdb"

    def path(self, *parts: str) -> Path:
        """A path under the data dir, never on object storage: checkpoints, adapters, models, exports,
        reports, raw feeds (folders swapped by rename and `latest` symlinks need a filesystem)."""
        return self.root.joinpath(*parts)

    def partition_key(self, table: str, partition: str | None = None, key: str = "date") -> str:
        """The partition file's key below the warehouse root, e.g. `rollouts/date=2025-11-03/part.parquet`."""
        if not _TABLE_NAME.match(table):
            raise ValueError(f"table name {table!r} must be lower_snake_case")
        folder = _UNPARTITIONED if partition is None else f"{key}={partition}"
        return f"{table}/{folder}/part.parquet"

    def location(self, table: str, partition: str | None = None, key: str = "date") -> str:
        """Where the partition's file is: a local path or an s3:// URL."""
        return self.store.location(self.partition_key(table, partition, key))

    def partition_file(self, table: str, partition: str | None = None, key: str = "date") -> Path:
        """The partition's file in a local warehouse (`location` / `stat` work for both kinds)."""
        if self.on_s3:
            raise ValueError(
                f"the warehouse is on object storage ({self.url}): no local file for {table}; use location() or stat()"
            )
        return Path(self.location(table, partition, key))

    # -- writes --------------------------------------------------------------------------
    def write(self, table: str, df: pd.DataFrame, partition: str | None = None, key: str = "date") -> Path | str:
        """Replace the rows of one partition (or the whole unpartitioned table), atomically; returns where."""
        arrow = pa.Table.from_pandas(df.reset_index(drop=True), preserve_index=False)
        sink = pa.BufferOutputStream()
        pq.write_table(arrow, sink)
        return self._publish(table, partition, key, sink.getvalue())

    def write_batches(
        self, table: str, frames: Iterable[pd.DataFrame], partition: str | None = None, key: str = "date"
    ) -> Path | str:
        """Replace a partition with rows that come in batches (one Parquet row group each, same columns),
        published only once the last batch is in: a producer that fails midway leaves the old partition."""
        sink, writer = pa.BufferOutputStream(), None
        for frame in frames:
            batch = pa.Table.from_pandas(frame.reset_index(drop=True), preserve_index=False)
            writer = writer or pq.ParquetWriter(sink, batch.schema)
            writer.write_table(batch)
        if writer is None:
            raise ValueError(
                f"no batches for {table} {partition or ''}: write an empty frame with write() to empty a partition"
            )
        writer.close()
        return self._publish(table, partition, key, sink.getvalue())

    def _publish(self, table: str, partition: str | None, key: str, data: pa.Buffer) -> Path | str:
        name = self.partition_key(table, partition, key)
        self.store.write_bytes(name, data)
        if (self.duckdb_path, table) not in _VIEWS_MADE or not self.duckdb_path.exists():
            try:
                self.refresh_view(table)
            except duckdb.IOException as err:
                # The Parquet file is the data and is written; the view globs every partition, so
                # it exists already or the next write makes it. Never fail a long step over it.
                logging.getLogger(__name__).warning(
                    "view %s not refreshed (%s is locked): %s", table, self.duckdb_path, err
                )
        return self.store.location(name) if self.on_s3 else Path(self.store.location(name))

    def delete(self, table: str, partition: str | None = None, key: str = "date") -> None:
        self.store.delete(self.partition_key(table, partition, key))
        self.refresh_view(table)

    # -- reads ---------------------------------------------------------------------------
    def exists(self, table: str, partition: str | None = None, key: str = "date") -> bool:
        return self.stat(table, partition, key) is not None

    def stat(self, table: str, partition: str | None = None, key: str = "date") -> StoredFile | None:
        """The partition's file (location, size, time written), or None."""
        return self.store.stat(self.partition_key(table, partition, key))

    def read(self, table: str, partition: str | None = None, key: str = "date") -> pd.DataFrame:
        """One partition's rows (or the unpartitioned table); an empty frame when absent."""
        rows = self.find(table, partition, key)
        return pd.DataFrame() if rows is None else rows

    def find(self, table: str, partition: str | None = None, key: str = "date") -> pd.DataFrame | None:
        """One partition's rows, or None when there is no such partition (one read: no `exists` first)."""
        arrow = self.store.read_table(self.partition_key(table, partition, key))
        return None if arrow is None else arrow.to_pandas()

    def read_all(self, table: str) -> pd.DataFrame:
        """Every partition of a table, in partition order."""
        frames = [
            t.to_pandas()
            for t in self.store.map(self.store.read_table, (f.key for f in self.files(table)))
            if t is not None
        ]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    def count_rows(self, table: str) -> int:
        """Rows over every partition of a table, from the Parquet footers (no column is read)."""
        return sum(self.store.map(self.store.num_rows, (f.key for f in self.files(table))))

    def files(self, table: str) -> list[StoredFile]:
        """The table's partition files (key, location, size, time written), in partition order."""
        self.partition_key(table)  # checks the name
        return [f for f in self.store.list(table) if _is_partition_file(f.key)]

    def partitions(self, table: str) -> list[str]:
        """Partition values present, sorted (e.g. dates)."""
        return [f.key.split("/")[1].split("=", 1)[1] for f in self.files(table) if "=" in f.key.split("/")[1]]

    def query(self, sql: str, **params) -> pd.DataFrame:
        """Run SQL in an in-memory DuckDB where every table is a view over its Parquet files.

        It never opens `warehouse.duckdb`, so it can run beside a writer.
        """
        with duckdb.connect(":memory:") as con:
            self.store.register(con)
            for table in self.tables():
                con.execute(f"CREATE VIEW {table} AS {self._view_select(table)}")
            return con.execute(sql, params or None).df()

    def tables(self) -> list[str]:
        """Tables with at least one partition file (one listing of the whole warehouse)."""
        return sorted(
            {
                f.key.split("/")[0]
                for f in self.store.list()
                if _is_partition_file(f.key) and _TABLE_NAME.match(f.key.split("/")[0])
            }
        )

    # -- DuckDB views --------------------------------------------------------------------
    def _view_select(self, table: str) -> str:
        glob = self.store.location(f"{table}/*/part.parquet").replace("'", "''")
        return f"SELECT * FROM read_parquet('{glob}', union_by_name = true, hive_partitioning = false)"

    @contextmanager
    def connect(self, read_only: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
        """A short-lived connection to `warehouse.duckdb` (with the S3 filesystem registered for an s3://
        warehouse); waits up to `lock_wait_s` while another process holds it."""
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
            self.store.register(con)
            yield con
        finally:
            con.close()

    def refresh_view(self, table: str) -> None:
        """(Re)create the view named after the table; drop it when the table has no files."""
        key = (self.duckdb_path, table)
        has_files = bool(self.files(table))
        with self.connect() as con:
            if has_files:
                con.execute(f"CREATE OR REPLACE VIEW {table} AS {self._view_select(table)}")
                _VIEWS_MADE.add(key)
            else:
                con.execute(f"DROP VIEW IF EXISTS {table}")
                _VIEWS_MADE.discard(key)


def _is_partition_file(key: str) -> bool:
    """`<table>/<partition folder>/part.parquet`; temp files and hidden folders are not."""
    parts = key.split("/")
    return len(parts) == 3 and parts[2] == "part.parquet" and not parts[1].startswith(".")
