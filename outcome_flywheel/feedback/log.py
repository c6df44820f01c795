"""Append-only JSON Lines logs written by people through the service: durable appends (an exclusive
lock, one write, fsync, then the caller may acknowledge) and a tolerant reader that quarantines bad
lines with the reason instead of failing the day. Used by the note-feedback log and the operator
decision log."""

from __future__ import annotations

import fcntl
import json
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import pandas as pd
from pydantic import BaseModel, ValidationError

from outcome_flywheel.feedback.curation import feedback_table
from outcome_flywheel.feedback.records import FeedbackRecord, VerificationRecord
from outcome_flywheel.settings import resolve_path

KINDS: dict[str, type[BaseModel]] = {"feedback": FeedbackRecord, "verification": VerificationRecord}


@dataclass
class FeedbackLog:
    """Where the note-feedback log lives (the service appends, the `note_feedback` asset reads)."""

    path: str = field(default="", metadata={"help": "FLYWHEEL_FEEDBACK_LOG: the JSONL feedback log; empty = <FLYWHEEL_DATA_DIR>/feedback/note_feedback.jsonl."})
    data_dir: str = field(default="./data", metadata={"help": "FLYWHEEL_DATA_DIR, the default log's home."})

    @property
    def file(self) -> Path:
        return resolve_path(self.path) if self.path else resolve_path(self.data_dir) / "feedback" / "note_feedback.jsonl"

    def read(self) -> "ParsedFeedbackLog":
        return read_feedback_log(self.file)

    def table(self) -> pd.DataFrame:
        """One row per feedback with its latest verdict (`curation.feedback_table`)."""
        parsed = self.read()
        return feedback_table(parsed.feedback, parsed.verifications)

    def append(self, record: BaseModel) -> None:
        append_record(self.file, record)


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


def write_line(fd: int, line: str) -> None:
    """One whole line in one write, then fsync: once this returns, the line survives a crash."""
    data = (line.rstrip("\n") + "\n").encode("utf-8")
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
        with open(path, encoding="utf-8") as f:
            reason = existing(f.read().splitlines())
        if reason is None:
            write_line(fd, line)
        return reason


@dataclass
class ParsedFeedbackLog:
    feedback: list[FeedbackRecord] = field(default_factory=list)
    verifications: list[VerificationRecord] = field(default_factory=list)
    quarantine: list[dict] = field(default_factory=list)  # line, raw, reason
    lines: int = 0


def _reason(err: ValidationError) -> str:
    first = err.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ())) or "line"
    return f"{where}: {first.get('msg', 'invalid')}"


def read_feedback_log(path: Path) -> ParsedFeedbackLog:
    """Every line validated: feedback, verifications, and the rest quarantined with the reason
    (counts: lines = feedback + verifications + quarantined, blank lines aside)."""
    out = ParsedFeedbackLog()
    if not Path(path).exists():
        return out
    for number, raw in enumerate(Path(path).read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
        if not raw.strip():
            continue
        out.lines += 1
        try:
            obj = json.loads(raw)
        except ValueError as err:
            out.quarantine.append({"line": number, "raw": raw[:2000], "reason": f"not JSON: {err.msg}"})
            continue
        kind = obj.get("kind") if isinstance(obj, dict) else None
        if kind not in KINDS:
            out.quarantine.append({"line": number, "raw": raw[:2000], "reason": f"unknown kind {kind!r}"})
            continue
        try:
            record = KINDS[kind].model_validate(obj)
        except ValidationError as err:
            out.quarantine.append({"line": number, "raw": raw[:2000], "reason": _reason(err)})
            continue
        (out.feedback if kind == "feedback" else out.verifications).append(record)
    return out
