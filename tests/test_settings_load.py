"""Every documented FLYWHEEL_* variable, set to a usable value that is not its default, lets the code
location load; set to an unusable one, it stops the load with one line naming it.

The variables come from the settings module (RULES and FREE_FORM), so a new variable without an
example here fails `test_every_variable_has_examples`; the README's table must list the same ones.
Loading is done in-process per variable (fast); `dagster definitions validate`, a subprocess, runs
once with every value set together.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
import pytest

from outcome_flywheel.settings import (
    DEFAULTS,
    FREE_FORM,
    PROJECT_ROOT,
    RULES,
    SAMPLE_DATA,
    SettingsError,
    settings_problems,
)

VARIABLES = sorted(set(RULES) | set(FREE_FORM))

# Usable and not the default. "{tmp}" is the test's folder (paths must not touch the project's data).
VALID = {
    "FLYWHEEL_DATA_DIR": "{tmp}/data",
    "FLYWHEEL_BASE_MODEL": "Qwen/Qwen3-0.6B",
    "FLYWHEEL_BACKEND": "mlx",
    "FLYWHEEL_SAMPLER": "vllm",
    "FLYWHEEL_DEVICE": "cpu",
    "FLYWHEEL_DTYPE": "bfloat16",
    "FLYWHEEL_SEED": "42",
    "FLYWHEEL_START_DATE": "2025-01-02",
    "FLYWHEEL_DAILY_RL_START_DATE": "2025-11-10",
    "FLYWHEEL_PREFERENCES_START_DATE": "2025-07-01",
    "FLYWHEEL_TIMEZONE": "Europe/London",
    "FLYWHEEL_FEEDS_ARCHIVE": "{tmp}/feeds_archive",
    "FLYWHEEL_FEED_URLS": "https://example.com/rss.xml, https://example.org/feed?x=1",
    "FLYWHEEL_MAX_HEADLINES": "12",
    "FLYWHEEL_MIN_HEADLINES": "2",
    "FLYWHEEL_ROLLOUTS_PER_HEADLINE": "4",
    "FLYWHEEL_MAX_NEW_TOKENS": "64",
    "FLYWHEEL_OUTCOME_HORIZON": "5",
    "FLYWHEEL_PRICE_MAX_STALENESS": "2",
    "FLYWHEEL_OUTCOME_COST_BPS": "2.5",
    "FLYWHEEL_JUDGE_MODEL": "Qwen/Qwen3-1.7B",
    "FLYWHEEL_FEEDBACK_LOG": "{tmp}/feedback.jsonl",
    "FLYWHEEL_AUDIT_LOG": "{tmp}/audit_log.jsonl",
    "FLYWHEEL_LIVE_AUDIT_LOG": "{tmp}/live_audit_log.jsonl",
    "FLYWHEEL_API_HOST": "0.0.0.0",
    "FLYWHEEL_API_PORT": "9000",
    "FLYWHEEL_API_TOKEN": "a-long-enough-token-0123",
    "FLYWHEEL_MARKET_DATA": "yfinance",
    "FLYWHEEL_PRICES_FILE": "{tmp}/daily_close.csv",
    "FLYWHEEL_MIN_NEW_PAIRS": "3",
    "FLYWHEEL_TRAIN_COOLDOWN_S": "60",
    "FLYWHEEL_PREFERENCE_CONTEXT": "regime,note",
    "FLYWHEEL_WAREHOUSE_URL": "s3://flywheel-test/warehouse",
    "FLYWHEEL_S3_ENDPOINT": "http://127.0.0.1:8333",
    "FLYWHEEL_STEP_RUNNER": "in_process",
    "FLYWHEEL_STEP_LAUNCHER": "torchrun",
    "FLYWHEEL_STEP_PROCESSES": "2",
    "FLYWHEEL_K8S_IMAGE": "registry.example/flywheel:1.0",
    "FLYWHEEL_K8S_NAMESPACE": "ml",
    "FLYWHEEL_K8S_GPUS": "2",
    "FLYWHEEL_DAGSTER_URL": "http://127.0.0.1:3030",
    "FLYWHEEL_SERVE_MAX_TOKENS": "64",
    "FLYWHEEL_DISTILL_MIN_SAMPLES": "20",
    "FLYWHEEL_TRAINER_LOCK_WAIT_S": "0",
    "FLYWHEEL_TRAINER_LOCK_LEASE_S": "0.5",
    "FLYWHEEL_TRAIN_MEMORY_GIB": "16",
    "FLYWHEEL_TRAIN_RECOMPUTE": "never",
    "FLYWHEEL_PG_PORT": "55432",
    "FLYWHEEL_CODE_SERVER_PORT": "4266",
    "FLYWHEEL_WEBSERVER_PORT": "3031",
    "FLYWHEEL_DAILY_SCHEDULE": "on",
    "FLYWHEEL_TEACHER_MODEL": "{tmp}/teacher",
    "FLYWHEEL_LLAMA_CPP_DIR": "{tmp}/llama.cpp",
    "FLYWHEEL_PROD_HOME": "{tmp}/dagster-prod",
    "FLYWHEEL_PG_DIR": "{tmp}/postgres",
    "FLYWHEEL_K8S_CPU": "8",
    "FLYWHEEL_K8S_MEMORY": "32Gi",
    "FLYWHEEL_K8S_DATA_PVC": "flywheel-data",
    "FLYWHEEL_K8S_DATA_MOUNT": "/mnt/flywheel",
    "FLYWHEEL_K8S_ENV_SECRET": "flywheel-s3",
}

# Unusable, for every variable with a rule (free-form ones are checked where they are used).
INVALID = {
    "FLYWHEEL_BACKEND": "foo",
    "FLYWHEEL_SAMPLER": "fast",
    "FLYWHEEL_DEVICE": "gpu",
    "FLYWHEEL_DTYPE": "bf16",
    "FLYWHEEL_SEED": "-1",
    "FLYWHEEL_START_DATE": "2025-13-01",
    "FLYWHEEL_DAILY_RL_START_DATE": "20251103",
    "FLYWHEEL_PREFERENCES_START_DATE": "June 3",
    "FLYWHEEL_TIMEZONE": "Mars/Olympus_Mons",
    "FLYWHEEL_FEED_URLS": "file:///etc/passwd",
    "FLYWHEEL_MAX_HEADLINES": "0",
    "FLYWHEEL_MIN_HEADLINES": "-1",
    "FLYWHEEL_ROLLOUTS_PER_HEADLINE": "9",
    "FLYWHEEL_MAX_NEW_TOKENS": "0",
    "FLYWHEEL_OUTCOME_HORIZON": "61",
    "FLYWHEEL_PRICE_MAX_STALENESS": "-1",
    "FLYWHEEL_OUTCOME_COST_BPS": "-1",
    "FLYWHEEL_MARKET_DATA": "yahoo",
    "FLYWHEEL_MIN_NEW_PAIRS": "ten",
    "FLYWHEEL_TRAIN_COOLDOWN_S": "-5",
    "FLYWHEEL_API_HOST": "my host",
    "FLYWHEEL_API_PORT": "70000",
    "FLYWHEEL_API_TOKEN": "short",
    "FLYWHEEL_PREFERENCE_CONTEXT": "regime;note",
    "FLYWHEEL_WAREHOUSE_URL": "gs://bucket/warehouse",
    "FLYWHEEL_S3_ENDPOINT": "127.0.0.1:8333",
    "FLYWHEEL_STEP_RUNNER": "ray",
    "FLYWHEEL_STEP_LAUNCHER": "mpirun",
    "FLYWHEEL_STEP_PROCESSES": "0",
    "FLYWHEEL_K8S_GPUS": "-1",
    "FLYWHEEL_DAGSTER_URL": "127.0.0.1:3030",
    "FLYWHEEL_SERVE_MAX_TOKENS": "0",
    "FLYWHEEL_DISTILL_MIN_SAMPLES": "many",
    "FLYWHEEL_TRAINER_LOCK_WAIT_S": "-5",
    "FLYWHEEL_TRAINER_LOCK_LEASE_S": "0.01",
    "FLYWHEEL_TRAIN_MEMORY_GIB": "0",
    "FLYWHEEL_TRAIN_RECOMPUTE": "sometimes",
    "FLYWHEEL_PG_PORT": "70000",
    "FLYWHEEL_CODE_SERVER_PORT": "0",
    "FLYWHEEL_WEBSERVER_PORT": "port",
    "FLYWHEEL_DAILY_SCHEDULE": "yes",
}

# The packages whose modules read the environment at import (partitions, resources' EnvVars).
RELOADED = ("pipelines", "assets", "resources")


def _valid(name: str, tmp: Path) -> str:
    return VALID[name].format(tmp=tmp)


@pytest.fixture()
def tmp(tmp_path) -> Path:
    """Where the path variables point: a one-day feed archive and copies of the bundled logs and prices."""
    (tmp_path / "feeds_archive" / "2025-11-12").mkdir(parents=True)
    shutil.copy(SAMPLE_DATA / "audit_log.jsonl", tmp_path / "audit_log.jsonl")
    shutil.copy(SAMPLE_DATA / "prices" / "daily_close.csv", tmp_path / "daily_close.csv")
    return tmp_path


@contextmanager
def environment(monkeypatch, values: dict[str, str]):
    """Only `values` among the FLYWHEEL_* variables, for the duration."""
    with monkeypatch.context() as patch:
        for name in [n for n in os.environ if n.startswith("FLYWHEEL_")]:
            patch.delenv(name)
        for name, value in values.items():
            patch.setenv(name, value)
        yield


def load_definitions() -> dg.Definitions:
    """Import the code location afresh (as `dagster` does) and check that it loads; the modules the
    rest of the session imported are put back afterwards."""
    kept = {n: m for n, m in sys.modules.items() if n.split(".")[0] in RELOADED}
    for name in kept:
        del sys.modules[name]
    try:
        defs = importlib.import_module("pipelines.definitions").defs
        dg.Definitions.validate_loadable(defs)
        return defs
    finally:
        for name in [n for n in sys.modules if n.split(".")[0] in RELOADED]:
            del sys.modules[name]
        sys.modules.update(kept)


def readme_table() -> dict[str, str]:
    """Variable -> default column of the README's configuration table."""
    readme = (PROJECT_ROOT / "README.md").read_text()
    section = readme.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    return dict(re.findall(r"^\| `(FLYWHEEL_[A-Z0-9_]+)` \| ([^|]*) \|", section, flags=re.M))


def test_every_variable_has_examples():
    assert set(VALID) == set(VARIABLES)
    assert set(INVALID) == set(RULES)


def test_the_examples_are_what_they_claim(tmp):
    for name in VARIABLES:
        value = _valid(name, tmp)
        assert value != DEFAULTS.get(name), name
        assert settings_problems({name: value}) == [], name
    for name, value in INVALID.items():
        assert len(settings_problems({name: value})) == 1, name


def test_the_readme_table_lists_exactly_the_variables_of_the_settings_module():
    table = readme_table()
    assert set(table) == set(VARIABLES), (sorted(set(table) - set(VARIABLES)), sorted(set(VARIABLES) - set(table)))
    for name, default in DEFAULTS.items():
        assert table[name].startswith(f"`{default}`"), (name, default, table[name])


@pytest.mark.parametrize("name", VARIABLES)
def test_a_valid_value_loads(name, tmp, monkeypatch):
    with environment(monkeypatch, {name: _valid(name, tmp)}):
        load_definitions()


@pytest.mark.parametrize("name", sorted(INVALID))
def test_an_invalid_value_stops_the_load_naming_the_variable(name, tmp, monkeypatch):
    with environment(monkeypatch, {name: INVALID[name]}), pytest.raises(SettingsError) as err:
        load_definitions()
    lines = [line for line in str(err.value).splitlines() if line.startswith("  - ")]
    assert len(lines) == 1 and lines[0].startswith(f"  - {name}="), str(err.value)
    assert "allowed: " + RULES[name].allowed in lines[0]


def test_max_headlines_reaches_the_feeds(tmp, monkeypatch):
    """The issue's case: FLYWHEEL_MAX_HEADLINES=12 used to stop the load (a pydantic ge=1 on the
    EnvVar field, checked against its placeholder 0); now the day's feeds keep 12."""
    with environment(monkeypatch, {"FLYWHEEL_MAX_HEADLINES": "12", "FLYWHEEL_MIN_HEADLINES": "3"}):
        feeds = load_definitions().resources["feeds"]
        with dg.build_resources({"feeds": feeds}) as built:
            assert (built.feeds.max_headlines, built.feeds.min_headlines) == (12, 3)


def test_a_resource_checks_its_resolved_fields_when_a_run_starts(tmp, monkeypatch):
    """A value that changed after the load (or a field set in the run config) meets the variable's
    rule too: the resource refuses to start, naming the variable."""
    with environment(
        monkeypatch, {"FLYWHEEL_MAX_HEADLINES": "12", "FLYWHEEL_MIN_HEADLINES": "2", "FLYWHEEL_BACKEND": "mlx"}
    ):
        resources = load_definitions().resources
        monkeypatch.setenv("FLYWHEEL_MAX_HEADLINES", "0")
        monkeypatch.setenv("FLYWHEEL_BACKEND", "foo")
        for key, name in (("feeds", "FLYWHEEL_MAX_HEADLINES"), ("model_backend", "FLYWHEEL_BACKEND")):
            with pytest.raises(dg.DagsterResourceFunctionError) as err, dg.build_resources({key: resources[key]}):
                pass
            assert isinstance(err.value.__cause__, SettingsError) and name in str(err.value.__cause__), err.value


def test_dagster_definitions_validate_with_every_variable_set(tmp):
    """The command `make ui` and the runs go through, once, with every variable at its example."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
    env.update({name: _valid(name, tmp) for name in VARIABLES}, DAGSTER_HOME=str(tmp))
    proc = subprocess.run(
        [str(PROJECT_ROOT / ".venv" / "bin" / "dagster"), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
