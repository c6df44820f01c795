"""Where the production instance lives and which ports it uses.

Each comes from a command-line option, else a variable, else what the last `make up` chose (kept in
`<home>/deploy.json`, so `make up` twice and `make down` agree), else the default:

| option | variable | default |
| --- | --- | --- |
| `--home` | `FLYWHEEL_PROD_HOME` | `.dagster-prod` (the production DAGSTER_HOME) |
| `--data-dir` | `FLYWHEEL_DATA_DIR` | `data` |
| `--pg-dir` | `FLYWHEEL_PG_DIR` | `<data dir>/postgres` |
| `--pg-port` | `FLYWHEEL_PG_PORT` | a free port |
| `--code-server-port` | `FLYWHEEL_CODE_SERVER_PORT` | a free port |
| `--webserver-port` | `FLYWHEEL_WEBSERVER_PORT` | 3030 (`make ui` keeps 3000) |
| `--api-port` | `FLYWHEEL_API_PORT` | 8765 |
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path

from deploy.processes import free_port
from outcome_flywheel.settings import PROJECT_ROOT

HOST = "127.0.0.1"  # every server of the production shape listens on loopback only
LOCATION_NAME = "outcome_flywheel"  # the code location's name, as `make ui` and the demo know it
DEFS_MODULE = "pipelines.definitions"
INSTANCE_TEMPLATE = Path(__file__).with_name("dagster.yaml")
PG_USER = "dagster"
PG_DB = "dagster"


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
        return self.home / "deploy.json"

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
        tmp.write_text(json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()}, indent=1) + "\n")
        tmp.replace(self.state_file)


def _absolute(path: str | Path) -> Path:
    path = Path(path)
    return (path if path.is_absolute() else PROJECT_ROOT / path).resolve()


def parser(prog: str, description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--home", help="the production DAGSTER_HOME (FLYWHEEL_PROD_HOME; default .dagster-prod)")
    p.add_argument("--data-dir", help="FLYWHEEL_DATA_DIR (default data)")
    p.add_argument("--pg-dir", help="the PostgreSQL cluster's folder (FLYWHEEL_PG_DIR; default <data dir>/postgres)")
    for name, var in (("pg-port", "FLYWHEEL_PG_PORT"), ("code-server-port", "FLYWHEEL_CODE_SERVER_PORT"),
                      ("webserver-port", "FLYWHEEL_WEBSERVER_PORT"), ("api-port", "FLYWHEEL_API_PORT")):
        p.add_argument(f"--{name}", type=int, help=f"{var}")
    return p


def resolve(args: argparse.Namespace) -> Deployment:
    """The deployment the options, the variables and the last `make up` describe."""
    home = _absolute(args.home or os.environ.get("FLYWHEEL_PROD_HOME") or ".dagster-prod")
    try:
        saved = json.loads((home / "deploy.json").read_text())
    except (FileNotFoundError, ValueError):
        saved = {}

    def pick(option, variable: str, key: str, default):
        value = option if option is not None else os.environ.get(variable) or saved.get(key)
        return default() if value in (None, "") else value

    data_dir = _absolute(pick(args.data_dir, "FLYWHEEL_DATA_DIR", "data_dir", lambda: "data"))
    return Deployment(
        home=home,
        data_dir=data_dir,
        pg_dir=_absolute(pick(args.pg_dir, "FLYWHEEL_PG_DIR", "pg_dir", lambda: data_dir / "postgres")),
        pg_port=int(pick(args.pg_port, "FLYWHEEL_PG_PORT", "pg_port", free_port)),
        code_server_port=int(pick(args.code_server_port, "FLYWHEEL_CODE_SERVER_PORT", "code_server_port", free_port)),
        webserver_port=int(pick(args.webserver_port, "FLYWHEEL_WEBSERVER_PORT", "webserver_port", lambda: 3030)),
        api_port=int(pick(args.api_port, "FLYWHEEL_API_PORT", "api_port", lambda: 8765)),
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
        "DAGSTER_PG_USER": PG_USER, "DAGSTER_PG_DB": PG_DB, "DAGSTER_PG_HOST": HOST, "DAGSTER_PG_PORT": str(deployment.pg_port),
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
