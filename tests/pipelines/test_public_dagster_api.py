"""The project uses Dagster's public API only: no module outside tests/ imports `dagster._...`
(nor `dagster_graphql._...` and kin), so a Dagster upgrade cannot break it behind its back. The
public paths that replaced the private ones, against a real `dagster-webserver`: the service's
GraphQL submission (FLYWHEEL_DAGSTER_URL) and the demo's `dg.execute_job` runs in the UI."""

from __future__ import annotations

import ast
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import dagster as dg
import httpx
import pytest

from outcome_flywheel.settings import PROJECT_ROOT
from outcome_flywheel.storage import Warehouse
from pipelines.launch import IN_PROCESS, RANGE_END, RANGE_START, run_job
from service import launching
from service.config import ServiceConfig
from tests import PROJECT_ROOT
from tests.service_fixtures import AUTH, TOKEN, make_state, make_world, small_audit_log, test_client

SKIPPED_DIRS = {"tests", ".venv", ".git", "data", ".dagster", ".cache", "build", "node_modules"}
# Where a private API were truly the only way, it would be wrapped in one module named here.
ALLOWED: set[str] = set()


def private_dagster_imports(source: str) -> list[str]:
    """The private Dagster modules `source` imports (`dagster._core...`, `dagster_graphql._...`)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from dagster._core.x import y` names its module; `from dagster import _check` the member
            names = [node.module] if "._" in node.module else [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            top, _, rest = name.partition(".")
            if (top == "dagster" or top.startswith("dagster_")) and any(
                part.startswith("_") for part in rest.split(".") if part
            ):
                found.append(name)
    return found


def project_files(root: Path = PROJECT_ROOT) -> list[Path]:
    files = []
    for path in root.rglob("*.py"):
        parts = path.relative_to(root).parts
        if not (set(parts[:-1]) & SKIPPED_DIRS) and not any(
            p.startswith(".") or p.endswith(".egg-info") for p in parts[:-1]
        ):
            files.append(path)
    return files


def test_the_scan_sees_private_imports():
    assert private_dagster_imports("from dagster._core.execution.api import execute_run") == [
        "dagster._core.execution.api"
    ]
    assert private_dagster_imports("import dagster._core.remote_origin as o") == ["dagster._core.remote_origin"]
    assert private_dagster_imports("from dagster import _check") == ["dagster._check"]
    assert private_dagster_imports("from dagster_graphql._client import x") == ["dagster_graphql._client"]
    assert (
        private_dagster_imports(
            "import dagster as dg\nfrom dagster_graphql import DagsterGraphQLClient\nfrom . import _x"
        )
        == []
    )


def test_no_module_outside_tests_imports_private_dagster():
    files = project_files()
    assert any(p.name == "launch.py" for p in files) and not any("tests" in p.parts for p in files)
    offenders = {
        str(p.relative_to(PROJECT_ROOT)): names
        for p in files
        if str(p.relative_to(PROJECT_ROOT)) not in ALLOWED and (names := private_dagster_imports(p.read_text()))
    }
    assert offenders == {}, (
        f"private Dagster imports (use the public API, or wrap it in one allowed module): {offenders}"
    )


# --- The service's GraphQL path and the demo's runs, against a real dagster-webserver ---------------

WEBSERVER = PROJECT_ROOT / ".venv" / "bin" / "dagster-webserver"
REPOSITORY = "__repository__@outcome_flywheel"
DECISION = {
    "decision_id": "web-graphql-1",
    "ts": "2025-06-11T10:00:00-04:00",
    "decision": "reject",
    "proposal": {"orders": [{"symbol": "JPM", "side": "buy", "weight": 0.05}]},
    "reason": "not a sector we add to",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def graphql(url: str, query: str, variables: dict | None = None) -> dict:
    answer = httpx.post(f"{url}/graphql", json={"query": query, "variables": variables or {}}, timeout=60).json()
    assert "errors" not in answer, answer
    return answer["data"]


def _location_loaded(url: str) -> bool:
    try:
        data = graphql(
            url,
            "{ workspaceOrError { ... on Workspace { locationEntries { name locationOrLoadError { __typename } } } } }",
        )
    except (httpx.HTTPError, ValueError):
        return False
    entries = data["workspaceOrError"]["locationEntries"]
    if any((e["locationOrLoadError"] or {}).get("__typename") == "PythonError" for e in entries):
        raise AssertionError(f"the code location did not load: {entries}")
    return any((e["locationOrLoadError"] or {}).get("__typename") == "RepositoryLocation" for e in entries)


@pytest.fixture(scope="module")
def webserver(tmp_path_factory, tiny_model_dir):
    """`dagster-webserver -w workspace.yaml` on 127.0.0.1 over a scratch SQLite instance with the
    run queue (QueuedRunCoordinator) and no daemon: a submitted run stays QUEUED, which is what the
    service's idempotency reads. The service and this test open the same instance."""
    if not WEBSERVER.exists():
        pytest.skip(f"{WEBSERVER} is missing (make setup installs dagster-webserver)")
    root = make_world(tmp_path_factory.mktemp("graphql") / "data", tiny_model_dir)
    small_audit_log(root / "audit_log.jsonl", n=1)  # one decision date: one run
    home = root.parent / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text((PROJECT_ROOT / "scripts" / "dagster.yaml").read_text() + QUEUED_COORDINATOR)
    env = {
        "DAGSTER_HOME": str(home),
        "FLYWHEEL_DATA_DIR": str(root),
        "FLYWHEEL_AUDIT_LOG": str(root / "audit_log.jsonl"),
        "OMP_NUM_THREADS": "1",
    }
    instance = dg.DagsterInstance.from_config(str(home))  # its SQLite storage made once, before other processes open it
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(root.parent / "webserver.log", "wb")
    server = subprocess.Popen(
        [str(WEBSERVER), "-h", "127.0.0.1", "-p", str(port), "-w", "workspace.yaml"],
        cwd=PROJECT_ROOT,
        env={**os.environ, **env},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 300
        while not _location_loaded(url):
            if server.poll() is not None or time.time() > deadline:
                raise AssertionError(
                    f"dagster-webserver did not serve the code location: {(root.parent / 'webserver.log').read_text()[-3000:]}"
                )
            time.sleep(1)
        with pytest.MonkeyPatch.context() as mp:
            for name, value in env.items():
                mp.setenv(name, value)
            yield {"url": url, "root": root, "instance": instance}
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the webserver and the code server it started
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()


QUEUED_COORDINATOR = "run_coordinator:\n  module: dagster.core.run_coordinator\n  class: QueuedRunCoordinator\n"


def _decision_runs(instance: dg.DagsterInstance) -> list[dg.DagsterRun]:
    return [r.dagster_run for r in instance.get_run_records(filters=dg.RunsFilter(job_name=launching.DECISIONS_JOB))]


def test_the_service_submits_runs_through_graphql_once(webserver):
    state = make_state(webserver["root"])
    state.config = ServiceConfig(token=TOKEN, dagster_url=webserver["url"])
    instance = webserver["instance"]
    client = test_client(state)

    assert client.post("/api/preferences/extract").status_code == 401  # bad input first: nothing submitted
    assert client.post("/api/preferences/train?dry_run=maybe", headers=AUTH).status_code == 422
    assert _decision_runs(instance) == []

    first = client.post("/api/preferences/extract", headers=AUTH).json()
    assert first["launched"] and first["changed_dates"] == ["2025-06-07"]
    (run,) = _decision_runs(instance)  # exactly one run, submitted to the webserver and queued there
    assert [r["run_id"] for r in first["runs"]] == [run.run_id]
    assert run.status == dg.DagsterRunStatus.QUEUED  # the daemon would launch it; none runs here
    assert run.tags["dagster/partition"] == "2025-06-07" and run.tags[launching.REQUEST_TAG] == first["digest"]
    assert run.tags[launching.QUEUE_TAG] == "service"  # one queue: the instance limits this tag to one run at a time
    assert run.remote_job_origin.location_name == "outcome_flywheel"  # a run of the webserver's code location
    assert run.run_config == IN_PROCESS

    again = client.post("/api/preferences/extract", headers=AUTH).json()  # the same changes: nothing new
    assert not again["launched"] and [r["run_id"] for r in again["runs"]] == [run.run_id]
    assert len(_decision_runs(instance)) == 1

    # Two new decisions on consecutive dates: one run over the range; the queued run keeps its date.
    assert client.post("/api/decisions", headers=AUTH, json={"decision_id": "bad"}).status_code == 422
    for n, ts in enumerate(("2025-06-11T10:00:00-04:00", "2025-06-12T10:00:00-04:00")):
        assert (
            client.post(
                "/api/decisions", headers=AUTH, json={**DECISION, "decision_id": f"web-graphql-{n}", "ts": ts}
            ).status_code
            == 201
        )
    third = client.post("/api/preferences/extract", headers=AUTH).json()
    assert third["launched"] and third["in_live_runs"] == {"2025-06-07": run.run_id}
    assert [(r["partition"], r["partition_range"]) for r in third["runs"]] == [(None, ["2025-06-11", "2025-06-12"])]
    ranged = instance.get_run_by_id(third["runs"][0]["run_id"])
    assert (ranged.tags[RANGE_START], ranged.tags[RANGE_END]) == (
        "2025-06-11",
        "2025-06-12",
    ) and "dagster/partition" not in ranged.tags
    assert len(_decision_runs(instance)) == 2


def test_a_webserver_that_is_down_is_a_503_with_the_reason(webserver, tmp_path, tiny_model_dir):
    root = make_world(tmp_path / "data", tiny_model_dir)
    state = make_state(root, instance_factory=lambda: webserver["instance"])
    state.config = ServiceConfig(token=TOKEN, dagster_url=f"http://127.0.0.1:{_free_port()}")
    state.warehouse = Warehouse(data_dir=str(root))
    before = len(_decision_runs(webserver["instance"]))
    client = test_client(state)
    assert (
        client.post(
            "/api/decisions",
            headers=AUTH,
            json={**DECISION, "decision_id": "web-down-1", "ts": "2025-06-20T10:00:00-04:00"},
        ).status_code
        == 201
    )
    answer = client.post("/api/preferences/extract", headers=AUTH)  # 2025-06-20: no queued run covers it
    assert answer.status_code == 503 and "did not take the flywheel_decisions run" in answer.json()["detail"]
    assert len(_decision_runs(webserver["instance"])) == before

    # The webserver up, but the service's DAGSTER_HOME another instance: it stops at the first run, saying why.
    other = make_state(root, instance_factory=dg.DagsterInstance.ephemeral)
    other.config = ServiceConfig(token=TOKEN, dagster_url=webserver["url"])
    answer = test_client(other).post("/api/preferences/extract", headers=AUTH)
    assert answer.status_code == 503 and "point DAGSTER_HOME at the instance" in answer.json()["detail"]
    assert len(_decision_runs(webserver["instance"])) == before + 1


def test_the_demos_runs_are_on_the_job_page_and_re_execute_through_graphql(webserver):
    """`run_job` (dg.execute_job) records a run without the code location's origin; its
    `.dagster/repository` tag puts it on the job's page (the UI's own filter). Re-execution by the
    parent run alone needs that origin; with the job named (the launchpad's way) it works."""
    url, instance = webserver["url"], webserver["instance"]
    result = run_job("feedback_pairs_job", instance, run_config=IN_PROCESS)
    job_page = {"pipelineName": "feedback_pairs_job", "tags": [{"key": ".dagster/repository", "value": REPOSITORY}]}
    listed = graphql(
        url,
        "query($f: RunsFilter) { runsOrError(filter: $f) { ... on Runs { results { runId status repositoryOrigin "
        "{ repositoryLocationName } } } } }",
        {"f": job_page},
    )["runsOrError"]["results"]
    assert [(r["runId"], r["status"]) for r in listed] == [(result.run_id, "SUCCESS")]
    assert listed[0]["repositoryOrigin"] is None  # what the UI's run page's Re-execute button reads
    selector = {
        "repositoryLocationName": "outcome_flywheel",
        "repositoryName": "__repository__",
        "pipelineName": "feedback_pairs_job",
    }
    rid = result.run_id
    launched = graphql(
        url,
        "mutation($p: ExecutionParams!) { launchPipelineReexecution(executionParams: $p) { __typename "
        "... on LaunchRunSuccess { run { runId rootRunId } } } }",
        {
            "p": {
                "selector": selector,
                "runConfigData": IN_PROCESS,
                "mode": "default",
                "executionMetadata": {"parentRunId": rid, "rootRunId": rid},
            }
        },
    )["launchPipelineReexecution"]
    assert launched["__typename"] == "LaunchRunSuccess" and launched["run"]["rootRunId"] == rid
