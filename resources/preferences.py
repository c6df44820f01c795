"""Resources of the preference flywheel: where the operator audit log lives."""

from outcome_flywheel.preferences.audit_log_file import BUNDLED_AUDIT_LOG, AuditLog
from resources.settings import DataclassResource, env_or_default, mirrored


class AuditLogResource(DataclassResource[AuditLog]):
    """The JSONL audit log of operator decisions (FLYWHEEL_AUDIT_LOG; default the bundled sample)."""

    plain = AuditLog
    path: str = mirrored(AuditLog, "path")

    @classmethod
    def from_env(cls) -> "AuditLogResource":
        return cls(path=env_or_default("FLYWHEEL_AUDIT_LOG", str(BUNDLED_AUDIT_LOG)))
