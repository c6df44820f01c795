"""Run `python -m <module> args...` as a child of a process that has already imported what every benchmark
imports (torch, transformers and peft, dagster, pandas, mlflow...: ~6 CPU-s a benchmark on the 2-core box).

The server reads one request per line on stdin (module, args, cwd, environment, output files), forks, and
the child runs the module as `__main__` (runpy, as `python -m` does) with its own environment, working
directory, argv and stdout / stderr files, then exits through the interpreter's normal shutdown (atexit
handlers run), with the module's exit status. The server answers the child's pid, then its exit status.
Forking is safe here because the server holds no thread when it forks (it checks: a library that started
one at import would make a forked child's locks unreliable).

The environment variables a library reads when it is imported (OMP_NUM_THREADS for torch's thread pool,
HF_HOME...) are the server's own: start it with the environment the benchmarks share, and vary only what
the project reads at run time (FLYWHEEL_DATA_DIR...).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

PRELOAD = ("peft", "transformers", "torch", "dagster", "pandas", "duckdb", "pyarrow", "scipy.stats", "mlflow")

SERVER = r"""
import importlib, json, os, runpy, sys, threading, traceback
for name in sys.argv[1:]:
    importlib.import_module(name)
print(json.dumps({"ready": threading.active_count()}), flush=True)
for line in sys.stdin:
    request = json.loads(line)
    if threading.active_count() != 1:
        raise SystemExit(f"the fork server holds {threading.active_count()} threads: forking is not safe")
    pid = os.fork()
    if pid == 0:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
        sys.stdin = open(os.devnull)
        sys.argv = [request["module"], *request["args"]]
        try:
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        except SystemExit:
            raise
        except BaseException:
            traceback.print_exc()
            raise SystemExit(1)
        raise SystemExit(0)
    print(json.dumps({"pid": pid}), flush=True)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), flush=True)
"""


class ForkServer:
    """A server process (`SERVER`) started with `env`; `run` forks one module run off it."""

    def __init__(self, env: dict[str, str], cwd: Path, preload: tuple[str, ...] = PRELOAD):
        self.process = subprocess.Popen(
            [sys.executable, "-c", SERVER, *preload],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._pending = b""  # what the server wrote past the last whole line read
        ready = json.loads(self._line(300))
        if ready.get("ready") != 1:
            raise RuntimeError(f"the fork server started threads on import: {ready}")

    def _line(self, timeout: float) -> str:
        """The server's next line, read from its pipe's file descriptor (a buffered reader could hold a line
        select() no longer sees, and wait the whole timeout for it)."""
        deadline = time.monotonic() + timeout
        fd = self.process.stdout.fileno()
        while b"\n" not in self._pending:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(fd, 65536) if ready else b""
            if not chunk:
                raise TimeoutError(f"the fork server said nothing within {timeout:.0f} s (exit {self.process.poll()})")
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return line.decode()

    def run(
        self, module: str, args: list[str], cwd: Path, env: dict[str, str], out_dir: Path, timeout: float
    ) -> subprocess.CompletedProcess:
        """`python -m module args` in a forked child: its exit status, stdout and stderr (kept in `out_dir`);
        past `timeout` seconds the child is killed (exit status -9)."""
        stdout, stderr = out_dir / f"{module}.stdout", out_dir / f"{module}.stderr"
        request = dict(module=module, args=args, cwd=str(cwd), env=env, stdout=str(stdout), stderr=str(stderr))
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        started = time.monotonic()
        pid = json.loads(self._line(60))["pid"]
        try:
            returncode = json.loads(self._line(timeout - (time.monotonic() - started)))["returncode"]
        except TimeoutError:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:  # it ended as the timeout ran out: its status is on the way
                pass
            returncode = json.loads(self._line(60))["returncode"]
        return subprocess.CompletedProcess(
            [module, *args], returncode, stdout.read_text(errors="replace"), stderr.read_text(errors="replace")
        )

    def close(self) -> None:
        self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
