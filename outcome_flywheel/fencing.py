"""Short-lived file mutexes, and the trainer lock's fencing tokens (Kleppmann's fencing tokens).

`file_mutex(path)`: an exclusive `flock` on `path` for a few milliseconds (a read-modify-write of a
small table, a pointer swap). The kernel drops it when its process dies, SIGKILL included, so it is
never left behind; a process stopped while holding one (SIGSTOP, a frozen host) holds it until it
resumes, and the others wait (up to their timeout). The file stays in place (removing a flocked
file would let two processes lock two different files). On a shared volume (NFSv4, a Kubernetes
ReadWriteMany volume) Linux maps `flock` onto the server's byte-range locks, so pods exclude each
other too.

Fencing: the trainer lock's lease lets a holder frozen past it (SIGSTOP, a suspended host, a long
GC pause) lose the lock to another trainer while it cannot tell. So every acquisition takes a number
that only grows (`locks/trainer.lock.fence`, issued under the mutex `locks/trainer.lock.mutex` by
`TrainerLock.acquire`, written into the lock file as `fence`), and every publication of a training's
result (a checkpoint folder, a `latest` pointer) runs inside `publishing(what)`: under the same
mutex, so that no acquisition can come in between, the holder checks that the lock file still names
it and that no later token was issued; otherwise it raises `FencedOut` and publishes nothing.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Protocol

MUTEX_TIMEOUT_S = 60.0  # a mutex is held for milliseconds; this long means its holder is frozen


class MutexTimeout(TimeoutError):
    """Another process kept the mutex past the timeout (it is stopped: SIGSTOP, a frozen host)."""


class FencedOut(RuntimeError):
    """The trainer lock was lost (a later holder, or the lock cleared as stale): nothing published."""


@contextmanager
def file_mutex(path: Path, timeout_s: float = MUTEX_TIMEOUT_S, poll_s: float = 0.002) -> Iterator[None]:
    """Hold an exclusive `flock` on `path` meanwhile (threads and processes exclude each other)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise MutexTimeout(
                        f"{path}: held by another process for over {timeout_s:g} s (stopped while holding it: "
                        "SIGSTOP, a frozen host)"
                    ) from None
                time.sleep(poll_s)
        yield
    finally:
        os.close(fd)  # releases the flock


# -- fencing tokens ------------------------------------------------------------------------------


def mutex_path(lock_path: Path) -> Path:
    return Path(lock_path).with_name(f"{Path(lock_path).name}.mutex")


def fence_path(lock_path: Path) -> Path:
    return Path(lock_path).with_name(f"{Path(lock_path).name}.fence")


def last_fence(lock_path: Path) -> dict:
    """The last token issued and its holder (`{"fence": 0}` before the first, or if unreadable)."""
    try:
        data = json.loads(fence_path(lock_path).read_text())
        return data if isinstance(data.get("fence"), int) else {"fence": 0}
    except (OSError, ValueError, AttributeError):
        return {"fence": 0}


def issue_fence(lock_path: Path, holder: dict) -> int:
    """The next token, recorded (with its holder) before the lock file is created: call it holding
    `mutex_path(lock_path)`. A token is never issued twice, even if the lock is not taken after all."""
    fence = last_fence(lock_path)["fence"] + 1
    record = {"fence": fence, **{k: holder.get(k) for k in ("pid", "host", "tier", "training_id", "token")}}
    path = fence_path(lock_path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "w") as f:
        f.write(json.dumps(record))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return fence


class Holder(Protocol):
    path: Path
    token: str
    fence: int
    lost: str


_held: list[Holder] = []  # the trainer locks this process holds, innermost last (TrainerLock registers)


def hold(lock: Holder) -> None:
    _held.append(lock)


def drop(lock: Holder) -> None:
    if lock in _held:
        _held.remove(lock)


def _who(holder: dict) -> str:
    name = f"PID {holder.get('pid')} on {holder.get('host')} ({holder.get('tier')}"
    return f"{name}, {holder['training_id']})" if holder.get("training_id") else f"{name})"


def fence_verdict(lock: Holder, what: str) -> str:
    """Why `lock`'s holder may not publish `what` now ("" when it may): call it holding the mutex."""
    last = last_fence(lock.path)
    try:
        current = json.loads(Path(lock.path).read_text() or "{}")
    except FileNotFoundError:
        current = None
    except (OSError, ValueError):
        current = {}
    if last["fence"] > lock.fence:
        return f"trainer lease lost to {_who(last)} (token {lock.fence} < {last['fence']}): {what} not published"
    if not isinstance(current, dict) or current.get("token") != lock.token:
        state = "is gone (cleared as stale)" if current is None else f"names another holder: {_who(current or {})}"
        why = f"; {lock.lost}" if lock.lost else ""
        return f"trainer lease lost (token {lock.fence}): the lock file {lock.path} {state}{why}: {what} not published"
    return ""


@contextmanager
def publishing(what: str, timeout_s: float = MUTEX_TIMEOUT_S) -> Iterator[None]:
    """Publish `what` in the body only while this process's trainer lock is still its own: under the
    lock's mutex (no acquisition can come in between), its token checked; `FencedOut` otherwise. A
    process holding no trainer lock (a tool, a test) publishes unchecked."""
    if not _held:
        yield
        return
    lock = _held[-1]
    with file_mutex(mutex_path(lock.path), timeout_s):
        why = fence_verdict(lock, what)
        if why:
            raise FencedOut(why)
        yield
