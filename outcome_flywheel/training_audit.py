"""`training_audit`: one row per training of every tier (GSPO daily, weighted DPO, distillation),
written through `Warehouse` (unpartitioned), appended idempotently by `training_id` (a re-run of
the same training replaces its row). Columns: tier, trigger, inputs (JSON), gate verdict and reason,
start, end, duration, status (succeeded / failed / refused), error, and how the single trainer
lock went (seconds waited, a stale lock cleared).

`audited_training` is what the step entry (`steps/entry.py`) wraps every training step in: take
the trainer lock (`trainer_lock.py`), run, write the row whatever happens. A step adds what only
it knows (its gate's verdict, its inputs) to `current()` while it runs.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterator

import pandas as pd

from outcome_flywheel.storage import Warehouse
from outcome_flywheel.trainer_lock import LOCK_FILE, LockReport, TrainerBusy, TrainerLock

AUDIT_TABLE = "training_audit"
AUDIT_COLUMNS = [
    "training_id", "tier", "trigger", "inputs", "gate_verdict", "gate_reason", "started_at", "finished_at",
    "duration_s", "status", "error", "lock_waited_s", "stale_lock_cleared", "pid",
]
# step -> tier; the steps that train a policy (the note scorer's online steps are not: tier 1a takes
# one Adam step per event on its own small model, beside any trainer, docs/tiers.md)
TRAINING_STEPS = {"daily_update": "gspo_daily", "preference_adapter": "dpo", "distillation": "distillation"}


@dataclass
class AuditEntry:
    training_id: str
    tier: str
    trigger: str
    inputs: dict = field(default_factory=dict)
    gate_verdict: str = "none"
    gate_reason: str = ""
    started_at: str = ""
    finished_at: str = ""
    duration_s: float = 0.0
    status: str = "running"
    error: str = ""
    lock_waited_s: float = 0.0
    stale_lock_cleared: str = ""
    pid: int = 0

    def row(self) -> dict:
        data = asdict(self)
        data["inputs"] = json.dumps(self.inputs, sort_keys=True, default=str)
        return data


_current: list[AuditEntry] = []


def current() -> AuditEntry | None:
    """The training being audited in this process (a step adds its gate verdict and inputs here)."""
    return _current[-1] if _current else None


def record(warehouse: Warehouse, entry: AuditEntry) -> None:
    """Append (or replace, same `training_id`) the entry's row; one atomic table write."""
    existing = warehouse.read(AUDIT_TABLE) if warehouse.exists(AUDIT_TABLE) else pd.DataFrame(columns=AUDIT_COLUMNS)
    if len(existing):
        existing = existing[existing["training_id"] != entry.training_id]
    row = pd.DataFrame([entry.row()], columns=AUDIT_COLUMNS)
    table = pd.concat([existing, row], ignore_index=True) if len(existing) else row
    warehouse.write(AUDIT_TABLE, table[AUDIT_COLUMNS])


def read_audit(warehouse: Warehouse) -> pd.DataFrame:
    return warehouse.read(AUDIT_TABLE) if warehouse.exists(AUDIT_TABLE) else pd.DataFrame(columns=AUDIT_COLUMNS)


@contextmanager
def audited_training(warehouse: Warehouse, tier: str, training_id: str, trigger: str = "", inputs: dict | None = None,
                     wait_s: float | None = None, log=None) -> Iterator[AuditEntry]:
    """Hold the single trainer lock while the body trains, and write its audit row however it ends
    (refused: the lock was not free within the wait; failed: the body raised)."""
    entry = AuditEntry(training_id=training_id, tier=tier, trigger=trigger or "manual", inputs=dict(inputs or {}),
                       started_at=datetime.now(timezone.utc).isoformat(), pid=os.getpid())
    started = time.perf_counter()
    lock = TrainerLock(warehouse.path(*LOCK_FILE), tier=tier, wait_s=wait_s, log=log)
    try:
        report = lock.acquire()
    except TrainerBusy as err:
        entry.status, entry.error = "refused", str(err)[:2000]
        # The wait its error states (it was 0.0 here: the report of a refused attempt was never read).
        if err.report is not None:
            _lock_figures(entry, err.report)
        _finish(warehouse, entry, started)
        raise
    _lock_figures(entry, report)
    _current.append(entry)
    try:
        yield entry
        entry.status = "succeeded"
    except BaseException as err:
        entry.status, entry.error = "failed", f"{type(err).__name__}: {err}"[:2000]
        raise
    finally:
        _current.remove(entry)
        try:
            _finish(warehouse, entry, started)
        finally:
            lock.release()


def _lock_figures(entry: AuditEntry, report: LockReport) -> None:
    entry.lock_waited_s = round(report.waited_s, 3)
    entry.stale_lock_cleared = json.dumps(report.stale_cleared) if report.stale_cleared else ""


def _finish(warehouse: Warehouse, entry: AuditEntry, started: float) -> None:
    entry.finished_at = datetime.now(timezone.utc).isoformat()
    entry.duration_s = round(time.perf_counter() - started, 3)
    record(warehouse, entry)


def step_audit_inputs(step: str, extras: dict, partition: str | None) -> dict:
    """What a training step trains on, from what its asset sent (`extras`)."""
    models = extras.get("models") or {}
    inputs: dict[str, Any] = {"partition": partition, "base_model": models.get("base_model"), "backend": models.get("backend")}
    for key in ("run", "dataset_fingerprint", "trigger", "samples"):
        if key in extras:
            inputs[key] = extras[key]
    return {k: v for k, v in inputs.items() if v is not None}


def daily_gate_from_warehouse(warehouse: Warehouse, day: str) -> tuple[str, str, dict]:
    """(gate verdict, reason, figures) of a GSPO day, read from its `policy_training` row."""
    if not day or not warehouse.exists("policy_training", day):
        return "none", "", {}
    row = warehouse.read("policy_training", day).iloc[-1]
    figures = {k: (row[k].item() if hasattr(row[k], "item") else row[k]) for k in ("examples", "steps", "policy_version") if k in row}
    return str(row.get("gate", "none")), str(row.get("gate_reason", "")), figures
