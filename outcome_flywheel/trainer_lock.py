"""One trainer at a time across every tier: GSPO daily, weighted DPO, distillation.

The lock is one file, `$FLYWHEEL_DATA_DIR/locks/trainer.lock`, created with O_CREAT|O_EXCL (atomic
on a local or mounted folder) and holding the holder's PID, host, tier and start time as JSON. A
second trainer waits for it (polling) up to `wait_s`, then is refused with the holder named. A lock
whose PID is dead on this host is stale (a trainer killed by the out-of-memory killer never
released it): it is cleared and the clearing reported. A lock from another host cannot be checked
by PID and counts as held.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

LOCK_FILE = ("locks", "trainer.lock")
WAIT_VARIABLE = "FLYWHEEL_TRAINER_LOCK_WAIT_S"  # how long a trainer waits for the lock; default below
DEFAULT_WAIT_S = 3600.0


class TrainerBusy(RuntimeError):
    """Another trainer holds the lock and did not release it within the wait. `report` says how the
    attempt went: the seconds really waited, the holder waited for, a stale lock cleared meanwhile."""

    def __init__(self, message: str, report: "LockReport | None" = None):
        super().__init__(message)
        self.report = report

    @property
    def waited_s(self) -> float:
        return self.report.waited_s if self.report else 0.0


@dataclass
class LockReport:
    """How the lock was taken: waited seconds, whom it waited for, the stale holder cleared (if any)."""

    path: str
    waited_s: float = 0.0
    waited_for: dict | None = None
    stale_cleared: dict | None = None
    holder: dict = field(default_factory=dict)

    def describe(self) -> str:
        parts = [f"trainer lock {self.path} taken"]
        if self.stale_cleared:
            h = self.stale_cleared
            parts.append(f"stale lock of dead PID {h.get('pid')} ({h.get('tier')}, since {h.get('started_at')}) cleared")
        if self.waited_for:
            parts.append(f"after waiting {self.waited_s:.1f} s for PID {self.waited_for.get('pid')} ({self.waited_for.get('tier')})")
        return "; ".join(parts)


def default_wait_s() -> float:
    value = os.environ.get(WAIT_VARIABLE, "")
    try:
        return float(value) if value else DEFAULT_WAIT_S
    except ValueError as err:
        raise ValueError(f"{WAIT_VARIABLE}={value!r}: a number of seconds") from err


def pid_alive(pid: int) -> bool:
    """Whether a process with this PID exists on this host (a zombie counts as dead)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    try:  # a zombie (exited, not yet reaped) holds nothing
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1] != "Z"
    except OSError:
        return True


def read_holder(path: Path) -> dict | None:
    """The lock's JSON, None when there is no lock; `{}` when it is unreadable (being written)."""
    try:
        return json.loads(Path(path).read_text() or "{}")
    except FileNotFoundError:
        return None
    except (ValueError, OSError):
        return {}


def is_stale(holder: dict) -> bool:
    """A holder on this host whose PID is gone."""
    if holder.get("host") != socket.gethostname():
        return False
    return not pid_alive(int(holder.get("pid", -1)))


class TrainerLock:
    """`with TrainerLock(path, tier="dpo") as report:` holds the single trainer lock meanwhile."""

    def __init__(self, path: Path, tier: str, wait_s: float | None = None, poll_s: float = 0.5, log=None):
        self.path = Path(path)
        self.tier = tier
        self.wait_s = default_wait_s() if wait_s is None else float(wait_s)
        self.poll_s = poll_s
        self.log = log or (lambda message: None)
        self.report: LockReport | None = None

    def acquire(self) -> LockReport:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        report = LockReport(path=str(self.path))
        started = time.monotonic()
        unreadable_since = None
        contended = False  # found the lock taken at least once: the time until now was spent waiting
        while True:
            holder = {"pid": os.getpid(), "host": socket.gethostname(), "tier": self.tier,
                      "started_at": datetime.now(timezone.utc).isoformat()}
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                current = read_holder(self.path)
                if current is None:
                    continue  # released between our two calls: try again at once
                contended = True
                if current == {}:  # being written; one that stays unreadable for 5 s is debris
                    unreadable_since = unreadable_since or time.monotonic()
                    if time.monotonic() - unreadable_since > 5:
                        self._clear(current, report)
                        continue
                elif is_stale(current):
                    self._clear(current, report)
                    continue
                else:
                    report.waited_for = current
                waited = time.monotonic() - started
                if waited >= self.wait_s:
                    report.waited_s = waited  # the wait the message states, for the audit row too
                    self.report = report
                    raise TrainerBusy(
                        f"another trainer holds {self.path}: PID {current.get('pid')} on {current.get('host')} "
                        f"({current.get('tier')}, since {current.get('started_at')}); waited {waited:.1f} s "
                        f"(limit {self.wait_s:g} s, {WAIT_VARIABLE})", report)
                time.sleep(min(self.poll_s, max(0.01, self.wait_s - waited)))
                continue
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(holder))
            # Every wait counts, a lock being written or left unreadable too (not only one naming a holder).
            report.waited_s = time.monotonic() - started if contended else 0.0
            report.holder = holder
            self.report = report
            self.log(report.describe())
            return report

    def _clear(self, holder: dict, report: LockReport) -> None:
        # Rename first: of two trainers clearing the same stale lock, only one wins the rename.
        grave = self.path.with_name(f"{self.path.name}.stale-{os.getpid()}")
        try:
            os.replace(self.path, grave)
        except FileNotFoundError:
            return
        if read_holder(grave) not in (holder, None) and holder != {}:
            # Not the lock we judged stale (a new holder took it meanwhile): put it back.
            os.replace(grave, self.path)
            return
        grave.unlink(missing_ok=True)
        report.stale_cleared = holder or {"pid": None, "tier": "unreadable lock file"}
        self.log(f"cleared a stale trainer lock: {holder}")

    def release(self) -> None:
        holder = read_holder(self.path)
        if holder and holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
            self.path.unlink(missing_ok=True)

    def __enter__(self) -> LockReport:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
