"""`training_audit`: one row per training of every tier (GSPO daily, weighted DPO, distillation),
written through `Warehouse` (unpartitioned), appended idempotently by `training_id` (a re-run of
the same training replaces its row). Columns: tier, trigger, inputs (JSON), gate verdict and reason,
start, end, duration, status, error, and how the single trainer lock went (seconds waited, a stale
lock cleared, as JSON with the reason it was judged stale).

Statuses (`STATUSES`):
- `running`: written once the lock is taken, before the training starts; it stays only while the
  training runs, or after a process that could not write its end (SIGKILL: the out-of-memory killer,
  a pod evicted), until the next training finds it;
- `succeeded`, `failed` (the body raised; `error` says what);
- `refused`: the lock was not free within the wait;
- `fenced`: it lost the lock while training (frozen past its lease, another trainer took it) and
  published nothing: its fencing token was checked at the publish step (`fencing.publishing`);
- `crashed`: a row left `running` by a process that was killed, rewritten by the next training of
  any tier once it holds the lock (no audited training can be running then: each holds the lock
  while it runs). `error` says why (its lock judged stale: no heartbeat since ..., or its PID dead;
  or it no longer held the lock) and when and by which training it was found; `finished_at` is
  empty and `duration_s` NaN (the end is unknown).
A killed process that was only stalled (frozen past its lease) and resumes writes its own end over
`crashed` when it finishes (same `training_id`): `fenced` if another trainer took the lock meanwhile.

Every write of the table (a row's start and end, a refused attempt's row, the `crashed` rewrite) is
a read-modify-write of the whole table made under the table's own short mutex
(`locks/training_audit.mutex`, `fencing.file_mutex`), not under the trainer lock, which a refused
attempt does not hold: no row is lost or overwritten by another process's write.

`audited_training` is what the step entry (`steps/entry.py`) wraps every training step in: take
the trainer lock (`trainer_lock.py`), mark the rows killed trainings left, write this one's
`running` row, run, write the row's end whatever happens. A step adds what only it knows (its
gate's verdict, its inputs) to `current()` while it runs.
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

from outcome_flywheel.fencing import FencedOut, file_mutex
from outcome_flywheel.storage import Warehouse
from outcome_flywheel.trainer_lock import LOCK_FILE, LockReport, TrainerBusy, TrainerLock

AUDIT_TABLE = "training_audit"
AUDIT_MUTEX = ("locks", "training_audit.mutex")  # every write of the table holds it (module's note)
AUDIT_COLUMNS = [
    "training_id",
    "tier",
    "trigger",
    "inputs",
    "gate_verdict",
    "gate_reason",
    "started_at",
    "finished_at",
    "duration_s",
    "status",
    "error",
    "lock_waited_s",
    "stale_lock_cleared",
    "pid",
]
STATUSES = ("running", "succeeded", "failed", "refused", "fenced", "crashed")  # see the module's note
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
    """Append (or replace, same `training_id`) the entry's row; one atomic table write, under the
    table's mutex."""
    with file_mutex(warehouse.path(*AUDIT_MUTEX)):
        _record(warehouse, entry)


def _record(warehouse: Warehouse, entry: AuditEntry) -> None:
    existing = warehouse.read(AUDIT_TABLE) if warehouse.exists(AUDIT_TABLE) else pd.DataFrame(columns=AUDIT_COLUMNS)
    if len(existing):
        existing = existing[existing["training_id"] != entry.training_id]
    row = pd.DataFrame([entry.row()], columns=AUDIT_COLUMNS)
    table = pd.concat([existing, row], ignore_index=True) if len(existing) else row
    warehouse.write(AUDIT_TABLE, table[AUDIT_COLUMNS])


def read_audit(warehouse: Warehouse) -> pd.DataFrame:
    return warehouse.read(AUDIT_TABLE) if warehouse.exists(AUDIT_TABLE) else pd.DataFrame(columns=AUDIT_COLUMNS)


def mark_crashed(warehouse: Warehouse, found_by: str, report: LockReport | None = None, log=None) -> list[str]:
    """Rewrite as `crashed` every row still `running`: call it holding the trainer lock, before this
    training's own row is written, so that each such row is a training killed before its end.
    `report` (how this lock was taken) names the stale holder cleared, if it was one of them.
    Returns their training ids; one table write, under the table's mutex."""
    with file_mutex(warehouse.path(*AUDIT_MUTEX)):
        ids = _mark_crashed(warehouse, found_by, report)
    if ids and log:
        log(f"training_audit: {', '.join(ids)} left `running` by a killed process, marked `crashed`")
    return ids


def _mark_crashed(warehouse: Warehouse, found_by: str, report: LockReport | None) -> list[str]:
    audit = read_audit(warehouse)
    running = audit.index[audit["status"] == "running"] if len(audit) else []
    if not len(running):
        return []
    found_at = datetime.now(timezone.utc).isoformat()
    stale = (report.stale_cleared or {}) if report is not None else {}
    audit = audit.copy()
    audit["duration_s"] = audit["duration_s"].astype(float)
    for i in running:
        training_id = audit.at[i, "training_id"]
        if stale.get("training_id") == training_id:
            why = f"its trainer lock was judged stale and cleared: {report.stale_reason}"
        else:
            why = (
                "it no longer held the trainer lock (PID {}): the process was killed (SIGKILL or the out-of-memory "
                "killer), its pod evicted or its host lost".format(audit.at[i, "pid"])
            )
        audit.at[i, "status"] = "crashed"
        audit.at[i, "error"] = f"crashed without writing its end: {why}; found at {found_at} by {found_by}"[:2000]
        audit.at[i, "finished_at"] = ""
        audit.at[i, "duration_s"] = float("nan")
    warehouse.write(AUDIT_TABLE, audit[AUDIT_COLUMNS])
    return [str(audit.at[i, "training_id"]) for i in running]


@contextmanager
def audited_training(
    warehouse: Warehouse,
    tier: str,
    training_id: str,
    trigger: str = "",
    inputs: dict | None = None,
    wait_s: float | None = None,
    log=None,
) -> Iterator[AuditEntry]:
    """Hold the single trainer lock while the body trains, and write its audit row however it ends
    (refused: the lock was not free within the wait; failed: the body raised; fenced: it lost the
    lock meanwhile and its publish step refused to publish, `FencedOut`). Once the lock is
    taken: rows killed trainings left `running` become `crashed` (`mark_crashed`), then this
    training's row is written `running`, so a SIGKILL leaves it for the next training to find."""
    entry = AuditEntry(
        training_id=training_id,
        tier=tier,
        trigger=trigger or "manual",
        inputs=dict(inputs or {}),
        started_at=datetime.now(timezone.utc).isoformat(),
        pid=os.getpid(),
    )
    started = time.perf_counter()
    lock = TrainerLock(warehouse.path(*LOCK_FILE), tier=tier, wait_s=wait_s, log=log, training_id=training_id)
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
    try:
        mark_crashed(warehouse, training_id, report, log)
        record(warehouse, entry)  # `running`: what a process killed from now on leaves
    except BaseException:
        lock.release()
        raise
    _current.append(entry)
    try:
        yield entry
        entry.status = "succeeded"
    except FencedOut as err:
        entry.status, entry.error = "fenced", f"{type(err).__name__}: {err}"[:2000]
        raise
    except BaseException as err:
        entry.status, entry.error = "failed", f"{type(err).__name__}: {err}"[:2000]
        raise
    finally:
        _current.remove(entry)
        try:
            if lock.lost:  # stalled past its lease: another trainer may have run meanwhile
                entry.error = f"{entry.error}; {lock.lost}"[:2000] if entry.error else lock.lost[:2000]
                if log:
                    log(lock.lost)
            _finish(warehouse, entry, started)
        finally:
            lock.release()


def _lock_figures(entry: AuditEntry, report: LockReport) -> None:
    entry.lock_waited_s = round(report.waited_s, 3)
    entry.stale_lock_cleared = (
        json.dumps({**report.stale_cleared, "reason": report.stale_reason}, default=str) if report.stale_cleared else ""
    )


def _finish(warehouse: Warehouse, entry: AuditEntry, started: float) -> None:
    entry.finished_at = datetime.now(timezone.utc).isoformat()
    entry.duration_s = round(time.perf_counter() - started, 3)
    record(warehouse, entry)


def step_audit_inputs(step: str, extras: dict, partition: str | None) -> dict:
    """What a training step trains on, from what its asset sent (`extras`)."""
    models = extras.get("models") or {}
    inputs: dict[str, Any] = {
        "partition": partition,
        "base_model": models.get("base_model"),
        "backend": models.get("backend"),
    }
    for key in ("run", "dataset_fingerprint", "trigger", "samples"):
        if key in extras:
            inputs[key] = extras[key]
    return {k: v for k, v in inputs.items() if v is not None}


def daily_gate_from_warehouse(warehouse: Warehouse, day: str) -> tuple[str, str, dict]:
    """(gate verdict, reason, figures) of a GSPO day, read from its `policy_training` row."""
    if not day or not warehouse.exists("policy_training", day):
        return "none", "", {}
    row = warehouse.read("policy_training", day).iloc[-1]
    figures = {
        k: (row[k].item() if hasattr(row[k], "item") else row[k])
        for k in ("examples", "steps", "policy_version")
        if k in row
    }
    return str(row.get("gate", "none")), str(row.get("gate_reason", "")), figures
