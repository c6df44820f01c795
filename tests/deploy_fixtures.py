"""Helpers for the tests of `make up`'s settings and `make clean`: real processes recorded as
deploy.processes records `make up`'s pieces, the scripts run as the Makefile runs them, and an
environment with none of the settings of this machine's own deployment."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from pathlib import Path

from deploy import processes
from outcome_flywheel.settings import PROJECT_ROOT

SETTING_VARIABLES = (
    "FLYWHEEL_PROD_HOME",
    "FLYWHEEL_DATA_DIR",
    "FLYWHEEL_PG_DIR",
    "FLYWHEEL_PG_PORT",
    "FLYWHEEL_CODE_SERVER_PORT",
    "FLYWHEEL_WEBSERVER_PORT",
    "FLYWHEEL_API_PORT",
    "FLYWHEEL_MLFLOW_PORT",
)  # deploy.settings.SETTINGS and the home


def scrubbed_env(**values: str) -> dict[str, str]:
    """os.environ without the deployment settings (a test never reaches this machine's data/ or
    .dagster-prod by accident), plus `values`."""
    env = {k: v for k, v in os.environ.items() if k not in SETTING_VARIABLES}
    env.update(OMP_NUM_THREADS="1", FLYWHEEL_DAILY_SCHEDULE="off", **values)
    return env


def run_module(
    module: str, args: list[str], env: dict[str, str], python: list[str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*(python or [sys.executable]), "-m", module, *args],
        env=env,
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@contextlib.contextmanager
def piece(home: Path, name: str = "daemon"):
    """A cheap real process recorded as `make up` records `name` (its pid file under `home`); stopped after."""
    record = processes.start(home, name, ["sleep", "600"], dict(os.environ), home)
    try:
        yield record
    finally:
        processes.stop(home, name, grace_s=5)


@contextlib.contextmanager
def taken_port():
    """A port on 127.0.0.1 something listens on: PostgreSQL cannot start there."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def free_ports() -> list[str]:
    """--code-server-port, --webserver-port, --api-port and --mlflow-port on free ports (not 3030, 8765 and 5050,
    which may be in use)."""
    return [
        a
        for name in ("code-server", "webserver", "api", "mlflow")
        for a in (f"--{name}-port", str(processes.free_port()))
    ]
