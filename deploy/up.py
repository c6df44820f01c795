"""`make up`: the production shape on this machine, each piece started once and waited for.

    python -m deploy.up [--home DIR] [--data-dir DIR] [--pg-dir DIR] [--pg-port N] [--code-server-port N]
                        [--webserver-port N] [--api-port N] [--mlflow-port N] [--daily-schedule on|off|auto]

1. PostgreSQL (deploy.postgres): a cluster under the data dir on 127.0.0.1, a `dagster` role, its database
   and the `mlflow` database;
   the MLflow tracking server (deploy.mlflow_server) on it, started then and waited for (GET /health) last;
   the processes below record every training there (FLYWHEEL_MLFLOW_TRACKING_URI);
2. the code server (`dagster code-server start -m pipelines.definitions`): the code location, which
   launches the run workers;
3. `dagster-daemon run`: the run queue, schedules, sensors, run monitoring and run retries;
4. `dagster-webserver`: the UI and GraphQL on 127.0.0.1;
5. the review service (`flywheel-serve`), submitting runs through the webserver's GraphQL
   (FLYWHEEL_DAGSTER_URL).
All on the instance file deploy/dagster.yaml, copied into the production home. A piece already
running (its pid file names a live process) is left as it is, so `make up` twice starts nothing twice.
A deployment running on the home with other settings than those asked for is refused (both values
named, deploy.settings.differences). `<home>/deploy.json` is written once PostgreSQL runs: a `make up`
that failed before leaves nothing that steers the next one. `<home>/up.lock` is held throughout, so a
second `make up` on the same home, `make clean` and `make clean-prod` see one still starting, and
`make down` asks it to stop (`<home>/up.stop`, then SIGTERM): it then stops what it had started and
exits with status 1 saying why, before `make down` stops the rest.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
import urllib.request
from pathlib import Path

from deploy import down, guard, mlflow_server, processes
from deploy.postgres import Cluster, PostgresError, ensure_installed
from deploy.settings import (
    DEFS_MODULE,
    HOST,
    INSTANCE_TEMPLATE,
    LOCATION_NAME,
    ConflictError,
    Deployment,
    check_running,
    home_of,
    instance_env,
    parser,
    resolve,
)
from outcome_flywheel.settings import PROJECT_ROOT, validate_environment

BIN = Path(sys.executable).parent  # the project's virtual environment: dagster, dagster-daemon, flywheel-serve
POOLS = ("duckdb", "accelerator")
DAILY_SCHEDULE = "daily_rl_job_schedule"
PORT_SETTINGS = {
    "code_server": "FLYWHEEL_CODE_SERVER_PORT (--code-server-port)",
    "webserver": "FLYWHEEL_WEBSERVER_PORT (--webserver-port)",
    "service": "FLYWHEEL_API_PORT (--api-port)",
    mlflow_server.NAME: "FLYWHEEL_MLFLOW_PORT (--mlflow-port)",
}
PIECES = ("postgres", mlflow_server.NAME, "code_server", "daemon", "webserver", "service")  # in the order started
REPOSITORY_NAME = "__repository__"  # the one repository of a `Definitions` object


class Stopped(BaseException):  # not an Exception: no `except Exception` on the way (a wait's poll) swallows it
    """`make down` (or a SIGTERM) asked this `make up` to stop."""


class Stopper:
    """SIGTERM raises Stopped in `make up`, except inside `deferred()` (a process started and not yet
    recorded: it would be stopped by nobody), where it waits for the section's end."""

    def __init__(self, home: Path):
        self.home, self.deferring, self.pending = home, 0, False

    def reason(self) -> str:
        by = guard.stop_request(self.home, os.getpid())
        return f"{by} asked it to stop" if by else "it got SIGTERM"

    def _handler(self, signum, frame):
        self.pending = True
        if not self.deferring:
            raise Stopped(self.reason())

    def check(self) -> None:
        if self.pending and not self.deferring:
            raise Stopped(self.reason())

    @contextlib.contextmanager
    def deferred(self):
        self.deferring += 1
        try:
            yield
        finally:
            self.deferring -= 1
        self.check()

    def __enter__(self):
        signal.signal(signal.SIGTERM, self._handler)
        return self

    def __exit__(self, *exc):
        self.deferring += 1  # from here on (stopping what it started, the summary) a SIGTERM is only noted


STOPPER = Stopper(Path("."))


def graphql(url: str, query: str, variables: dict | None = None, timeout: float = 10) -> dict:
    request = urllib.request.Request(
        f"{url}/graphql",
        data=json.dumps({"query": query, "variables": variables or {}}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        body = json.loads(response.read())
    if body.get("errors"):
        raise RuntimeError(f"GraphQL error: {body['errors']}")
    return body["data"]


def http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status == 200


LOCATION_QUERY = """{ workspaceOrError { __typename ... on Workspace { locationEntries { name loadStatus
  locationOrLoadError { __typename ... on PythonError { message } } } } } }"""
DAEMONS_QUERY = "{ instance { daemonHealth { allDaemonStatuses { daemonType healthy required } } } }"
SET_POOL = "mutation($key: String!, $limit: Int!) { setConcurrencyLimit(concurrencyKey: $key, limit: $limit) }"
START_SCHEDULE = """mutation($selector: ScheduleSelector!) { startSchedule(scheduleSelector: $selector) { __typename
  ... on PythonError { message } } }"""


def code_server_healthy(d: Deployment) -> bool:
    """The code server answers gRPC's standard health check for its service as SERVING (what `dagster api
    grpc-health-check` asks, without starting a Python process that imports Dagster for every poll)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(f"{HOST}:{d.code_server_port}") as channel:
        try:
            answer = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service="DagsterApi"), timeout=30
            )
        except grpc.RpcError:
            return False
    return answer.status == health_pb2.HealthCheckResponse.SERVING


def location_loaded(url: str) -> bool:
    entries = graphql(url, LOCATION_QUERY)["workspaceOrError"]["locationEntries"]
    entry = next(e for e in entries if e["name"] == LOCATION_NAME)
    if entry["locationOrLoadError"] and entry["locationOrLoadError"]["__typename"] == "PythonError":
        raise processes.StartupError(
            f"the code location did not load: {entry['locationOrLoadError']['message'][:2000]}"
        )
    return entry["loadStatus"] == "LOADED" and entry["locationOrLoadError"]["__typename"] == "RepositoryLocation"


def daemons_healthy(url: str) -> bool:
    """Every daemon the instance requires (scheduler, sensors, run queue, monitoring, retries...) has a fresh heartbeat."""
    statuses = graphql(url, DAEMONS_QUERY)["instance"]["daemonHealth"]["allDaemonStatuses"]
    return bool(statuses) and all(s["healthy"] for s in statuses if s["required"])


def write_instance_files(d: Deployment) -> None:
    """The shipped instance file, and a workspace naming the code server (both replaced atomically)."""
    d.home.mkdir(parents=True, exist_ok=True)
    for path, text in (
        (d.home / "dagster.yaml", INSTANCE_TEMPLATE.read_text()),
        (
            d.workspace_file,
            f"# Written by `make up`: the code server it starts.\nload_from:\n  - grpc_server:\n"
            f"      host: {HOST}\n      port: {d.code_server_port}\n      location_name: {LOCATION_NAME}\n",
        ),
    ):
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(path)


def process_env(d: Deployment, secrets: dict[str, str]) -> dict[str, str]:
    env = {
        **os.environ,
        **secrets,
        "DAGSTER_HOME": str(d.home),
        "FLYWHEEL_DATA_DIR": str(d.data_dir),
        "FLYWHEEL_API_HOST": HOST,
        "FLYWHEEL_API_PORT": str(d.api_port),
        "FLYWHEEL_DAGSTER_URL": d.webserver_url,
        # every training's record goes to the deployment's MLflow server, unless another store is set
        "FLYWHEEL_MLFLOW_TRACKING_URI": os.environ.get("FLYWHEEL_MLFLOW_TRACKING_URI") or d.mlflow_url,
    }
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")]))
    return env


def start_postgres(d: Deployment, secrets: dict[str, str], timeout_s: float, started: list[str]) -> str:
    cluster = Cluster(d.pg_dir, d.pg_port, ensure_installed())
    with STOPPER.deferred():  # a cluster half made, a server started and not recorded: neither is left so
        cluster.init()
        if cluster.running():
            state = "already running"
        else:
            if not processes.port_free(d.pg_port):
                raise PostgresError(
                    f"port {d.pg_port} on {HOST} is taken: set FLYWHEEL_PG_PORT (or --pg-port) to a free one"
                )
            cluster.start()
            state = "started"
        pid = cluster.postmaster_pid()
        if pid and not processes.running(d.home, "postgres"):
            record = processes.ProcessRecord.of("postgres", pid, str(cluster.log_file))
            processes.write_record(d.home, record)
        if state == "started":
            started.append("postgres")
        d.save()  # a piece runs: from now on deploy.json records this deployment, for `make down` and the next `make up`
    processes.wait_until(cluster.ready, timeout_s, "PostgreSQL (pg_isready)")
    for database in (secrets["DAGSTER_PG_DB"], mlflow_server.DATABASE):
        cluster.ensure_database(secrets["DAGSTER_PG_USER"], secrets["DAGSTER_PG_PASSWORD"], database)
    return state


def start_mlflow(
    d: Deployment, secrets: dict[str, str], env: dict[str, str], started: list[str]
) -> tuple[processes.ProcessRecord, str]:
    """The MLflow server on the cluster's `mlflow` database; not waited for here (its schema migrations run
    while the code server starts)."""
    destination = mlflow_server.artifacts_destination(d.data_dir, env)
    if "://" not in destination:
        Path(destination).mkdir(parents=True, exist_ok=True)
    store = mlflow_server.backend_store_uri(secrets["DAGSTER_PG_USER"], HOST, d.pg_port)
    return ensure_process(
        d,
        mlflow_server.NAME,
        mlflow_server.command(BIN, store, destination, HOST, d.mlflow_port),
        mlflow_server.environment(env, secrets["DAGSTER_PG_PASSWORD"]),
        d.mlflow_port,
        started,
    )


def ensure_process(
    d: Deployment, name: str, command: list[str], env: dict[str, str], port: int | None, started: list[str]
) -> tuple[processes.ProcessRecord, str]:
    record = processes.running(d.home, name)
    if record:
        return record, "already running"
    if port is not None and not processes.port_free(port):
        raise processes.StartupError(
            f"{name}: port {port} on {HOST} is taken by another program; choose another with "
            f"{PORT_SETTINGS.get(name, 'its option')}"
        )
    with STOPPER.deferred():
        record = processes.start(d.home, name, command, env, PROJECT_ROOT)
        started.append(name)
    return record, "started"


def up(
    d: Deployment, daily_schedule: str = "auto", timeout_s: float = 600, started: list[str] | None = None
) -> dict[str, str]:
    """Start what is not running; returns {piece: 'started' | 'already running'}; `started` gets the
    name of each piece as it starts. Raises ConflictError, before anything, when a deployment runs on
    the home with other settings."""
    started = [] if started is None else started
    check_running(d)
    validate_environment()
    started_at = time.monotonic()
    if processes.read_record(d.home, mlflow_server.NAME) and not processes.running(d.home, mlflow_server.NAME):
        processes.stop(d.home, mlflow_server.NAME)  # a killed server: its workers still hold the port
    for name, port in (
        (mlflow_server.NAME, d.mlflow_port),
        ("code_server", d.code_server_port),
        ("webserver", d.webserver_port),
        ("service", d.api_port),
    ):
        if not processes.running(d.home, name) and not processes.port_free(port):  # before starting anything
            raise processes.StartupError(
                f"{name}: port {port} on {HOST} is taken by another program; choose another with {PORT_SETTINGS[name]}"
            )
    write_instance_files(d)
    secrets = instance_env(d)
    env = process_env(d, secrets)
    states = {"postgres": start_postgres(d, secrets, timeout_s, started)}
    mlflow, states[mlflow_server.NAME] = start_mlflow(d, secrets, env, started)
    workspace = ["-w", str(d.workspace_file)]
    code_server, states["code_server"] = ensure_process(
        d,
        "code_server",
        [
            str(BIN / "dagster"),
            "code-server",
            "start",
            "-m",
            DEFS_MODULE,
            "-d",
            str(PROJECT_ROOT),
            "-h",
            HOST,
            "-p",
            str(d.code_server_port),
            "--location-name",
            LOCATION_NAME,
        ],
        env,
        d.code_server_port,
        started,
    )
    # The daemon and the webserver load the workspace as they start: the code server answers first.
    processes.wait_until(
        lambda: code_server_healthy(d), timeout_s, "the code server", interval_s=2, process=code_server
    )
    daemon, states["daemon"] = ensure_process(
        d, "daemon", [str(BIN / "dagster-daemon"), "run", *workspace], env, None, started
    )
    webserver, states["webserver"] = ensure_process(
        d,
        "webserver",
        [str(BIN / "dagster-webserver"), "-h", HOST, "-p", str(d.webserver_port), *workspace],
        env,
        d.webserver_port,
        started,
    )
    url = d.webserver_url
    processes.wait_until(lambda: http_ok(f"{url}/server_info"), timeout_s, "dagster-webserver", process=webserver)
    processes.wait_until(
        lambda: location_loaded(url), timeout_s, "the code location (code server)", interval_s=2, process=code_server
    )
    for pool in POOLS:  # as `make setup` does for the embedded instance: explicit, whatever default_limit says
        graphql(url, SET_POOL, {"key": pool, "limit": 1})
    processes.wait_until(
        lambda: daemons_healthy(url), timeout_s, "dagster-daemon (heartbeats)", interval_s=2, process=daemon
    )
    if daily_schedule == "on" or (daily_schedule == "auto" and os.environ.get("FLYWHEEL_FEED_URLS")):
        selector = {
            "repositoryLocationName": LOCATION_NAME,
            "repositoryName": REPOSITORY_NAME,
            "scheduleName": DAILY_SCHEDULE,
        }
        result = graphql(url, START_SCHEDULE, {"selector": selector})["startSchedule"]
        if result["__typename"] == "PythonError" and "already running" not in result.get("message", ""):
            raise processes.StartupError(f"could not start {DAILY_SCHEDULE}: {result['message']}")
        states[DAILY_SCHEDULE] = "on"
    processes.wait_until(
        lambda: mlflow_server.healthy(d.mlflow_url), timeout_s, "the MLflow server (GET /health)", process=mlflow
    )
    service, states["service"] = ensure_process(
        d, "service", [str(BIN / "flywheel-serve"), "--host", HOST, "--port", str(d.api_port)], env, d.api_port, started
    )
    processes.wait_until(
        lambda: http_ok(f"{d.service_url}/openapi.json"), timeout_s, "the review service", process=service
    )
    states["seconds"] = f"{time.monotonic() - started_at:.1f}"
    return states


def summary(d: Deployment, states: dict[str, str]) -> str:
    token = (
        "FLYWHEEL_API_TOKEN (as set)"
        if os.environ.get("FLYWHEEL_API_TOKEN")
        else instance_env(d).get("FLYWHEEL_API_TOKEN", "")
    )
    pids = {
        name: (processes.read_record(d.home, name) or processes.ProcessRecord(name, 0, 0.0, [])).pid for name in PIECES
    }
    lines = [f"production instance up in {states['seconds']} s (DAGSTER_HOME={d.home})"]
    lines += [f"  {name:<12} pid {pids[name]:<8} {states.get(name, '')}" for name in pids]
    lines += [
        f"  PostgreSQL   {HOST}:{d.pg_port}  data {d.pg_dir}",
        f"  Dagster UI   {d.webserver_url}",
        f"  service      {d.service_url}  (sign in at {d.service_url}/login)",
        f"  MLflow UI    {d.mlflow_url}  (every training's run, the registered models; artifacts in "
        f"{mlflow_server.artifacts_destination(d.data_dir, os.environ)})",
        f"  token        {token}",
        *(
            [
                f"  tracking     FLYWHEEL_MLFLOW_TRACKING_URI={tracking} as set: the trainings record there, not on {d.mlflow_url}"
            ]
            if (tracking := os.environ.get("FLYWHEEL_MLFLOW_TRACKING_URI"))
            else []
        ),
        f"  daily schedule {states.get(DAILY_SCHEDULE, 'as the instance has it (off by default; docs/deploy.md)')}",
        f"  logs         {processes.log_dir(d.home)}; stop everything with `make down`",
    ]
    return "\n".join(lines)


def stopped(d: Deployment | None, started: list[str], why: str) -> int:
    """A `make up` asked to stop: stop what it started (the newest first), say so; status 1."""
    STOPPER.deferring += 1  # another SIGTERM meanwhile is only noted
    lines = down.down(d, started) if d is not None and started else []
    print(
        f"make up: stopped before the deployment was up: {why}; "
        + (
            "it stopped what it had started:\n" + "\n".join(f"  {line}" for line in lines)
            if lines
            else "it had started nothing"
        ),
        file=sys.stderr,
        flush=True,
    )
    return 1


def main(argv: list[str] | None = None) -> int:
    p = parser(
        "make up", "Start PostgreSQL, the code server, dagster-daemon, dagster-webserver and the review service."
    )
    p.add_argument(
        "--daily-schedule",
        choices=("on", "off", "auto"),
        default=os.environ.get("FLYWHEEL_DAILY_SCHEDULE") or "auto",
        help="turn the daily schedule on (auto: when FLYWHEEL_FEED_URLS is set; off: leave it as it is)",
    )
    p.add_argument("--timeout", type=float, default=600, help="seconds to wait for each piece to be ready")
    args = p.parse_args(argv)
    home, started, deployment = home_of(args), [], None
    STOPPER.home = home
    try:
        with STOPPER, guard.up_lock(home):
            try:
                deployment = resolve(args)  # under the lock: what runs on the home does not change meanwhile
                states = up(deployment, args.daily_schedule, args.timeout, started)
                STOPPER.check()  # a request that came while a piece was being recorded
            except Stopped as err:  # still under the lock: `make down` waits for this, then stops the rest
                return stopped(deployment, started, str(err))
    except Stopped as err:  # before it held the lock
        return stopped(None, [], str(err))
    except (guard.Busy, ConflictError) as err:  # nothing was started
        print(f"make up: {err}", file=sys.stderr)
        return 1
    except (PostgresError, processes.StartupError, RuntimeError) as err:
        started = processes.live_records(home_of(args))
        print(
            f"make up: {err}" + ("\n(what did start is still running: `make down` stops it)" if started else ""),
            file=sys.stderr,
        )
        return 1
    print(summary(deployment, states), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
