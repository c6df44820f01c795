"""What says a production deployment runs, read with the standard library alone (so `make clean` and
`make clean-prod` work before `make setup`, with a bare python3):

- `<home>/up.lock`: held (flock) by `make up` from its start to its end (and by `make down` while it
  stops the pieces), its pid and name inside; a `make up` still starting has no pid file yet, and a
  second `make up` on the same home is refused;
- `<home>/up.stop`: `make down`'s request to the `make up` holding the lock (its pid inside) to stop;
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
STOP_FILE = "up.stop"
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
def up_lock(home: Path, what: str = "make up"):
    """Held while `make up` (or `make down`: `what`) runs on `home`; raises Busy, naming the holder,
    when another one does."""
    home.mkdir(parents=True, exist_ok=True)
    with open(home / LOCK_FILE, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            pid, holder = _holder(f.read())
            raise Busy(f"another `{holder}` is running on {home} (pid {pid or '?'}); wait for it to finish") from None
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n{what}\n")
        f.flush()
        yield  # closing the file releases the lock, also when the process dies


def _holder(text: str) -> tuple[int, str]:
    lines = text.splitlines()
    pid = int(lines[0]) if lines and lines[0].strip().isdigit() else 0
    return pid, (lines[1].strip() if len(lines) > 1 and lines[1].strip() else "make up")


def lock_holder(home: Path) -> tuple[int, str] | None:
    """(pid, "make up" or "make down") of what holds `home`'s lock (pid 0: not written yet), or None."""
    try:
        f = open(home / LOCK_FILE)
    except (FileNotFoundError, NotADirectoryError):
        return None
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _holder(f.read())
        fcntl.flock(f, fcntl.LOCK_UN)
        return None


def up_running(home: Path) -> int | None:
    """The pid of the `make up` (or `make down`) running on `home` (0 when not written yet), or None."""
    holder = lock_holder(home)
    return None if holder is None else holder[0]


def request_stop(home: Path, pid: int, by: str) -> None:
    """Ask the `make up` of pid `pid` to stop (it reads this file when it gets SIGTERM)."""
    tmp = home / f"{STOP_FILE}.tmp"
    tmp.write_text(f"{pid}\n{by}\n")
    tmp.replace(home / STOP_FILE)


def stop_request(home: Path, pid: int) -> str | None:
    """Who asked the `make up` of pid `pid` to stop, or None."""
    try:
        lines = (home / STOP_FILE).read_text().splitlines()
    except OSError:
        return None
    return lines[1] if len(lines) > 1 and lines[0] == str(pid) else None


def clear_stop_request(home: Path) -> None:
    (home / STOP_FILE).unlink(missing_ok=True)


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
    holder = lock_holder(home)
    if holder is not None:
        doing = "starting" if holder[1] == "make up" else "stopping"
        found.append(Running(holder[1], holder[0], f"{doing} the deployment of {home}"))
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


# -- processes that use a folder, whoever started them ---------------------------------------------
# A deployment started with another FLYWHEEL_PROD_HOME than the one `make clean` is told of has pid
# files it never reads: the processes themselves say what they use (Linux's /proc; elsewhere none found).
PATH_VARIABLES = ("FLYWHEEL_DATA_DIR", "DAGSTER_HOME")  # read relative to the process's folder when relative


def _under(path: Path, folders: list[Path]) -> Path | None:
    return next((f for f in folders if path == f or f in path.parents), None)


def _proc(pid: str, name: str) -> bytes:
    return Path(f"/proc/{pid}/{name}").read_bytes()


def _parent(pid: str) -> int:
    stat = _proc(pid, "stat").decode(errors="replace")
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def _use(pid: str, folders: list[Path]) -> str | None:
    """How process `pid` uses one of `folders` (its folder, a variable, an open file), or None."""
    cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
    found = _under(cwd, folders)
    if found:
        return f"works in {cwd}"
    try:
        environ = dict(
            item.split("=", 1) for item in _proc(pid, "environ").decode(errors="replace").split("\0") if "=" in item
        )
    except OSError:
        environ = {}
    for name, value in sorted(environ.items()):
        if not (name.startswith("FLYWHEEL_") or name in PATH_VARIABLES) or not value:
            continue
        if value.startswith("/") or name in PATH_VARIABLES:
            path = Path(os.path.normpath(cwd / Path(value).expanduser()))
            if _under(path, folders):
                return f"{name}={value}"
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        fds = []
    for fd in fds:
        try:
            target = Path(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
        if target.is_absolute() and _under(target, folders):
            return f"has {target} open"
    return None


def users_of(folders: list[Path], known: set[int] = frozenset()) -> list[Running]:
    """The live processes that use `folders` (their folder, a FLYWHEEL_* or DAGSTER_HOME path, an open
    file), this one and its ancestors aside; a process another listed one (or one of `known`) started
    is counted with it, not listed."""
    folders = [Path(os.path.realpath(f)) for f in folders]
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []
    parents, uses = {}, {}
    for pid in pids:
        try:
            parents[int(pid)] = _parent(pid)
            if _proc(pid, "cmdline"):  # kernel threads and zombies have none
                use = _use(pid, folders)
                if use:
                    uses[int(pid)] = use
        except (OSError, ValueError, IndexError):
            continue
    skip, pid = set(), os.getpid()
    while pid > 1 and pid not in skip:  # `make clean` itself and what runs it (make, a shell in data/)
        skip.add(pid)
        pid = parents.get(pid, 0)
    uses = {p: use for p, use in uses.items() if p not in skip}

    def starter(pid: int) -> int | None:
        seen = set()
        while (pid := parents.get(pid, 0)) > 1 and pid not in seen:
            seen.add(pid)
            if pid in uses or pid in known:
                return pid
        return None

    started = {p: starter(p) for p in uses}
    listed = sorted(p for p, s in started.items() if s is None and p not in known)
    found = []
    for pid in listed:
        children = sum(1 for s in started.values() if s == pid)
        try:
            name = _proc(str(pid), "comm").decode(errors="replace").strip()
        except OSError:
            name = "process"
        more = f" (and {children} process(es) it started)" if children else ""
        found.append(Running(name, pid, uses[pid] + more))
    return found
