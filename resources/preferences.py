"""Resources of the preference flywheel: where the operator audit log lives."""

from outcome_flywheel.preferences.audit_log_file import BUNDLED_AUDIT_LOG, AuditLog
from resources.settings import DataclassResource, env_or_default, mirrored


class AuditLogResource(DataclassResource[AuditLog]):
    """The JSONL audit log of operator decisions (FLYWHEEL_AUDIT_LOG; default the bundled sample), then the live log the
    service appends to (FLYWHEEL_LIVE_AUDIT_LOG; default <FLYWHEEL_DATA_DIR>/decisions/audit_log.jsonl)."""

    plain = AuditLog
    path: str = mirrored(AuditLog, "path")
    live_path: str = mirrored(AuditLog, "live_path")
    data_dir: str = mirrored(AuditLog, "data_dir")

    @classmethod
    def from_env(cls) -> "AuditLogResource":
        return cls(
            path=env_or_default("FLYWHEEL_AUDIT_LOG", str(BUNDLED_AUDIT_LOG)),
            live_path=env_or_default("FLYWHEEL_LIVE_AUDIT_LOG", ""),
            data_dir=env_or_default("FLYWHEEL_DATA_DIR"),
        )
