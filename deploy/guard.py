"""What says a production deployment runs, read with the standard library alone (so `make clean` and
`make clean-prod` work before `make setup`, with a bare python3):

- `<home>/up.lock`: held (flock) by `make up` from its start to its end, its pid inside; a `make up`
  still starting has no pid file yet, and a second `make up` on the same home is refused;
- `<home>/pids/<name>.pid` (deploy.processes): checked as `make down` checks them, the pid naming the
  recorded process by start time and command line, where psutil is importable; without it by the pid
  and its command line in /proc (a live pid whose command line cannot be read counts as running);
- `<cluster>/postmaster.pid`: a PostgreSQL server runs on that cluster, whatever recorded it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from dataclasses import dataclass
from pathlib import Path

LOCK_FILE = "up.lock"
STATE_FILE = "deploy.json"


class Busy(RuntimeError):
    """Another `make up` holds the home's lock."""


@dataclass
class Running:
    what: str  # a piece's name ("daemon", "postgres"...), "make up", or "PostgreSQL server"
    pid: int
    detail: str  # its command line, or the cluster it serves

    def __str__(self) -> str:
        return f"{self.what:<12} pid {self.pid:<8} {self.detail}"


@contextlib.contextmanager
def up_lock(home: Path):
    """Held while `make up` runs on `home`; raises Busy, naming the holder, when another one does."""
    home.mkdir(parents=True, exist_ok=True)
    with open(home / LOCK_FILE, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            raise Busy(
                f"another `make up` is running on {home} (pid {f.read().strip() or '?'}); wait for it to finish"
            ) from None
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        yield  # closing the file releases the lock, also when the process dies


def up_running(home: Path) -> int | None:
    """The pid of the `make up` running on `home` (0 when it has not written it yet), or None."""
    try:
        f = open(home / LOCK_FILE)
    except (FileNotFoundError, NotADirectoryError):
        return None
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = f.read().strip()
            return int(text) if text.isdigit() else 0
        fcntl.flock(f, fcntl.LOCK_UN)
        return None


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    return True


def _alive_as(pid: int, cmdline: list[str]) -> bool:
    """Without psutil: `pid` lives and (where /proc tells) runs the recorded command line."""
    if pid <= 0 or not _pid_exists(pid):
        return False
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        actual = [a.decode(errors="replace") for a in raw.removesuffix(b"\0").split(b"\0")] if raw else []
    except OSError:
        return True  # no /proc here (macOS): a live pid counts as running
    return not cmdline or actual[:3] == cmdline[:3]  # a zombie's command line reads empty


def live_pieces(home: Path) -> list[Running]:
    """What of `make up` runs on `home`: `make up` itself, and each process a pid file names."""
    found = []
    holder = up_running(home)
    if holder is not None:
        found.append(Running("make up", holder, f"starting the deployment of {home}"))
    try:
        from deploy import processes  # psutil: the very checks `make down` makes
    except ImportError:
        processes = None
    for path in sorted((home / "pids").glob("*.pid")):
        name = path.stem
        if processes is not None:
            record = processes.running(home, name)
            if record:
                found.append(Running(name, record.pid, " ".join(record.cmdline[:3])))
            continue
        try:
            lines = path.read_text().splitlines()
            pid = int(lines[0])
            cmdline = (json.loads(lines[1]).get("cmdline") or []) if len(lines) > 1 else []
        except (OSError, ValueError, AttributeError):
            continue
        if _alive_as(pid, cmdline):
            found.append(Running(name, pid, " ".join(cmdline[:3]) or "(command line not recorded)"))
    return found


def is_cluster(folder: Path) -> bool:
    """`folder` holds a PostgreSQL cluster (initdb's PG_VERSION)."""
    try:
        return (folder / "PG_VERSION").is_file()
    except PermissionError:  # another user's 0700 folder: the `postgres` user's cluster, as root made it
        return True


def cluster_server(folder: Path) -> int | None:
    """The pid of the PostgreSQL server running on the cluster in `folder`, or None."""
    try:
        pid = int((folder / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None
    if not _pid_exists(pid):
        return None
    try:
        name = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return pid  # no /proc: a live pid counts
    return pid if name.startswith(("postgres", "postmaster")) else None  # a stale file whose pid was reused


def find_clusters(root: Path) -> list[Path]:
    """The PostgreSQL clusters under `root` (symbolic links not followed), and folders that cannot be read."""
    found: list[Path] = []

    def visit(folder: Path) -> None:
        try:
            entries = list(os.scandir(folder))
        except PermissionError:
            found.append(folder)  # cannot look inside: kept as a cluster would be
            return
        except OSError:
            return
        if any(e.name == "PG_VERSION" for e in entries):
            found.append(folder)
            return
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                visit(Path(entry.path))

    if root.is_dir() and not root.is_symlink():
        visit(root)
    return sorted(found)


def recorded(home: Path) -> dict:
    """What `<home>/deploy.json` records (the deployment that last started there), or {}."""
    try:
        saved = json.loads((home / STATE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return saved if isinstance(saved, dict) else {}
