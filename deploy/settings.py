"""Where the production instance lives and which ports it uses.

Each comes from a command-line option, else a variable, else its default:

| option | variable | default |
| --- | --- | --- |
| `--home` | `FLYWHEEL_PROD_HOME` | `.dagster-prod` (the production DAGSTER_HOME) |
| `--data-dir` | `FLYWHEEL_DATA_DIR` | `data` |
| `--pg-dir` | `FLYWHEEL_PG_DIR` | `<data dir>/postgres`: follows the data dir asked for now |
| `--pg-port` | `FLYWHEEL_PG_PORT` | the running deployment's, else a free port |
| `--code-server-port` | `FLYWHEEL_CODE_SERVER_PORT` | the running deployment's, else a free port |
| `--webserver-port` | `FLYWHEEL_WEBSERVER_PORT` | 3030 (`make ui` keeps 3000) |
| `--api-port` | `FLYWHEEL_API_PORT` | 8765 |

`<home>/deploy.json` records what a running deployment uses: `make up` writes it once the first piece
(PostgreSQL) runs, so a `make up` that failed before leaves nothing behind that steers the next one.
While a piece it recorded runs, its free ports are taken again (so `make up` twice agrees); it steers
no other setting. `make down` stops what it records, `make clean-prod` removes the cluster it records. A
`make up` whose settings differ from those of the deployment running on its home refuses, naming both
values (`differences`).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path

from deploy import guard
from deploy.processes import free_port, live_records
from outcome_flywheel.settings import PROJECT_ROOT

HOST = "127.0.0.1"  # every server of the production shape listens on loopback only
LOCATION_NAME = "outcome_flywheel"  # the code location's name, as `make ui` and the demo know it
DEFS_MODULE = "pipelines.definitions"
INSTANCE_TEMPLATE = Path(__file__).with_name("dagster.yaml")
PG_USER = "dagster"
PG_DB = "dagster"
# Each setting a `make up` may be given: (its variable, its option).
SETTINGS = {
    "data_dir": ("FLYWHEEL_DATA_DIR", "--data-dir"),
    "pg_dir": ("FLYWHEEL_PG_DIR", "--pg-dir"),
    "pg_port": ("FLYWHEEL_PG_PORT", "--pg-port"),
    "code_server_port": ("FLYWHEEL_CODE_SERVER_PORT", "--code-server-port"),
    "webserver_port": ("FLYWHEEL_WEBSERVER_PORT", "--webserver-port"),
    "api_port": ("FLYWHEEL_API_PORT", "--api-port"),
}


class ConflictError(RuntimeError):
    """A `make up` asked for settings other than those of the deployment running on its home."""


@dataclass
class Deployment:
    home: Path
    data_dir: Path
    pg_dir: Path
    pg_port: int
    code_server_port: int
    webserver_port: int
    api_port: int

    @property
    def state_file(self) -> Path:
        return self.home / guard.STATE_FILE

    @property
    def secrets_file(self) -> Path:
        return self.home / "instance.env"

    @property
    def workspace_file(self) -> Path:
        return self.home / "workspace.yaml"

    @property
    def webserver_url(self) -> str:
        return f"http://{HOST}:{self.webserver_port}"

    @property
    def service_url(self) -> str:
        return f"http://{HOST}:{self.api_port}"

    def save(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(
            json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()}, indent=1) + "\n"
        )
        tmp.replace(self.state_file)


def _absolute(path: str | Path) -> Path:
    path = Path(path)
    return (path if path.is_absolute() else PROJECT_ROOT / path).resolve()


def parser(prog: str, description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--home", help="the production DAGSTER_HOME (FLYWHEEL_PROD_HOME; default .dagster-prod)")
    p.add_argument("--data-dir", help="FLYWHEEL_DATA_DIR (default data)")
    p.add_argument("--pg-dir", help="the PostgreSQL cluster's folder (FLYWHEEL_PG_DIR; default <data dir>/postgres)")
    for name, var in (
        ("pg-port", "FLYWHEEL_PG_PORT"),
        ("code-server-port", "FLYWHEEL_CODE_SERVER_PORT"),
        ("webserver-port", "FLYWHEEL_WEBSERVER_PORT"),
        ("api-port", "FLYWHEEL_API_PORT"),
    ):
        p.add_argument(f"--{name}", type=int, help=f"{var}")
    return p


def home_of(args: argparse.Namespace) -> Path:
    return _absolute(args.home or os.environ.get("FLYWHEEL_PROD_HOME") or ".dagster-prod")


def recorded(home: Path) -> Deployment | None:
    """The deployment `<home>/deploy.json` records (the last one that started there), or None."""
    saved = guard.recorded(home)
    try:
        return Deployment(
            home=home,
            data_dir=Path(saved["data_dir"]),
            pg_dir=Path(saved["pg_dir"]),
            pg_port=int(saved["pg_port"]),
            code_server_port=int(saved["code_server_port"]),
            webserver_port=int(saved["webserver_port"]),
            api_port=int(saved["api_port"]),
        )
    except (KeyError, TypeError, ValueError):
        return None


def running_deployment(home: Path) -> Deployment | None:
    """The recorded deployment while a process it started runs (its pid file names a live process)."""
    return recorded(home) if live_records(home) else None


def resolve(args: argparse.Namespace) -> Deployment:
    """The deployment the options and the variables describe; what they leave out takes its default,
    a free port the one of the deployment running on the home. A saved deploy.json steers nothing else."""
    home = home_of(args)
    running = running_deployment(home)

    def given(option, key: str):
        value = option if option is not None else os.environ.get(SETTINGS[key][0])
        return None if value in (None, "") else value

    def port(option, key: str, default: int | None = None) -> int:
        """Given; else its default; else (no default: a free port) the running deployment's, or a new free one."""
        value = given(option, key)
        if value is not None:
            return int(value)
        if default is not None:
            return default
        return getattr(running, key) if running else free_port()

    data_dir = _absolute(given(args.data_dir, "data_dir") or "data")
    return Deployment(
        home=home,
        data_dir=data_dir,
        pg_dir=_absolute(given(args.pg_dir, "pg_dir") or data_dir / "postgres"),
        pg_port=port(args.pg_port, "pg_port"),
        code_server_port=port(args.code_server_port, "code_server_port"),
        webserver_port=port(args.webserver_port, "webserver_port", 3030),
        api_port=port(args.api_port, "api_port", 8765),
    )


def differences(wanted: Deployment, running: Deployment) -> list[str]:
    """One line per setting `wanted` gives otherwise than the `running` deployment uses, both values named."""
    lines = []
    for key, (variable, option) in SETTINGS.items():
        now, asked = getattr(running, key), getattr(wanted, key)
        if str(now) != str(asked):
            lines.append(
                f"{variable}: running on {now}, asked for {asked}; `make down` first, or set {variable} "
                f"(or {option}) to {now}"
            )
    return lines


def check_running(wanted: Deployment) -> None:
    """Raise ConflictError when a deployment runs on `wanted.home` with other settings (or with settings
    no deploy.json records any more)."""
    live = live_records(wanted.home)
    running = recorded(wanted.home) if live else None
    if live and running is None:
        raise ConflictError(
            f"a deployment runs on {wanted.home} ({', '.join(r.name for r in live)}), but {wanted.state_file} "
            "does not record its settings: `make down` first"
        )
    lines = differences(wanted, running) if running else []
    if lines:
        raise ConflictError(
            f"the deployment running on {wanted.home} uses other settings than those asked for:\n"
            + "\n".join(f"  {line}" for line in lines)
        )


def read_env_file(path: Path) -> dict[str, str]:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return {}
    return dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))


def instance_env(deployment: Deployment) -> dict[str, str]:
    """The DAGSTER_PG_* variables the instance file reads (and the service's token when none is
    set), made once and kept in `<home>/instance.env` (mode 0600)."""
    saved = read_env_file(deployment.secrets_file)
    values = {
        "DAGSTER_PG_USER": PG_USER,
        "DAGSTER_PG_DB": PG_DB,
        "DAGSTER_PG_HOST": HOST,
        "DAGSTER_PG_PORT": str(deployment.pg_port),
        "DAGSTER_PG_PASSWORD": saved.get("DAGSTER_PG_PASSWORD") or secrets.token_urlsafe(24),
    }
    if not os.environ.get("FLYWHEEL_API_TOKEN"):
        values["FLYWHEEL_API_TOKEN"] = saved.get("FLYWHEEL_API_TOKEN") or secrets.token_urlsafe(24)
    deployment.home.mkdir(parents=True, exist_ok=True)
    tmp = deployment.secrets_file.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("# The production instance's credentials (make up). Shell: set -a; . ./instance.env; set +a\n")
        f.writelines(f"{k}={v}\n" for k, v in values.items())
    tmp.replace(deployment.secrets_file)
    return values
