"""The service as it runs: uvicorn on a real socket (loopback unless told otherwise), 200 concurrent
feedback posts from 20 clients, the token printed when none is set, and `extract` launching real
runs on a Dagster instance through the worker process (idempotent; dg.execute_job in the worker)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import entry_points

import dagster as dg
import httpx
import pytest

from outcome_flywheel.feedback.log import read_feedback_log
from outcome_flywheel.settings import settings_problems
from pipelines.launch import LAUNCH_TAG, REPOSITORY_TAG
from service.config import ServiceConfig
from service.main import banner, start_in_thread
from tests.service_fixtures import AUTH, DAY, HEADLINES, make_state, make_world, service_environment

DECISION = {
    "decision_id": "web-live-1",
    "ts": "2025-06-11T10:00:00-04:00",
    "decision": "reject",
    "proposal": {"orders": [{"symbol": "JPM", "side": "buy", "weight": 0.05}]},
    "reason": "not a sector we add to",
}


@pytest.fixture(scope="module")
def live(tmp_path_factory, tiny_model_dir):
    """The service on 127.0.0.1 and a free port, in a thread, with a persistent Dagster instance."""
    root = make_world(tmp_path_factory.mktemp("live") / "data", tiny_model_dir)
    home = root.parent / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    with pytest.MonkeyPatch.context() as mp:
        # The worker process reads the same settings the service does.
        service_environment(mp, root, home)
        state = make_state(root)  # its config: ServiceConfig's defaults, the host included
        server, url = start_in_thread(state)
        yield {"state": state, "root": root, "address": server.servers[0].sockets[0].getsockname(), "url": url}
        server.should_exit = True
        for worker in state.workers:
            worker.wait(timeout=120)


def test_binds_to_loopback_unless_told_otherwise(live, monkeypatch):
    assert live["address"][0] == "127.0.0.1"
    monkeypatch.delenv("FLYWHEEL_API_HOST", raising=False)
    assert ServiceConfig.from_env().host == "127.0.0.1" and ServiceConfig.from_env().port == 8765
    monkeypatch.setenv("FLYWHEEL_API_HOST", "0.0.0.0")
    config = ServiceConfig.from_env()
    assert config.host == "0.0.0.0" and "WARNING: bound to 0.0.0.0, not loopback" in banner(config)


def test_a_token_is_made_and_printed_when_none_is_set(monkeypatch):
    monkeypatch.delenv("FLYWHEEL_API_TOKEN", raising=False)
    one, two = ServiceConfig.from_env(), ServiceConfig.from_env()
    assert one.token_generated and len(one.token) >= 24 and one.token != two.token
    text = banner(one)
    assert one.token in text and "/login" in text and f"token={one.token}" not in text  # printed, never in a link
    given = ServiceConfig(token="a-long-enough-token-123")
    assert not given.token_generated and given.token not in banner(given)
    problems = settings_problems({"FLYWHEEL_API_TOKEN": "short"})
    assert problems and "short" not in problems[0].split(":")[0] and "<hidden>" in problems[0]
    assert settings_problems({"FLYWHEEL_API_PORT": "70000"})


def test_the_service_is_a_console_script():
    scripts = {e.name: e.value for e in entry_points(group="console_scripts")}
    assert scripts.get("flywheel-serve") == "service.main:main"


def test_200_concurrent_posts_from_20_clients_leave_200_valid_lines(live):
    log = live["state"].feedback_log.file

    def client(n: int) -> list[int]:
        with httpx.Client(base_url=live["url"], headers=AUTH, timeout=60) as http:
            return [
                http.post(
                    "/api/feedback",
                    json={
                        "date": DAY,
                        "headline_id": HEADLINES[i % 2],
                        "rollout_index": (n + i) % 3,
                        "stars": 1 + (n + i) % 5,
                        "correction": f"client {n} post {i} " + "x" * 2000,
                        "reviewer": f"client-{n}",
                    },
                ).status_code
                for i in range(10)
            ]

    with ThreadPoolExecutor(max_workers=20) as pool:
        codes = [c for batch in pool.map(client, range(20)) for c in batch]
    assert codes == [201] * 200
    parsed = read_feedback_log(log)
    assert parsed.lines == 200 and len(parsed.feedback) == 200 and not parsed.quarantine
    assert len({f.feedback_id for f in parsed.feedback}) == 200
    assert {(f.reviewer, f.correction.split(" x")[0]) for f in parsed.feedback} == {
        (f"client-{n}", f"client {n} post {i}") for n in range(20) for i in range(10)
    }


def _wait(instance: dg.DagsterInstance, launch_ids: list[str], timeout: float = 300) -> list[dg.DagsterRun]:
    """The runs the worker made for `launch_ids` (queued specs), once all have finished."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        records = [instance.get_run_records(filters=dg.RunsFilter(tags={LAUNCH_TAG: i}), limit=1) for i in launch_ids]
        runs = [r[0].dagster_run for r in records if r]
        if len(runs) == len(launch_ids) and all(r.is_finished for r in runs):
            return runs
        time.sleep(1)
    raise AssertionError(f"runs {launch_ids} did not finish in {timeout} s")


def test_extract_launches_the_changed_partition_once(live):
    with httpx.Client(base_url=live["url"], headers=AUTH, timeout=120) as http:
        assert http.post("/api/decisions", json=DECISION).status_code == 201
        first = http.post("/api/preferences/extract").json()
        assert first["launched"] and "2025-06-11" in first["changed_dates"]
        again = http.post("/api/preferences/extract").json()  # the same changes: the same runs, nothing new
        assert not again["launched"] and [r["launch_id"] for r in again["runs"]] == [
            r["launch_id"] for r in first["runs"]
        ]
        instance = live["state"].instance()
        runs = _wait(instance, [r["launch_id"] for r in first["runs"]])
        assert all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs), [r.status for r in runs]
        assert all(
            r.tags[REPOSITORY_TAG] == "__repository__@outcome_flywheel" for r in runs
        )  # on the job's page in the UI
        stored = live["state"].warehouse.read("operator_decisions", "2025-06-11")
        assert "web-live-1" in set(stored["decision_id"])
        assert len(live["state"].warehouse.read("decision_outcomes", "2025-06-11")) == len(stored)
        done = http.post("/api/preferences/extract").json()
        assert not done["launched"] and done["changed_dates"] == []
