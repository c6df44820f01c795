"""The processes `make up` starts, recorded so `make down` stops exactly those.

Each started process gets a pid file `<home>/pids/<name>.pid`: the pid on the first line, then one
JSON line with what names that process and no other (its start time and command line), because a
pid the system hands out again belongs to someone else. Each is started in its own session, so the
processes it starts (the code server's run workers, their step processes) share its process group
and are stopped with it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

START_TIME_TOLERANCE_S = 0.05  # psutil reads the start time in clock ticks; the same process reads the same


class StartupError(RuntimeError):
    """A piece did not come up; the message names it and its log."""


@dataclass
class ProcessRecord:
    name: str
    pid: int
    create_time: float
    cmdline: list[str]
    log: str = ""

    @classmethod
    def of(cls, name: str, pid: int, log: str = "") -> "ProcessRecord":
        process = psutil.Process(pid)
        deadline = time.monotonic() + 5
        # Just after fork, before exec has filled it in, /proc/<pid>/cmdline reads empty.
        while not (cmdline := process.cmdline()) and time.monotonic() < deadline:
            time.sleep(0.05)
        return cls(name=name, pid=pid, create_time=process.create_time(), cmdline=cmdline, log=log)

    def process(self) -> psutil.Process | None:
        """The live process this record names, or None (gone, a zombie, or the pid now names another process)."""
        try:
            process = psutil.Process(self.pid)
            same = (
                abs(process.create_time() - self.create_time) < START_TIME_TOLERANCE_S
                and bool(self.cmdline)
                and process.cmdline()[:3] == self.cmdline[:3]
            )
            return process if same and process.status() != psutil.STATUS_ZOMBIE else None
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return None


def pid_dir(home: Path) -> Path:
    return home / "pids"


def log_dir(home: Path) -> Path:
    # Not <home>/logs: Dagster keeps its telemetry queue there and empties it.
    return home / "process-logs"


def write_record(home: Path, record: ProcessRecord) -> Path:
    path = pid_dir(home) / f"{record.name}.pid"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{record.pid}\n{json.dumps(asdict(record))}\n")
    tmp.replace(path)  # atomic: `make down` never reads half a record
    return path


def read_record(home: Path, name: str) -> ProcessRecord | None:
    path = pid_dir(home) / f"{name}.pid"
    try:
        lines = path.read_text().splitlines()
        return ProcessRecord(**json.loads(lines[1]))
    except (FileNotFoundError, IndexError, ValueError, TypeError):
        return None


def remove_record(home: Path, name: str) -> None:
    (pid_dir(home) / f"{name}.pid").unlink(missing_ok=True)


def running(home: Path, name: str) -> ProcessRecord | None:
    """The record of `name` when the process it names is alive."""
    record = read_record(home, name)
    return record if record and record.process() else None


def live_records(home: Path) -> list[ProcessRecord]:
    """The records of every pid file under `home` whose process is alive."""
    return [record for path in sorted(pid_dir(home).glob("*.pid")) if (record := running(home, path.stem))]


def _clean_signals() -> None:
    """In the child before exec: no signal blocked, TERM / INT / HUP at their defaults, as a service manager
    starts a service. A mask or an ignored TERM is inherited through exec (a caller's thread that blocked it, a
    shell that ignored it), and a piece started with it would outlive `stop`'s TERM until the KILL."""
    signal.pthread_sigmask(signal.SIG_SETMASK, ())
    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        try:
            signal.signal(number, signal.SIG_DFL)
        except ValueError:  # forked from a thread other than the main one: Python refuses; the mask is reset
            pass


def start(home: Path, name: str, command: list[str], env: dict[str, str], cwd: Path) -> ProcessRecord:
    """Start `command` detached (its own session, output to `<home>/process-logs/<name>.log`) and record it."""
    log_path = log_dir(home) / f"{name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            command,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_clean_signals,
        )
    record = ProcessRecord.of(name, process.pid, str(log_path))
    write_record(home, record)
    return record


def _group(leader: psutil.Process) -> list[psutil.Process]:
    """The leader's descendants and the members of its process group started since it was (a run
    worker whose parent died is still in the group, though no longer a descendant)."""
    members = {p.pid: p for p in leader.children(recursive=True)}
    for process in psutil.process_iter(["create_time"]):
        try:
            if (
                process.pid != leader.pid
                and os.getpgid(process.pid) == leader.pid
                and process.info["create_time"] >= leader.create_time()
            ):
                members.setdefault(process.pid, process)
        except (ProcessLookupError, psutil.NoSuchProcess, PermissionError):
            continue
    return list(members.values())


def orphans(record: ProcessRecord) -> list[psutil.Process]:
    """What is left of the process group of a recorded process that is gone (killed: the MLflow server's
    workers, the code server's run workers). Its pid is not handed out again while its group has members, so
    those are the ones it started; a live process with its pid (itself, or its pid reused) leaves none."""
    try:
        if psutil.Process(record.pid).status() != psutil.STATUS_ZOMBIE:
            return []
    except psutil.NoSuchProcess:
        pass
    found = []
    for process in psutil.process_iter(["create_time"]):
        try:
            if (
                process.pid != record.pid
                and os.getpgid(process.pid) == record.pid
                and process.info["create_time"] >= record.create_time
            ):
                found.append(process)
        except (ProcessLookupError, psutil.NoSuchProcess, PermissionError):
            continue
    return found


def _exited(process: psutil.Process) -> bool:
    """Gone, or a zombie: it has exited, and only its parent's reaping is left (an orphan's parent is the
    machine's init, which in a container may reap late or never)."""
    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_exited(processes: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Those of `processes` still running after `timeout` seconds (a zombie counts as exited)."""
    deadline = time.monotonic() + timeout
    alive = [p for p in processes if not _exited(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if not _exited(p)]
    return alive


def _end(rest: list[psutil.Process]) -> list[psutil.Process]:
    """TERM `rest`, KILL what is left after 10 s; returns those killed."""
    for process in rest:
        try:
            process.terminate()
        except psutil.NoSuchProcess:
            pass
    alive = _wait_exited(rest, timeout=10)
    for process in alive:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    _wait_exited(alive, timeout=10)
    return alive


def stop(home: Path, name: str, grace_s: float = 30.0) -> str:
    """TERM the recorded process, wait, then its group; KILL what is left. Returns what happened. A recorded
    process that is gone: what is left of its group (`orphans`) is stopped the same way."""
    record = read_record(home, name)
    if record is None:
        return f"{name}: no pid file"
    leader = record.process()
    if leader is None:
        left = orphans(record)
        killed = _end(left) if left else []
        remove_record(home, name)
        more = f"; stopped {len(left)} process(es) it had started" if left else ""
        more += f", {len(killed)} killed after the grace period" if killed else ""
        return f"{name}: pid {record.pid} was not running (stale pid file removed){more}"
    members = _group(leader)
    leader.send_signal(signal.SIGTERM)
    _wait_exited([leader], timeout=grace_s)
    try:
        leader.wait(timeout=0)  # reaps it when it is this process's child
    except (psutil.TimeoutExpired, psutil.NoSuchProcess):
        pass
    alive = _end([p for p in members + [leader] if not _exited(p)])
    remove_record(home, name)
    killed = f", {len(alive)} killed after the grace period" if alive else ""
    return f"{name}: stopped pid {record.pid} ({' '.join(record.cmdline[:3])}) and {len(members)} process(es) it started{killed}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(
            socket.SOL_SOCKET, socket.SO_REUSEADDR, 1
        )  # as the servers bind: a closed socket's TIME_WAIT is no owner
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def wait_until(check, timeout_s: float, what: str, interval_s: float = 0.5, process: ProcessRecord | None = None):
    """Poll `check()` until it returns something truthy; raise naming `what` (and the log) on timeout
    or when `process` died meanwhile."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except StartupError:
            raise
        except Exception:  # not up yet: connection refused, a half-started server
            pass
        if process is not None and process.process() is None:
            raise StartupError(f"{what}: the process exited; see {process.log}")
        time.sleep(interval_s)
    raise StartupError(f"{what}: not ready after {timeout_s:.0f} s" + (f"; see {process.log}" if process else ""))
