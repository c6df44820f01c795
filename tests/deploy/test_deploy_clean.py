"""`make clean` cannot destroy a running deployment (issue 34): it refuses while any piece of `make up`
runs (its pid files, checked as `make down` checks them; `make up` itself, by its lock; a PostgreSQL
server on a cluster in data/), and never deletes a PostgreSQL cluster; `make clean-prod`, only after
`make down`, removes the production home and its cluster, printing each path.

Every run here is on a scratch project (`python -m deploy.clean --project DIR`, or the Makefile copied
there): never this checkout's data/ or .dagster-prod/. The processes are real: a `sleep` recorded as
`make up` records its pieces, and a real PostgreSQL cluster started and stopped as `make up` and
`make down` do.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from deploy import processes
from deploy.postgres import Cluster, find_binaries, server_user_problem
from deploy.settings import Deployment
from outcome_flywheel.settings import PROJECT_ROOT
from tests import PROJECT_ROOT
from tests.deploy_fixtures import piece, run_module, scrubbed_env


def _project(root: Path) -> Path:
    """A project's leftovers: a warehouse, a model link, the embedded instance, the cache."""
    (root / "data" / "warehouse" / "rollouts").mkdir(parents=True)
    (root / "data" / "warehouse.duckdb").write_text("x")
    (root / ".cache" / "tiny").mkdir(parents=True)
    (root / "data" / "models").mkdir()
    (root / "data" / "models" / "tiny-local").symlink_to(root / ".cache" / "tiny")
    (root / ".dagster").mkdir()
    (root / ".dagster" / "dagster.yaml").write_text("{}\n")
    return root


def _clean(project: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return run_module("deploy.clean", ["--project", str(project), *args], scrubbed_env(**env))


def _left(project: Path) -> set[str]:
    return {str(p.relative_to(project)) for p in project.rglob("*")}


def test_clean_refuses_while_a_piece_of_make_up_runs(tmp_path):
    project = _project(tmp_path / "project")
    home = tmp_path / "elsewhere" / "prod-home"  # FLYWHEEL_PROD_HOME points outside the project
    before = _left(project)
    with piece(home, "daemon") as daemon:
        for args in ([], ["--prod"]):
            result = _clean(project, *args, FLYWHEEL_PROD_HOME=str(home))
            assert result.returncode == 1, result.stdout + result.stderr
            assert (
                "refused" in result.stderr
                and re.search(rf"daemon +pid {daemon.pid} ", result.stderr)
                and "make down" in result.stderr
            )
            assert str(home) in result.stderr
            assert _left(project) == before and (home / "pids" / "daemon.pid").exists()
        record = processes.read_record(home, "daemon")
    # Stopped (`make down`): a pid file left behind names a dead process, as `make down` judges it.
    processes.write_record(home, record)
    result = _clean(project, FLYWHEEL_PROD_HOME=str(home))
    assert result.returncode == 0, result.stdout + result.stderr
    assert _left(project) == set() and f"removed {project / 'data'}" in result.stdout
    assert home.exists()  # the production home is `make clean-prod`'s


def test_clean_refuses_while_make_up_is_starting(tmp_path):
    from deploy import guard

    project = _project(tmp_path / "project")
    home = project / ".dagster-prod"  # the default home: no variable needed
    with guard.up_lock(home):  # `make up` holds it from before its first pid file
        result = _clean(project)
        assert result.returncode == 1 and re.search(rf"make up +pid {os.getpid()} ", result.stderr), (
            result.stdout + result.stderr
        )
    assert (project / "data" / "warehouse.duckdb").exists()
    assert _clean(project).returncode == 0 and not (project / "data").exists()


def test_make_clean_without_the_venv_keeps_a_cluster_and_refuses_while_up_runs(tmp_path):
    """The Makefile's clean on a project without .venv: python3 alone (here `python -S`: no psutil)."""
    project = _project(tmp_path / "project")
    shutil.copy(PROJECT_ROOT / "Makefile", project / "Makefile")
    shutil.copytree(PROJECT_ROOT / "deploy", project / "deploy", ignore=shutil.ignore_patterns("__pycache__"))
    (project / "data" / "postgres").mkdir()
    (project / "data" / "postgres" / "PG_VERSION").write_text("15\n")
    env = scrubbed_env()

    def make_clean():
        return subprocess.run(
            ["make", "-s", "clean", f"PYTHON={sys.executable} -S"],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    with piece(project / ".dagster-prod", "webserver"):
        refused = make_clean()
        assert refused.returncode != 0 and "webserver" in refused.stderr and "refused" in refused.stderr, (
            refused.stdout + refused.stderr
        )
        assert (project / "data" / "warehouse.duckdb").exists()
    result = make_clean()
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"kept {project / 'data' / 'postgres'}: a PostgreSQL cluster" in result.stdout
    assert (project / "data" / "postgres" / "PG_VERSION").exists()
    assert (
        not (project / "data" / "warehouse").exists()
        and not (project / ".dagster").exists()
        and not (project / ".cache").exists()
    )


@pytest.mark.production
@pytest.mark.skipif(find_binaries() is None, reason="PostgreSQL is not installed (initdb, pg_ctl)")
@pytest.mark.skipif(server_user_problem() is not None, reason=f"PostgreSQL cannot run here: {server_user_problem()}")
def test_clean_keeps_the_cluster_and_clean_prod_removes_it_only_after_down():
    # The `postgres` user (tests as root) must reach the cluster: a 0755 folder, as tests/deploy/test_production.py does.
    project = Path(tempfile.mkdtemp(prefix="flywheel-clean-"))
    project.chmod(0o755)
    try:
        _project(project)
        home, pg_dir = project / ".dagster-prod", project / "data" / "postgres"
        d = Deployment(
            home=home,
            data_dir=project / "data",
            pg_dir=pg_dir,
            pg_port=processes.free_port(),
            code_server_port=1,
            webserver_port=2,
            api_port=3,
        )
        cluster = Cluster(pg_dir, d.pg_port, find_binaries())
        cluster.init()
        cluster.start()
        try:
            # As deploy.up records PostgreSQL.
            processes.write_record(
                home, processes.ProcessRecord.of("postgres", cluster.postmaster_pid(), str(cluster.log_file))
            )
            d.save()
            for args in ([], ["--prod"]):
                result = _clean(project, *args)
                assert result.returncode == 1 and re.search(r"postgres +pid \d+ ", result.stderr), (
                    result.stdout + result.stderr
                )
            # Its pid file lost: the server on the cluster in data/ still refuses both.
            (home / "pids" / "postgres.pid").rename(home / "postgres.pid.away")
            for args in ([], ["--prod"]):
                result = _clean(project, *args)
                assert result.returncode == 1 and f"serving the cluster {pg_dir}" in result.stderr, (
                    result.stdout + result.stderr
                )
            (home / "postgres.pid.away").rename(home / "pids" / "postgres.pid")
            assert cluster.running() and (project / "data" / "warehouse.duckdb").exists()
            down = run_module(
                "deploy.down", ["--home", str(home)], scrubbed_env()
            )  # `make down`, from what deploy.json records
            assert down.returncode == 0 and "postgres: stopped pid" in down.stdout, down.stdout + down.stderr
        finally:
            if cluster.running():
                cluster.stop()
        result = _clean(project)
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"kept {pg_dir}: a PostgreSQL cluster" in result.stdout
        assert _left(project) >= {"data/postgres/PG_VERSION", ".dagster-prod/deploy.json"}
        assert not {"data/warehouse.duckdb", "data/warehouse", ".dagster", ".cache"} & _left(project)
        prod = _clean(project, "--prod")
        assert prod.returncode == 0, prod.stdout + prod.stderr
        assert prod.stdout.splitlines() == [
            f"make clean-prod: removed {pg_dir} (the PostgreSQL cluster)",
            f"make clean-prod: removed {home} (the production home)",
        ]
        assert not pg_dir.exists() and not home.exists()
        assert _clean(project, "--prod").stdout.startswith("make clean-prod: nothing to remove")
    finally:
        shutil.rmtree(project, ignore_errors=True)


def test_clean_refuses_while_a_process_uses_data_whatever_its_home(tmp_path):
    """A deployment started with a home `make clean` is not told of (issue 47, item 7): its processes
    are found by what they use of data/: their folder, FLYWHEEL_DATA_DIR, an open file."""
    project = _project(tmp_path / "project")
    data = project / "data"
    env = scrubbed_env()
    users = {
        "FLYWHEEL_DATA_DIR": subprocess.Popen(
            ["sleep", "600"], cwd=tmp_path, env={**env, "FLYWHEEL_DATA_DIR": str(data)}
        ),
        "works in": subprocess.Popen(["sleep", "600"], cwd=data / "warehouse", env=env),
        "open": subprocess.Popen(["sleep", "600"], cwd=tmp_path, env=env, stdin=open(data / "warehouse.duckdb")),
    }
    try:
        before = _left(project)
        result = _clean(project)
        assert result.returncode == 1, result.stdout + result.stderr
        for how, process in users.items():
            assert re.search(rf"sleep +pid {process.pid} .*{how}", result.stderr), (how, result.stderr)
        assert _left(project) == before
        home = tmp_path / "prod-home"  # the same for `make clean-prod` and its home
        (home / "pids").mkdir(parents=True)
        with subprocess.Popen(["sleep", "600"], cwd=tmp_path, env={**env, "DAGSTER_HOME": str(home)}) as other:
            try:
                prod = _clean(project, "--prod", "--home", str(home))
                assert prod.returncode == 1 and re.search(rf"sleep +pid {other.pid} +DAGSTER_HOME=", prod.stderr), (
                    prod.stderr
                )
                assert home.is_dir()
            finally:
                other.kill()
    finally:
        for process in users.values():
            process.kill()
            process.wait()
    result = _clean(project)
    assert result.returncode == 0 and not data.exists(), result.stdout + result.stderr
