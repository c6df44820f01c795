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
| `--mlflow-port` | `FLYWHEEL_MLFLOW_PORT` | 5050 (the MLflow server; `mlflow ui` keeps 5000) |

`<home>/deploy.json` records what a running deployment uses: `make up` writes it once the first piece
(PostgreSQL) runs, so a `make up` that failed before leaves nothing behind that steers the next one.
While a piece it recorded runs, its free ports are taken again (so `make up` twice agrees); it steers
no other setting. `make down` stops what it records, `make clean-prod` removes the cluster it records. A
`make up` whose settings differ from those of the deployment running on its home refuses, naming both
values (`differences`): the folders and ports above, and every other FLYWHEEL_* variable `make up`
hands its processes (the base model, the warehouse URL, the service's token...: `applied_settings`).
The token is recorded as a salted digest, never as itself.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path

from deploy import guard
from deploy.processes import free_port, live_records
from outcome_flywheel.settings import DEFAULTS, PROJECT_ROOT, SECRETS

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
    "mlflow_port": ("FLYWHEEL_MLFLOW_PORT", "--mlflow-port"),
}
MLFLOW_PORT = int(DEFAULTS["FLYWHEEL_MLFLOW_PORT"])  # the settings table holds each default once


TOKEN = "FLYWHEEL_API_TOKEN"
NEW_TOKEN = "a new one"  # nothing set and nothing kept: `make up` makes one (instance_env)
# FLYWHEEL_* variables `make up` does not hand on as they are: compared above (SETTINGS), set by it
# for every process (process_env), or an action of this `make up` only (the daily schedule).
NOT_APPLIED = {
    *(variable for variable, _ in SETTINGS.values()),
    "FLYWHEEL_PROD_HOME",
    "FLYWHEEL_API_HOST",
    "FLYWHEEL_DAGSTER_URL",
    "FLYWHEEL_DAILY_SCHEDULE",
}


class ConflictError(RuntimeError):
    """A `make up` asked for settings other than those of the deployment running on its home."""


class SettingError(RuntimeError):
    """A setting of `make up` that cannot be used (the message names it and what is allowed)."""


@dataclass
class Deployment:
    home: Path
    data_dir: Path
    pg_dir: Path
    pg_port: int
    code_server_port: int
    webserver_port: int
    api_port: int
    mlflow_port: int = MLFLOW_PORT  # 0: not recorded (a deploy.json written before the MLflow server was a piece)
    # The other FLYWHEEL_* values its processes get (secrets as salted digests); None: not recorded
    # (a deploy.json written before they were).
    applied: dict[str, str] | None = None

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

    @property
    def mlflow_url(self) -> str:
        return f"http://{HOST}:{self.mlflow_port}"

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
        ("mlflow-port", "FLYWHEEL_MLFLOW_PORT"),
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
            mlflow_port=int(saved.get("mlflow_port") or 0),
            applied=saved["applied"] if isinstance(saved.get("applied"), dict) else None,
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
            if not str(value).isdigit() or not 1 <= int(value) <= 65535:
                variable, flag = SETTINGS[key]
                raise SettingError(f"{variable} (or {flag}) is {value!r}: allowed: a port, an integer from 1 to 65535")
            return int(value)
        if default is not None:
            return default
        return getattr(running, key) if running else free_port()

    data_dir = _absolute(given(args.data_dir, "data_dir") or "data")
    salt = _salt((running.applied or {}).get(TOKEN, "") if running else "")
    stored = read_env_file(home / "instance.env").get(TOKEN)
    return Deployment(
        home=home,
        data_dir=data_dir,
        pg_dir=_absolute(given(args.pg_dir, "pg_dir") or data_dir / "postgres"),
        pg_port=port(args.pg_port, "pg_port"),
        code_server_port=port(args.code_server_port, "code_server_port"),
        webserver_port=port(args.webserver_port, "webserver_port", int(DEFAULTS["FLYWHEEL_WEBSERVER_PORT"])),
        api_port=port(args.api_port, "api_port", int(DEFAULTS["FLYWHEEL_API_PORT"])),
        mlflow_port=port(args.mlflow_port, "mlflow_port", MLFLOW_PORT),
        applied=applied_settings(os.environ, stored, salt),
    )


def secret_digest(value: str, salt: str) -> str:
    return f"sha256:{salt}:{hashlib.sha256((salt + value).encode()).hexdigest()[:32]}"


def _salt(digest: str) -> str:
    """The salt of a recorded digest (so the same value compares equal), else a new one."""
    parts = digest.split(":")
    return parts[1] if len(parts) == 3 and parts[0] == "sha256" else secrets.token_hex(8)


def applied_settings(environ, stored_token: str | None, salt: str) -> dict[str, str]:
    """The FLYWHEEL_* values `make up` hands every process as they are set (empty: unset), secrets as
    digests; the token the service gets: FLYWHEEL_API_TOKEN when set, else the one kept in
    instance.env, else a new one (NEW_TOKEN until instance_env makes it)."""
    values = {
        name: secret_digest(value, salt) if name in SECRETS else value
        for name, value in sorted(environ.items())
        if name.startswith("FLYWHEEL_") and name not in NOT_APPLIED and name != TOKEN and value
    }
    token = environ.get(TOKEN) or stored_token
    values[TOKEN] = secret_digest(token, salt) if token else NEW_TOKEN
    return values


def applied_differences(wanted: Deployment, running: Deployment) -> list[str]:
    """One line per FLYWHEEL_* value `wanted` would hand its processes otherwise than the running
    deployment's got (a variable unset counts as its default); secrets never shown."""
    if wanted.applied is None or running.applied is None:
        return []
    lines = []
    for name in sorted(set(wanted.applied) | set(running.applied)):
        now, asked = (d.applied.get(name) or DEFAULTS.get(name, "") for d in (running, wanted))
        if now == asked:
            continue
        if name == TOKEN:
            lines.append(
                f"{TOKEN}: the running service takes another token than this `make up` would give it "
                f"({TOKEN} when set, else the one kept in {running.secrets_file}, else a new one); "
                f"`make down` first, or set {TOKEN} to the token the running service takes"
            )
        elif name in SECRETS:
            lines.append(
                f"{name}: running on another value than asked for; `make down` first, or set it as for its `make up`"
            )
        else:
            lines.append(
                f"{name}: running on {now or '(unset)'}, asked for {asked or '(unset)'}; `make down` first, or "
                + (f"set {name} to {now}" if now else f"unset {name}")
            )
    return lines


def differences(wanted: Deployment, running: Deployment) -> list[str]:
    """One line per setting `wanted` gives otherwise than the `running` deployment uses, both values named."""
    lines = []
    for key, (variable, option) in SETTINGS.items():
        now, asked = getattr(running, key), getattr(wanted, key)
        if key == "mlflow_port" and not now:  # recorded before the MLflow server was a piece: nothing to compare
            continue
        if str(now) != str(asked):
            lines.append(
                f"{variable}: running on {now}, asked for {asked}; `make down` first, or set {variable} "
                f"(or {option}) to {now}"
            )
    return lines + applied_differences(wanted, running)


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
    """The DAGSTER_PG_* variables the instance file reads, and the service's token, for the processes.
    Made once and kept in `<home>/instance.env` (mode 0600), rewritten only when a value changes (the
    PostgreSQL port): a token kept there stays, also while FLYWHEEL_API_TOKEN is set (which wins)."""
    saved = read_env_file(deployment.secrets_file)
    values = {
        "DAGSTER_PG_USER": PG_USER,
        "DAGSTER_PG_DB": PG_DB,
        "DAGSTER_PG_HOST": HOST,
        "DAGSTER_PG_PORT": str(deployment.pg_port),
        "DAGSTER_PG_PASSWORD": saved.get("DAGSTER_PG_PASSWORD") or secrets.token_urlsafe(24),
    }
    if saved.get(TOKEN) or not os.environ.get(TOKEN):
        values[TOKEN] = saved.get(TOKEN) or secrets.token_urlsafe(24)
    if values != saved:
        deployment.home.mkdir(parents=True, exist_ok=True)
        tmp = deployment.secrets_file.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("# The production instance's credentials (make up). Shell: set -a; . ./instance.env; set +a\n")
            f.writelines(f"{k}={v}\n" for k, v in values.items())
        tmp.replace(deployment.secrets_file)
    if os.environ.get(TOKEN):
        values[TOKEN] = os.environ[TOKEN]
    if deployment.applied is not None and values[TOKEN]:  # what deploy.json records: the token given now
        deployment.applied[TOKEN] = secret_digest(values[TOKEN], _salt(deployment.applied.get(TOKEN, "")))
    return values
