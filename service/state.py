"""What the service's handlers share: its settings, the warehouse, the two people-written logs, the
style scorer (one model kept loaded) and the Dagster instance runs are launched on (read with public
calls; with FLYWHEEL_DAGSTER_URL the same instance its webserver and daemon use)."""

from __future__ import annotations

import os
import subprocess
import threading
from dataclasses import dataclass, field
from typing import Callable

import dagster as dg

from outcome_flywheel.feedback.log import FeedbackLog
from outcome_flywheel.preferences.audit_log_file import BUNDLED_AUDIT_LOG, AuditLog
from outcome_flywheel.preferences.style_scorer import StyleScorer
from outcome_flywheel.settings import env
from outcome_flywheel.storage import Warehouse
from service.config import ServiceConfig


class NoDagsterInstance(RuntimeError):
    """Launching needs a persistent Dagster instance (DAGSTER_HOME), the one `make ui` shows."""


class DagsterUnavailable(NoDagsterInstance):
    """The Dagster webserver of FLYWHEEL_DAGSTER_URL did not take a run (down, still loading the
    code location, or it refused the run): the request gets a 503 with the reason."""


def dagster_instance() -> dg.DagsterInstance:
    if not os.environ.get("DAGSTER_HOME"):
        raise NoDagsterInstance(
            "DAGSTER_HOME is not set: runs are launched on the project's Dagster instance "
            "(`make serve` sets it to .dagster/, the instance `make ui` shows)"
        )
    return dg.DagsterInstance.get()


@dataclass
class ServiceState:
    config: ServiceConfig
    warehouse: Warehouse
    audit_log: AuditLog
    feedback_log: FeedbackLog
    scorer: StyleScorer
    instance_factory: Callable[[], dg.DagsterInstance] = dagster_instance
    workers: list[subprocess.Popen] = field(default_factory=list)
    launch_lock: threading.Lock = field(default_factory=threading.Lock)  # check-then-launch is one step
    _instance: dg.DagsterInstance | None = None

    def instance(self) -> dg.DagsterInstance:
        """The Dagster instance, opened once (NoDagsterInstance without DAGSTER_HOME)."""
        if self._instance is None:
            self._instance = self.instance_factory()
        return self._instance

    @classmethod
    def from_env(cls, config: ServiceConfig | None = None) -> "ServiceState":
        """The same places the Dagster resources read (FLYWHEEL_DATA_DIR, FLYWHEEL_AUDIT_LOG,
        FLYWHEEL_LIVE_AUDIT_LOG, FLYWHEEL_FEEDBACK_LOG), so the assets see what the service writes."""
        data_dir = env("FLYWHEEL_DATA_DIR")
        warehouse = Warehouse.from_env()  # FLYWHEEL_DATA_DIR, FLYWHEEL_WAREHOUSE_URL, FLYWHEEL_S3_ENDPOINT
        return cls(
            config=config or ServiceConfig.from_env(),
            warehouse=warehouse,
            audit_log=AuditLog(
                path=env("FLYWHEEL_AUDIT_LOG", str(BUNDLED_AUDIT_LOG)),
                live_path=env("FLYWHEEL_LIVE_AUDIT_LOG", ""),
                data_dir=data_dir,
            ),
            feedback_log=FeedbackLog(path=env("FLYWHEEL_FEEDBACK_LOG", ""), data_dir=data_dir),
            scorer=StyleScorer(warehouse),
        )
