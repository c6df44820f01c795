"""Where the operator audit log lives: the log people keep (FLYWHEEL_AUDIT_LOG; default the bundled
sample, never written) and the live log the service appends decisions to (FLYWHEEL_LIVE_AUDIT_LOG;
default `<FLYWHEEL_DATA_DIR>/decisions/audit_log.jsonl`). The assets read both as one log, the live
one after, so a decision posted later wins over an older line with its id."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from outcome_flywheel.jsonl_log import append_unless
from outcome_flywheel.preferences.audit_log import AuditRecord, ParsedLog, canonical, parse_sources
from outcome_flywheel.settings import SAMPLE_DATA, resolve_path

BUNDLED_AUDIT_LOG = SAMPLE_DATA / "audit_log.jsonl"
LIVE_LOG = ("decisions", "audit_log.jsonl")


class DecisionConflict(ValueError):
    """A decision id already in the log with a different body (the service's 409)."""

    def __init__(self, decision_id: str, existing: str):
        super().__init__(f"decision_id {decision_id!r} is already in the audit log with a different body")
        self.decision_id = decision_id
        self.existing = existing


@dataclass
class AuditLog:
    """The JSONL audit log of operator decisions (one JSON object a line), and the live log after it."""

    path: str = field(
        default=str(BUNDLED_AUDIT_LOG), metadata={"help": "FLYWHEEL_AUDIT_LOG: path of the JSONL audit log."}
    )
    live_path: str = field(
        default="",
        metadata={
            "help": "FLYWHEEL_LIVE_AUDIT_LOG: where the service appends decisions, read after "
            "the audit log; empty = <data_dir>/decisions/audit_log.jsonl (none without a data_dir)."
        },
    )
    data_dir: str = field(default="", metadata={"help": "FLYWHEEL_DATA_DIR, the default live log's home."})

    @property
    def file(self) -> Path:
        return resolve_path(self.path)

    @property
    def live_file(self) -> Path | None:
        if self.live_path:
            return resolve_path(self.live_path)
        return resolve_path(self.data_dir).joinpath(*LIVE_LOG) if self.data_dir else None

    def sources(self) -> list[Path]:
        """The files read, in order (the live log once, and only when it exists and is another file)."""
        files = [self.file]
        live = self.live_file
        if live is not None and live.exists() and live.resolve() != self.file.resolve():
            files.append(live)
        return files

    def describe(self) -> str:
        return " + ".join(str(p) for p in self.sources())

    def parse(self) -> ParsedLog:
        if not self.file.exists():
            raise FileNotFoundError(f"audit log {self.file} does not exist (FLYWHEEL_AUDIT_LOG)")
        files = self.sources()
        handles = [open(p, encoding="utf-8", errors="replace") for p in files]
        try:
            return parse_sources([(str(p), h) for p, h in zip(files, handles)])
        finally:
            for h in handles:
                h.close()

    def append(self, record: AuditRecord) -> Literal["created", "unchanged"]:
        """Append one decision to the live log, durably (locked, one write, fsync) and only if new:
        the same body under a known id is a no-op (`unchanged`); a different body raises
        `DecisionConflict`. The check reads both logs under the live log's lock, so two racing posts
        of one id cannot both be written."""
        live = self.live_file
        if live is None:
            raise ValueError("no live audit log: set FLYWHEEL_LIVE_AUDIT_LOG or FLYWHEEL_DATA_DIR")
        if live.resolve() == BUNDLED_AUDIT_LOG.resolve():
            raise ValueError(f"the live audit log must not be the bundled sample {BUNDLED_AUDIT_LOG}")
        body = canonical(record)
        found: dict[str, str] = {}

        def existing(live_lines: list[str]) -> str | None:
            sources = (
                []
                if live.resolve() == self.file.resolve() or not self.file.exists()
                else [(str(self.file), self.file.read_text(encoding="utf-8", errors="replace").splitlines())]
            )
            parsed = parse_sources(sources + [(str(live), live_lines)])
            for _, kept in parsed.records:
                if kept.decision_id == record.decision_id:
                    found["body"] = canonical(kept)
                    return "exists"
            return None

        if append_unless(live, record.model_dump_json(), existing) is None:
            return "created"
        if found["body"] == body:
            return "unchanged"
        raise DecisionConflict(record.decision_id, found["body"])
