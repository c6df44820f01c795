"""One trainer at a time across every tier: GSPO daily, weighted DPO, distillation.

The lock is one file, `$FLYWHEEL_DATA_DIR/locks/trainer.lock`, created with O_CREAT|O_EXCL (atomic
on a local or mounted folder, the data volume a Kubernetes pod mounts too) and holding as JSON the
holder's PID, host, tier, start time, a random `token` (which holder it is: two pods can both be
PID 1, and a restarted pod keeps its host name) and a lease: `heartbeat_at`, `lease_s` and
`lease_expires_at` (heartbeat + lease). While the lock is held a daemon thread renews the lease
every `lease_s / 4` (`FLYWHEEL_TRAINER_LOCK_LEASE_S`, default 60 s): it writes the new JSON to a
file of its own beside the lock and renames it over the lock, so the lock file is never missing nor
half-written while held (acquisition stays O_EXCL: a renewal only ever replaces a lock file that
names its own token).

A second trainer waits for it (polling) up to `wait_s` (`FLYWHEEL_TRAINER_LOCK_WAIT_S`), then is
refused with the holder named. A holder is stale, and its lock cleared and the clearing reported,
when:
- its lease has expired (no heartbeat for `lease_s`), on any host: a process killed by SIGKILL (the
  out-of-memory killer, a pod evicted or its node lost) stops renewing;
- it is on this host and its PID is dead: at once, without waiting for the lease;
- it has no lease (a lock written by the previous version of this module): on this host by its PID
  as above, and on any host once `LEGACY_HOLD_S` (12 h, longer than any training) have passed since
  its `started_at`; an unreadable `started_at` counts as held.

Clocks: a lease is compared with the clock of the host that reads it, so the hosts sharing the data
volume are assumed to keep their clocks in step (NTP: milliseconds apart). The holder renews by
rename while its lease has not run out by its own clock; a heartbeat on time comes with 3/4 of the
lease left (45 s by default), so another host clears a lock being renewed only if its clock is
ahead by more than what is left, and even a heartbeat two beats late leaves a margin of `lease_s /
4` (15 s) for skew. A holder whose lease ran out before its heartbeat (a frozen process, a
suspended host) takes its lock again the way a stale lock is cleared (rename aside, check it is its
own, O_EXCL), so it never overwrites a lock another trainer took meanwhile; if one did, the holder
has lost the lock: `lost` says so (the audit row too) and the heartbeat stops.

Fencing (`fencing.py`): each acquisition takes a token that only grows (`fence` in the lock file),
under the mutex `trainer.lock.mutex` that each renewal and release hold too; a training publishes
only inside `fencing.publishing`, which checks under that mutex that its token is still the last and
the lock file still its own, so a holder that lost the lock publishes nothing (`FencedOut`).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from outcome_flywheel import fencing
from outcome_flywheel.fencing import MutexTimeout, file_mutex, issue_fence, mutex_path

LOCK_FILE = ("locks", "trainer.lock")
WAIT_VARIABLE = "FLYWHEEL_TRAINER_LOCK_WAIT_S"  # how long a trainer waits for the lock; default below
DEFAULT_WAIT_S = 3600.0
LEASE_VARIABLE = "FLYWHEEL_TRAINER_LOCK_LEASE_S"  # a holder without a heartbeat for this long is stale
DEFAULT_LEASE_S = 60.0
HEARTBEATS_PER_LEASE = 4  # the lease is renewed every lease_s / 4
MUTEX_FLOOR_S = 0.5  # the least a trainer waits for the fence's mutex: a renewal on a loaded box may hold it so long
LEGACY_HOLD_S = 12 * 3600.0  # a lock without a lease (older version): stale this long after its started_at


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
    """How the lock was taken: waited seconds, whom it waited for, the stale holder cleared (if any)
    and why it was judged stale."""

    path: str
    waited_s: float = 0.0
    waited_for: dict | None = None
    stale_cleared: dict | None = None
    stale_reason: str = ""
    holder: dict = field(default_factory=dict)

    def describe(self) -> str:
        fence = f" (fencing token {self.holder['fence']})" if self.holder.get("fence") else ""
        parts = [f"trainer lock {self.path} taken{fence}"]
        if self.stale_cleared:
            h = self.stale_cleared
            if h.get("pid") is None:
                parts.append(f"stale lock cleared: {self.stale_reason}")
            else:
                who = (
                    f"dead PID {h.get('pid')}"
                    if self.stale_reason.startswith("PID")
                    else f"PID {h.get('pid')} on {h.get('host')}"
                )
                parts.append(
                    f"stale lock of {who} ({h.get('tier')}, since {h.get('started_at')}) cleared: {self.stale_reason}"
                )
        if self.waited_for:
            parts.append(
                f"after waiting {self.waited_s:.1f} s for PID {self.waited_for.get('pid')} ({self.waited_for.get('tier')})"
            )
        return "; ".join(parts)


def _seconds(variable: str, default: float, minimum: float = 0.0) -> float:
    value = os.environ.get(variable, "")
    try:
        seconds = float(value) if value else default
    except ValueError as err:
        raise ValueError(f"{variable}={value!r}: a number of seconds") from err
    if seconds < minimum or seconds != seconds:
        raise ValueError(f"{variable}={value!r}: at least {minimum:g} seconds")
    return seconds


def default_wait_s() -> float:
    return _seconds(WAIT_VARIABLE, DEFAULT_WAIT_S)


def default_lease_s() -> float:
    return _seconds(LEASE_VARIABLE, DEFAULT_LEASE_S, minimum=0.1)


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


def _utc(text) -> datetime | None:
    try:
        moment = datetime.fromisoformat(str(text))
    except (TypeError, ValueError):
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def this_host() -> str:
    """The host name a holder records (a pod's name under Kubernetes)."""
    return socket.gethostname()


def stale_reason(holder: dict, now: datetime | None = None) -> str:
    """Why this holder is stale (see the module's note), or "" while it holds the lock."""
    now = now or datetime.now(timezone.utc)
    if holder.get("host") == this_host():
        try:
            pid = int(holder.get("pid", -1))
        except (TypeError, ValueError):
            pid = -1
        if not pid_alive(pid):
            return f"PID {holder.get('pid')} is dead on this host ({this_host()}): the process was killed (SIGKILL or the out-of-memory killer)"
    if "lease_expires_at" in holder:
        expires = _utc(holder.get("lease_expires_at"))
        if expires is None:  # a lease nobody can read holds nothing
            return f"its lease_expires_at {holder.get('lease_expires_at')!r} is unreadable"
        if now > expires:
            return (
                f"no heartbeat since {holder.get('heartbeat_at')} (lease of {holder.get('lease_s')} s expired at "
                f"{holder.get('lease_expires_at')}): the process was killed (SIGKILL or the out-of-memory killer), "
                "its pod evicted or its host lost"
            )
        return ""
    started = _utc(holder.get("started_at"))
    if started is not None and now > started + timedelta(seconds=LEGACY_HOLD_S):
        return (
            f"a lock without a lease (written by an older version) started at {holder.get('started_at')}, "
            f"over {LEGACY_HOLD_S / 3600:g} h ago"
        )
    return ""


def is_stale(holder: dict) -> bool:
    """A holder whose lease expired, on this host one whose PID is gone (see `stale_reason`)."""
    return bool(stale_reason(holder))


class TrainerLock:
    """`with TrainerLock(path, tier="dpo") as report:` holds the single trainer lock meanwhile, its
    lease renewed by a heartbeat thread until it is released."""

    def __init__(
        self,
        path: Path,
        tier: str,
        wait_s: float | None = None,
        poll_s: float = 0.5,
        log=None,
        lease_s: float | None = None,
        training_id: str = "",
    ):
        self.path = Path(path)
        self.tier = tier
        self.wait_s = default_wait_s() if wait_s is None else float(wait_s)
        self.lease_s = default_lease_s() if lease_s is None else float(lease_s)
        self.heartbeat_s = self.lease_s / HEARTBEATS_PER_LEASE
        self.poll_s = poll_s
        self.training_id = training_id
        self.log = log or (lambda message: None)
        self.report: LockReport | None = None
        self.holder: dict = {}
        self.token = ""
        self.fence = 0  # this acquisition's fencing token (fencing.py)
        self.lost = ""  # why the lock was lost while held (a stall past the lease, another trainer took it)
        self._expires = 0.0  # this holder's lease end, time.time()
        self._stop = threading.Event()
        self._mutex = threading.Lock()  # a renewal and the release never overlap
        self._thread: threading.Thread | None = None

    # -- the holder's JSON -------------------------------------------------------------------

    def _stamp(self, holder: dict) -> tuple[dict, float]:
        """`holder` with a fresh lease, and the lease's end (time.time())."""
        now = time.time()
        expires = now + self.lease_s
        return {
            **holder,
            "heartbeat_at": datetime.fromtimestamp(now, timezone.utc).isoformat(),
            "lease_s": self.lease_s,
            "lease_expires_at": datetime.fromtimestamp(expires, timezone.utc).isoformat(),
        }, expires

    def _create(self, holder: dict) -> bool:
        """O_CREAT|O_EXCL the lock with `holder`; False when it exists."""
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(holder))
        return True

    def _take(self, holder: dict, wait_left: float) -> bool:
        """Create the lock with the next fencing token, under the fence's mutex (no holder is between
        its check and its publication meanwhile: `fencing.publishing`); False when the lock exists."""
        with file_mutex(mutex_path(self.path), timeout_s=max(wait_left, MUTEX_FLOOR_S)):
            if self.path.exists():
                return False
            holder["fence"] = issue_fence(self.path, holder)
            return self._create(holder)

    # -- acquisition -------------------------------------------------------------------------

    def acquire(self) -> LockReport:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        report = LockReport(path=str(self.path))
        started = time.monotonic()
        unreadable_since = None
        contended = False  # found the lock taken at least once: the time until now was spent waiting
        self.token = uuid.uuid4().hex
        while True:
            holder, expires = self._stamp(
                {
                    "pid": os.getpid(),
                    "host": this_host(),
                    "tier": self.tier,
                    "started_at": datetime.now(timezone.utc).isoformat(),
                    "token": self.token,
                    **({"training_id": self.training_id} if self.training_id else {}),
                }
            )
            try:
                taken = self._take(holder, wait_left := self.wait_s - (time.monotonic() - started))
            except MutexTimeout as err:  # the mutex held all the wait left: a holder stopped while publishing
                report.waited_s, self.report = time.monotonic() - started, report
                if (current := read_holder(self.path)) and wait_left < MUTEX_FLOOR_S:
                    report.waited_for = current  # the wait ended in a live holder's renewal: busy, not stopped
                    raise self._busy(current, report) from err
                raise TrainerBusy(f"{err}; waited {report.waited_s:.1f} s ({WAIT_VARIABLE})", report) from err
            if not taken:
                current = read_holder(self.path)
                if current is None:
                    continue  # released between our two calls: try again at once
                contended = True
                if current == {}:  # being written; one that stays unreadable for 5 s is debris
                    unreadable_since = unreadable_since or time.monotonic()
                    if time.monotonic() - unreadable_since > 5:
                        self._clear(current, report, "an unreadable lock file (debris)")
                        continue
                elif reason := stale_reason(current):
                    self._clear(current, report, reason)
                    continue
                else:
                    report.waited_for = current
                waited = time.monotonic() - started
                if waited >= self.wait_s:
                    report.waited_s, self.report = waited, report  # the wait the message states, for the audit row too
                    raise self._busy(current, report)
                time.sleep(min(self.poll_s, max(0.01, self.wait_s - waited)))
                continue
            # Every wait counts, a lock being written or left unreadable too (not only one naming a holder).
            report.waited_s = time.monotonic() - started if contended else 0.0
            report.holder = self.holder = holder
            self.fence = holder["fence"]
            self._expires = expires
            self.report = report
            self.lost = ""
            fencing.hold(self)
            self._start_heartbeat()
            self.log(report.describe())
            return report

    def _busy(self, current: dict, report: LockReport) -> TrainerBusy:
        """The refusal once the wait is over: who holds the lock (`current`, as its file says), `report.waited_s`."""
        lease = f", lease to {current.get('lease_expires_at')}" if current.get("lease_expires_at") else ", no lease"
        return TrainerBusy(
            f"another trainer holds {self.path}: PID {current.get('pid')} on {current.get('host')} "
            f"({current.get('tier')}, since {current.get('started_at')}{lease if current else ''}); "
            f"waited {report.waited_s:.1f} s (limit {self.wait_s:g} s, {WAIT_VARIABLE})",
            report,
        )

    def _clear(self, holder: dict, report: LockReport, reason: str) -> None:
        # Rename first: of two trainers clearing the same stale lock, only one wins the rename.
        if self._move_aside(holder) is None:
            return
        report.stale_cleared = holder or {"pid": None, "tier": "unreadable lock file"}
        report.stale_reason = reason
        if holder.get("token"):  # a renewal file its killed holder left half-way
            self.path.with_name(f"{self.path.name}.beat-{holder['token']}").unlink(missing_ok=True)
        self.log(f"cleared a stale trainer lock: {holder} ({reason})")

    def _move_aside(self, holder: dict) -> dict | None:
        """Remove the lock file if it still is `holder`'s (rename aside, then check what was moved);
        returns what was removed, None when the file was gone or had changed (then put back)."""
        grave = self.path.with_name(f"{self.path.name}.stale-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        try:
            os.replace(self.path, grave)
        except FileNotFoundError:
            return None
        moved = read_holder(grave)
        if moved not in (holder, None) and holder != {}:
            # Not the lock we judged stale (renewed, or a new holder took it meanwhile): put it back.
            os.replace(grave, self.path)
            return None
        grave.unlink(missing_ok=True)
        return moved if moved is not None else {}

    # -- the heartbeat -----------------------------------------------------------------------

    def _start_heartbeat(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._beat, args=(self._stop,), name=f"trainer-lock-heartbeat-{self.tier}", daemon=True
        )
        self._thread.start()

    def _beat(self, stop: threading.Event) -> None:
        while not stop.wait(self.heartbeat_s):
            try:
                self.renew(stop)
            except Exception as err:  # a failed write (a full or unreachable volume): retried next beat
                print(f"trainer lock heartbeat failed: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
            if self.lost:
                return

    def renew(self, stop: threading.Event | None = None) -> bool:
        """Renew the lease now (the heartbeat thread calls this); False when the lock was lost. Under
        the fence's mutex: a holder frozen between its check and its write (past its lease) cannot
        write over a lock another trainer took meanwhile (acquisitions hold that mutex too)."""
        with self._mutex, file_mutex(mutex_path(self.path), timeout_s=self.heartbeat_s):
            if (stop or self._stop).is_set() or self.lost:
                return not self.lost
            current = read_holder(self.path)
            if current == {}:
                return True  # unreadable this once (a transient read error): the next beat tries again
            if current is None or current.get("token") != self.token:
                self._lose(
                    f"the lock file {'is gone' if current is None else 'names another holder: ' + json.dumps(current)}"
                )
                return False
            late = time.time() >= self._expires
            holder, expires = self._stamp(self.holder)
            if not late:
                # Our lease has not run out: no other host judges it stale (their clocks are not ahead
                # of ours by what is left of it), so replacing our own lock file cannot race a clearer,
                # and the lock file is never missing meanwhile.
                beat = self.path.with_name(f"{self.path.name}.beat-{self.token}")
                beat.write_text(json.dumps(holder))
                os.replace(beat, self.path)
                self.holder, self._expires = holder, expires
                return True
            # Stalled past the end of our lease: another trainer may be clearing it right now. Take it
            # again like a stale lock (never overwriting a lock someone else created).
            moved = self._move_aside(current)
            if moved is None or not self._create(holder):
                self._lose("the heartbeat stalled past the lease and another trainer took the lock")
                return False
            self.holder, self._expires = holder, expires
            print(
                f"trainer lock {self.path}: heartbeat late (lease was to {current.get('lease_expires_at')}); lock taken again",
                file=sys.stderr,
                flush=True,
            )
            return True

    def _lose(self, why: str) -> None:
        self.lost = f"trainer lock {self.path} lost while training: {why}"
        print(self.lost, file=sys.stderr, flush=True)

    # -- release -----------------------------------------------------------------------------

    def release(self) -> None:
        """Stop the heartbeat, then remove the lock if it is still this holder's."""
        self._stop.set()
        fencing.drop(self)
        try:  # no renewal after this point can put the file back, no acquisition comes in between
            with self._mutex, file_mutex(mutex_path(self.path)):
                holder = read_holder(self.path)
                if holder and self.token and holder.get("token") == self.token:
                    self.path.unlink(missing_ok=True)
        except MutexTimeout as err:  # left to expire with its lease (the heartbeat has stopped)
            print(f"trainer lock {self.path} not removed: {err}", file=sys.stderr, flush=True)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> LockReport:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
