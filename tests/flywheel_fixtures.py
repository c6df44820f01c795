"""Fixtures and helpers shared by the flywheel tests."""

import json
from pathlib import Path

import pytest
import torch


@pytest.fixture()
def one_thread():
    """Torch on one thread while the test runs: on a shared 2-core machine two threads oversubscribe
    and a tiny model's step gets several times slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def bundled_decisions(first: str, last: str) -> list[str]:
    """The bundled audit log's records stamped `first`..`last` (the day of their `ts`), one JSON line
    each; its broken lines (there on purpose) left out."""
    from outcome_flywheel.preferences.audit_log_file import BUNDLED_AUDIT_LOG

    lines = []
    for line in BUNDLED_AUDIT_LOG.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record.get("ts"), str) and first <= record["ts"][:10] <= last:
            lines.append(json.dumps(record))
    return lines


def write_log(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def flywheel_resources(warehouse, model_backend, log: Path, data_dir, step_runner=None) -> dict:
    """The preference flywheel's resources: the audit log at `log`, the bundled prices under `data_dir`,
    the heavy steps in the test's process unless `step_runner` says otherwise."""
    from outcome_flywheel.market_data import MarketData
    from outcome_flywheel.preferences.audit_log_file import AuditLog
    from outcome_flywheel.tracking import Tracker
    from resources.steps import StepRunnerResource

    return {
        "warehouse": warehouse,
        "model_backend": model_backend,
        "audit_log": AuditLog(path=str(log)),
        "market_data": MarketData(data_dir=str(data_dir)),
        "step_runner": step_runner or StepRunnerResource(runner="in_process"),
        "tracking": Tracker(data_dir=str(data_dir), tracking_uri="off"),  # tests/tracking/ record in MLflow
    }
