"""`make up` follows the settings it is given (issue 34): a value derived from another setting (the
PostgreSQL folder from the data dir) follows it unless given itself; `<home>/deploy.json` records a
running deployment, written once PostgreSQL runs, so a failed `make up` steers nothing; a `make up`
asking for other settings than the deployment running on its home is refused, both values named.

The `make up` runs here are real (`python -m deploy.up`, as the Makefile runs it) and fail at
PostgreSQL on purpose, before starting anything: as root the cluster's folder is under pytest's
0700 temp root, which the `postgres` user cannot reach (the issue's case); otherwise the PostgreSQL
port is taken.
"""

from __future__ import annotations

import json
import os

import pytest

from deploy import processes
from deploy.postgres import find_binaries, server_user_problem
from deploy.settings import Deployment, parser, resolve
from outcome_flywheel.settings import PROJECT_ROOT
from tests import PROJECT_ROOT
from tests.deploy_fixtures import SETTING_VARIABLES, free_ports, piece, run_module, scrubbed_env, taken_port


def needs_postgres(test):
    """Skipped where `make up` would install PostgreSQL (apt-get) or cannot run it: it would not fail there as meant."""
    test = pytest.mark.skipif(
        find_binaries() is None, reason="PostgreSQL is not installed: `make up` would install it"
    )(test)
    return pytest.mark.skipif(
        server_user_problem() is not None, reason=f"PostgreSQL cannot run here: {server_user_problem()}"
    )(test)


@pytest.fixture(autouse=True)
def no_settings(monkeypatch):
    for name in SETTING_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def _resolve(*argv: str) -> Deployment:
    return resolve(parser("test", "test").parse_args(list(argv)))


def _saved(home, data_dir, **ports) -> Deployment:
    """A deploy.json as a `make up` on `data_dir` left it. Ports 1 and 2: never what free_port hands out."""
    values = dict(pg_port=1, code_server_port=2, webserver_port=3031, api_port=8766) | ports
    d = Deployment(home=home, data_dir=data_dir, pg_dir=data_dir / "postgres", **values)
    d.save()
    return d


def test_the_pg_dir_follows_the_data_dir_asked_for_not_the_saved_one(tmp_path, monkeypatch):
    home, a, b = tmp_path / "home", tmp_path / "a" / "data", tmp_path / "b" / "data"
    _saved(home, a)  # the last `make up`, not running now
    monkeypatch.setenv("FLYWHEEL_PROD_HOME", str(home))
    monkeypatch.setenv("FLYWHEEL_DATA_DIR", str(b))
    d = _resolve()
    assert (d.data_dir, d.pg_dir) == (b, b / "postgres")
    assert _resolve("--data-dir", str(a)).pg_dir == a / "postgres"  # the option wins over the variable
    monkeypatch.setenv("FLYWHEEL_PG_DIR", str(tmp_path / "pg"))  # given explicitly: it wins
    assert _resolve().pg_dir == tmp_path / "pg"
    monkeypatch.delenv("FLYWHEEL_PG_DIR")
    monkeypatch.delenv("FLYWHEEL_DATA_DIR")
    # Nothing given: the defaults, not what a deployment that no longer runs used.
    d = _resolve()
    data = (PROJECT_ROOT / "data").resolve()
    assert (d.data_dir, d.pg_dir, d.webserver_port, d.api_port) == (data, data / "postgres", 3030, 8765)
    assert {d.pg_port, d.code_server_port}.isdisjoint({1, 2})


def test_a_running_deployment_keeps_its_free_ports_and_refuses_other_settings(tmp_path):
    from deploy.settings import ConflictError, check_running, differences

    home, a, b = tmp_path / "home", tmp_path / "a" / "data", tmp_path / "b" / "data"
    running = _saved(home, a, webserver_port=3030, api_port=8765)
    with piece(home, "postgres"):
        # Asked again with the same settings: the free ports it chose are taken again, nothing differs.
        same = _resolve("--home", str(home), "--data-dir", str(a))
        assert (same.pg_port, same.code_server_port) == (1, 2)
        assert differences(same, running) == []
        check_running(same)
        # Another data dir: refused, both values named, for the data dir and the PostgreSQL folder it derives.
        other = _resolve("--home", str(home), "--data-dir", str(b), "--webserver-port", "3031")
        lines = differences(other, running)
        assert len(lines) == 3, lines
        assert lines[0] == (
            f"FLYWHEEL_DATA_DIR: running on {a}, asked for {b}; `make down` first, or set FLYWHEEL_DATA_DIR "
            f"(or --data-dir) to {a}"
        )
        assert f"FLYWHEEL_PG_DIR: running on {a / 'postgres'}, asked for {b / 'postgres'}" in lines[1]
        assert "FLYWHEEL_WEBSERVER_PORT: running on 3030, asked for 3031" in lines[2] and "to 3030" in lines[2]
        with pytest.raises(ConflictError, match="FLYWHEEL_DATA_DIR: running on"):
            check_running(other)
        # Running, its record lost: its settings are unknown, so refused too.
        (home / "deploy.json").rename(home / "deploy.json.away")
        with pytest.raises(
            ConflictError, match=r"a deployment runs on .* \(postgres\), but .* does not record its settings"
        ):
            check_running(same)
        (home / "deploy.json.away").rename(home / "deploy.json")
    # Stopped: deploy.json steers nothing, not even the free ports.
    after = _resolve("--home", str(home), "--data-dir", str(b))
    assert {after.pg_port, after.code_server_port}.isdisjoint({1, 2})
    check_running(after)


def _up(home, env: dict[str, str], pg_port: int):
    return run_module(
        "deploy.up",
        ["--home", str(home), "--pg-port", str(pg_port), *free_ports(), "--timeout", "60"],
        scrubbed_env(**env),
    )


@needs_postgres
def test_a_failed_up_leaves_nothing_that_steers_the_next(tmp_path):
    home, a, b = tmp_path / "home", tmp_path / "a" / "data", tmp_path / "b" / "data"
    with taken_port() as pg_port:
        first = _up(home, {"FLYWHEEL_DATA_DIR": str(a)}, pg_port)
        assert first.returncode == 1, first.stdout + first.stderr
        assert str(a / "postgres") in first.stderr or f"port {pg_port}" in first.stderr, first.stderr
        assert not (home / "deploy.json").exists()  # nothing runs: nothing recorded
        assert not processes.live_records(home)
        # Step 2: another data dir; its PostgreSQL folder follows it.
        second = _up(home, {"FLYWHEEL_DATA_DIR": str(b)}, pg_port)
    assert second.returncode == 1, second.stdout + second.stderr
    assert str(a) not in second.stderr, second.stderr
    assert (b / "postgres").is_dir()  # the cluster was to be made there, not in a/data/postgres
    assert not (home / "deploy.json").exists()
    assert _resolve("--home", str(home), "--data-dir", str(b)).pg_dir == b / "postgres"


@needs_postgres
def test_make_up_refuses_settings_other_than_the_running_deployments(tmp_path):
    from deploy import guard

    home, a, b = tmp_path / "home", tmp_path / "a" / "data", tmp_path / "b" / "data"
    _saved(home, a)
    saved = (home / "deploy.json").read_text()
    with piece(home, "daemon") as daemon, taken_port() as pg_port:
        result = _up(home, {"FLYWHEEL_DATA_DIR": str(b)}, pg_port)
        assert result.returncode == 1, result.stdout + result.stderr
        expected = f"FLYWHEEL_DATA_DIR: running on {a}, asked for {b}; `make down` first, or set FLYWHEEL_DATA_DIR (or --data-dir) to {a}"
        assert expected in result.stderr, result.stderr
        assert f"FLYWHEEL_PG_PORT: running on 1, asked for {pg_port}" in result.stderr
        assert daemon.process() is not None  # untouched
        assert (home / "deploy.json").read_text() == saved
        assert not (b / "postgres").exists()  # nothing was started or made
        # A second `make up` while one runs on the same home is refused too, naming it.
        with guard.up_lock(home):
            busy = _up(home, {"FLYWHEEL_DATA_DIR": str(a)}, pg_port)
        assert busy.returncode == 1 and f"another `make up` is running on {home} (pid {os.getpid()})" in busy.stderr, (
            busy.stderr
        )


def test_the_mlflow_servers_port_and_artifacts(tmp_path, monkeypatch):
    """Issue 49, item 5: the MLflow server's port is a setting like the webserver's (5050 by default, compared
    with a running deployment's, refused when it is no port); its artifacts go beside an s3:// warehouse."""
    from deploy import mlflow_server
    from deploy.settings import SettingError, differences, recorded

    assert _resolve().mlflow_port == 5050
    assert _resolve("--mlflow-port", "5051").mlflow_url == "http://127.0.0.1:5051"
    monkeypatch.setenv("FLYWHEEL_MLFLOW_PORT", "port")
    with pytest.raises(SettingError, match=r"FLYWHEEL_MLFLOW_PORT \(or --mlflow-port\) is 'port': allowed: a port"):
        _resolve()
    monkeypatch.delenv("FLYWHEEL_MLFLOW_PORT")
    home, data = tmp_path / "home", tmp_path / "data"
    running = _saved(home, data, mlflow_port=5052)
    asked = _resolve("--home", str(home), "--data-dir", str(data), "--pg-port", "1", "--code-server-port", "2")
    assert differences(asked, running)[-1].startswith("FLYWHEEL_MLFLOW_PORT: running on 5052, asked for 5050")
    # a deploy.json written before the MLflow server was a piece: nothing to compare
    saved = json.loads((home / "deploy.json").read_text())
    del saved["mlflow_port"]
    (home / "deploy.json").write_text(json.dumps(saved))
    assert recorded(home).mlflow_port == 0 and not any("MLFLOW" in line for line in differences(asked, recorded(home)))

    where = mlflow_server.artifacts_destination
    assert where(data, {"FLYWHEEL_WAREHOUSE_URL": "s3://flywheel/warehouse"}) == "s3://flywheel/mlflow-artifacts"
    assert where(data, {"FLYWHEEL_WAREHOUSE_URL": "s3://bkt/team/wh/"}) == "s3://bkt/team/mlflow-artifacts"
    assert where(data, {"FLYWHEEL_WAREHOUSE_URL": "s3://bkt"}) == "s3://bkt/mlflow-artifacts"
    assert where(data, {"FLYWHEEL_WAREHOUSE_URL": str(tmp_path / "wh")}) == str(data / "mlflow" / "server-artifacts")
    assert where(data, {}) == str(data / "mlflow" / "server-artifacts")
    env = mlflow_server.environment({"FLYWHEEL_S3_ENDPOINT": "http://127.0.0.1:8333", "AWS_REGION": "eu-west-1"}, "pw")
    assert env["PGPASSWORD"] == "pw" and env["MLFLOW_S3_ENDPOINT_URL"] == "http://127.0.0.1:8333"
    assert env["AWS_DEFAULT_REGION"] == "eu-west-1" and env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "false"
    store = mlflow_server.backend_store_uri("dagster", "127.0.0.1", 5432)
    assert store == "postgresql+psycopg2://dagster@127.0.0.1:5432/mlflow"  # no password on the command line
