"""Where the operator audit log lives (FLYWHEEL_AUDIT_LOG; default the bundled sample)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from outcome_flywheel.preferences.audit_log import ParsedLog, parse_file
from outcome_flywheel.settings import SAMPLE_DATA, resolve_path

BUNDLED_AUDIT_LOG = SAMPLE_DATA / "audit_log.jsonl"


@dataclass
class AuditLog:
    """The JSONL audit log of operator decisions (one JSON object a line)."""

    path: str = field(default=str(BUNDLED_AUDIT_LOG), metadata={"help": "FLYWHEEL_AUDIT_LOG: path of the JSONL audit log."})

    @property
    def file(self) -> Path:
        return resolve_path(self.path)

    def parse(self) -> ParsedLog:
        if not self.file.exists():
            raise FileNotFoundError(f"audit log {self.file} does not exist (FLYWHEEL_AUDIT_LOG)")
        return parse_file(self.file)
