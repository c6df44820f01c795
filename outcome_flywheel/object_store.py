"""Where the warehouse's Parquet files live: a folder on this machine or an S3 (or S3-compatible) bucket.

Both are pyarrow filesystems under a root; a file is named by its key below that root
(`rollouts/date=2025-11-03/part.parquet`). Writes hand over a finished Parquet file's bytes:

- a folder: temp file in the same folder, fsync, rename (`storage.atomic_write_bytes`);
- S3: one upload of the finished bytes. pyarrow's S3 output stream makes the object visible only
  when it is closed (one PUT, or the completion of a multipart upload), but it closes on every exit:
  a `with` block that raises, or a stream dropped unclosed, publishes what was written so far
  (checked on SeaweedFS 4.48 with pyarrow 26). So no Parquet writer ever streams into it: the file
  is built in memory and the stream is opened for the finished bytes only, written in one call and
  closed. An exception while the file is made uploads nothing; a failed part fails the close, which
  then does not complete the upload; a process killed during the upload leaves no object (an
  interrupted PUT or an uncompleted multipart upload is never visible); a re-run's upload replaces
  the object whole. pyarrow has no abort in Python: were the one write call itself to raise (out of
  memory), the stream's destructor would still close it.

Credentials are AWS's own variables (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN,
or ~/.aws), read by pyarrow; the region is AWS_REGION (default us-east-1). Nothing secret is kept
in the project's settings, and a subprocess that inherits the environment sees the same bucket.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterable, TypeVar
from urllib.parse import urlsplit

import duckdb
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from outcome_flywheel.settings import s3_endpoint_problem, warehouse_url_problem

T = TypeVar("T")
S3_PREFIX = "s3://"
DEFAULT_REGION = "us-east-1"


@dataclass(frozen=True)
class StoredFile:
    """One file of the warehouse: its key below the warehouse root, where it is (a local path or an
    s3:// URL), its size and when it was last written (S3 keeps whole seconds)."""

    key: str
    location: str
    size: int
    mtime_ns: int


def is_s3_url(url: str) -> bool:
    return url.lower().startswith(S3_PREFIX)


def split_s3_url(url: str) -> tuple[str, str]:
    """`s3://bucket/some/prefix` -> ("bucket", "some/prefix"); a clear ValueError for anything else."""
    problem = warehouse_url_problem(url)
    if problem or not is_s3_url(url):
        raise ValueError(f"FLYWHEEL_WAREHOUSE_URL={url!r}: {problem or 'not an s3:// URL'}")
    bucket, _, prefix = url[len(S3_PREFIX) :].partition("/")
    return bucket, prefix.strip("/")


def s3_filesystem(endpoint: str = "") -> pafs.S3FileSystem:
    """pyarrow's S3 client for AWS (no endpoint) or an S3-compatible server (`http://host:port`)."""
    options = {"region": os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or DEFAULT_REGION}
    if endpoint:
        problem = s3_endpoint_problem(endpoint)
        if problem:
            raise ValueError(f"FLYWHEEL_S3_ENDPOINT={endpoint!r}: {problem}")
        parts = urlsplit(endpoint)
        options.update(endpoint_override=parts.netloc, scheme=parts.scheme.lower())
    return pafs.S3FileSystem(**options)


class ArrowStore:
    """Files under `root` on a pyarrow filesystem, named by their keys below it."""

    # Files read at once by `map` (a table's partitions): one for a local disk, more where each read
    # is a request whose time is mostly waiting.
    parallel_reads = 1

    def __init__(self, fs: pafs.FileSystem, root: str):
        self.fs = fs
        self.root = root.rstrip("/")

    def map(self, fn: Callable[[str], T], keys: Iterable[str]) -> list[T]:
        """`fn` over `keys`, in order, `parallel_reads` at a time (pyarrow releases the GIL)."""
        keys = list(keys)
        if self.parallel_reads <= 1 or len(keys) <= 1:
            return [fn(k) for k in keys]
        with ThreadPoolExecutor(max_workers=min(self.parallel_reads, len(keys))) as pool:
            return list(pool.map(fn, keys))

    # -- names -----------------------------------------------------------------------------
    def _full(self, key: str) -> str:
        return f"{self.root}/{key}" if self.root else key

    def location(self, key: str) -> str:
        """Where the file is, as people (and DuckDB's read_parquet) name it."""
        return self._full(key)

    @property
    def url(self) -> str:
        return self.root

    # -- writes ------------------------------------------------------------------------------
    def write_bytes(self, key: str, data: bytes) -> None:
        raise NotImplementedError

    def delete(self, key: str) -> None:
        try:
            self.fs.delete_file(self._full(key))
        except FileNotFoundError:
            pass

    # -- reads -------------------------------------------------------------------------------
    def read_table(self, key: str) -> pa.Table | None:
        """The Parquet file's table; None when there is no such file."""
        try:
            with self.fs.open_input_file(self._full(key)) as fh:
                return pq.read_table(fh)
        except FileNotFoundError:
            return None

    def num_rows(self, key: str) -> int:
        """Rows of a Parquet file from its footer (no column is read)."""
        with self.fs.open_input_file(self._full(key)) as fh:
            return pq.read_metadata(fh).num_rows

    def stat(self, key: str) -> StoredFile | None:
        info = self.fs.get_file_info(self._full(key))
        return self._stored(info) if info.type == pafs.FileType.File else None

    def list(self, folder: str = "") -> list[StoredFile]:
        """Every file below `folder` (a key prefix ending at a folder), sorted by key."""
        base = self._full(folder.strip("/")) if folder else self.root
        selector = pafs.FileSelector(base, recursive=True, allow_not_found=True)
        try:
            infos = self.fs.get_file_info(selector)
        except FileNotFoundError:  # some stores report a missing bucket or folder this way
            return []
        return sorted((self._stored(i) for i in infos if i.type == pafs.FileType.File), key=lambda f: f.key)

    def _stored(self, info: pafs.FileInfo) -> StoredFile:
        key = info.path[len(self.root) + 1 :] if self.root else info.path
        return StoredFile(
            key=key, location=self.location(key), size=int(info.size or 0), mtime_ns=int(info.mtime_ns or 0)
        )

    # -- DuckDB ------------------------------------------------------------------------------
    def register(self, con: duckdb.DuckDBPyConnection) -> None:
        """Let `con` read this store's locations (nothing to do for local files)."""


class S3Store(ArrowStore):
    """Objects under `s3://bucket/prefix`, on AWS or an S3-compatible server (FLYWHEEL_S3_ENDPOINT)."""

    parallel_reads = 16

    def __init__(self, url: str, endpoint: str = ""):
        bucket, prefix = split_s3_url(url)
        self.bucket, self.prefix, self.endpoint = bucket, prefix, endpoint
        super().__init__(s3_filesystem(endpoint), f"{bucket}/{prefix}" if prefix else bucket)

    def location(self, key: str) -> str:
        return S3_PREFIX + self._full(key)

    @property
    def url(self) -> str:
        return S3_PREFIX + self.root

    def write_bytes(self, key: str, data: bytes) -> None:
        """Upload a finished file: the object appears whole under `key` when the upload completes,
        replacing any older one, or not at all (see the module's note)."""
        try:
            stream = self.fs.open_output_stream(self._full(key))
            # One call between open and close: with background writes (pyarrow's default) a failed
            # part surfaces at close, which then does not complete the upload.
            stream.write(data)
            stream.close()
        except OSError as err:
            raise OSError(f"cannot write {self.location(key)} ({self._where()}): {err}") from err

    def _where(self) -> str:
        return f"endpoint {self.endpoint or 'AWS'}, bucket {self.bucket!r}; the bucket must exist and AWS_ACCESS_KEY_ID may write to it"

    def register(self, con: duckdb.DuckDBPyConnection) -> None:
        """Register this bucket's client as DuckDB's `s3://` filesystem on `con` (fsspec's wrapper around
        pyarrow's client: no httpfs extension, which DuckDB would otherwise try to download)."""
        from fsspec.implementations.arrow import ArrowFSWrapper

        wrapper = ArrowFSWrapper(self.fs)
        # The filesystem belongs to the database, which DuckDB shares between connections to one file.
        if "s3" in con.list_filesystems():
            con.unregister_filesystem("s3")
        con.register_filesystem(wrapper)
