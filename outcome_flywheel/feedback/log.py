"""The note-feedback log: JSON Lines written by people through the service, appended durably
(`outcome_flywheel.jsonl_log`: lock, one write, fsync) and read by a tolerant reader that
quarantines bad lines with the reason instead of failing the day."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from pydantic import BaseModel, ValidationError

from outcome_flywheel.feedback.curation import feedback_table
from outcome_flywheel.feedback.records import FeedbackRecord, VerificationRecord
from outcome_flywheel.jsonl_log import append_record
from outcome_flywheel.settings import resolve_path

KINDS: dict[str, type[BaseModel]] = {"feedback": FeedbackRecord, "verification": VerificationRecord}


@dataclass
class FeedbackLog:
    """Where the note-feedback log lives (the service appends, the `note_feedback` asset reads)."""

    path: str = field(
        default="",
        metadata={
            "help": "FLYWHEEL_FEEDBACK_LOG: the JSONL feedback log; empty = <FLYWHEEL_DATA_DIR>/feedback/note_feedback.jsonl."
        },
    )
    data_dir: str = field(default="./data", metadata={"help": "FLYWHEEL_DATA_DIR, the default log's home."})

    @property
    def file(self) -> Path:
        return (
            resolve_path(self.path) if self.path else resolve_path(self.data_dir) / "feedback" / "note_feedback.jsonl"
        )

    def read(self) -> "ParsedFeedbackLog":
        return read_feedback_log(self.file)

    def table(self) -> pd.DataFrame:
        """One row per feedback with its latest verdict (`curation.feedback_table`)."""
        parsed = self.read()
        return feedback_table(parsed.feedback, parsed.verifications)

    def append(self, record: BaseModel) -> None:
        append_record(self.file, record)


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
