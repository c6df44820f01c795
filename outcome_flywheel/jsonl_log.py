"""Durable appends to a JSON Lines log that people write through the service (the note-feedback log,
the live operator-decision log): an exclusive lock, one write, fsync, and only then may the caller
acknowledge. Shared by the feedback and preferences areas, so it lives below both."""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from pydantic import BaseModel


@contextmanager
def locked(path: Path) -> Iterator[int]:
    """An exclusive lock on `path` (created if missing), held for the block: appends and
    read-then-append checks of one log are serialised across threads and processes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def torn_tail(fd: int) -> bool:
    """True when the file ends in a partial line (a writer died mid-write, or someone appended by hand
    without a newline)."""
    size = os.fstat(fd).st_size
    return size > 0 and os.pread(fd, 1, size - 1) != b"\n"


def write_line(fd: int, line: str) -> None:
    """One whole line in one write, then fsync: once this returns, the line survives a crash.
    A torn last line is ended first, so the new line never joins it: the torn part stays a line of
    its own (the readers quarantine it) and the acknowledged line stays whole and readable."""
    data = (line.rstrip("\n") + "\n").encode("utf-8")
    if torn_tail(fd):
        data = b"\n" + data
    written = os.write(fd, data)
    if written != len(data):  # a regular file under O_APPEND takes it whole, or the disk is full
        raise OSError(f"short write: {written} of {len(data)} bytes")
    os.fsync(fd)


def append_record(path: Path, record: BaseModel) -> None:
    with locked(path) as fd:
        write_line(fd, record.model_dump_json())


def append_unless(path: Path, line: str, existing: Callable[[list[str]], str | None]) -> str | None:
    """Append `line` unless `existing(lines already in the log)` returns a reason not to (returned,
    nothing written). Read and append happen under one lock, so two racing writers cannot both pass."""
    with locked(path) as fd:
        with open(path, encoding="utf-8", errors="replace") as f:
            reason = existing(f.read().splitlines())
        if reason is None:
            write_line(fd, line)
        return reason
