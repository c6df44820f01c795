"""Where the operator audit log lives (FLYWHEEL_AUDIT_LOG; default the bundled sample)."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
from pydantic import Field

from assets.flywheel.audit_log import ParsedLog, parse_file
from resources.settings import SAMPLE_DATA, env_or_default, resolve_path

BUNDLED_AUDIT_LOG = SAMPLE_DATA / "audit_log.jsonl"


class AuditLog(dg.ConfigurableResource):
    """The JSONL audit log of operator decisions (one JSON object a line)."""

    path: str = Field(default=str(BUNDLED_AUDIT_LOG), description="FLYWHEEL_AUDIT_LOG: path of the JSONL audit log.")

    @classmethod
    def from_env(cls) -> "AuditLog":
        return cls(path=env_or_default("FLYWHEEL_AUDIT_LOG", str(BUNDLED_AUDIT_LOG)))

    @property
    def file(self) -> Path:
        return resolve_path(self.path)

    def parse(self) -> ParsedLog:
        if not self.file.exists():
            raise FileNotFoundError(f"audit log {self.file} does not exist (FLYWHEEL_AUDIT_LOG)")
        return parse_file(self.file)
