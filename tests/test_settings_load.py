"""Every documented FLYWHEEL_* variable, set to a usable value that is not its default, lets the code
location load; set to an unusable one, it stops the load with one line naming it.

The variables come from the settings module (RULES and FREE_FORM), so a new variable without an
example here fails `test_every_variable_has_examples`; docs/settings.md's table must list the same ones.
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
    "FLYWHEEL_NOTE_FORMAT": "call_first",
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
    "FLYWHEEL_MLFLOW_PORT": "5051",
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
    "FLYWHEEL_MLFLOW_TRACKING_URI": "http://127.0.0.1:5000",
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
    "FLYWHEEL_NOTE_FORMAT": "prose",
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
    "FLYWHEEL_MLFLOW_TRACKING_URI": "ftp://127.0.0.1/mlflow",
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
    "FLYWHEEL_MLFLOW_PORT": "port",
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


def settings_table() -> dict[str, str]:
    """Variable -> default column of the settings table (docs/settings.md; the README points there)."""
    text = (PROJECT_ROOT / "docs" / "settings.md").read_text()
    return dict(re.findall(r"^\| `(FLYWHEEL_[A-Z0-9_]+)` \| ([^|]*) \|", text, flags=re.M))


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


def test_the_settings_table_lists_exactly_the_variables_of_the_settings_module():
    table = settings_table()
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


# -- a resource's fields: the environment first, then the run config on top, field by field ---------
# (resource key, field, variable): every resource field the code location binds to a variable
# (`test_the_table_of_bound_fields_is_complete` finds them from the loaded definitions).
BOUND = [
    *(("warehouse", f, v) for f, v in (("data_dir", "FLYWHEEL_DATA_DIR"), ("warehouse_url", "FLYWHEEL_WAREHOUSE_URL"))),
    ("warehouse", "s3_endpoint", "FLYWHEEL_S3_ENDPOINT"),
    *(
        ("model_backend", f, f"FLYWHEEL_{f.upper()}")
        for f in ("base_model", "backend", "sampler", "device", "dtype", "seed", "data_dir")
    ),
    ("market_data", "source", "FLYWHEEL_MARKET_DATA"),
    ("market_data", "prices_file", "FLYWHEEL_PRICES_FILE"),
    ("market_data", "data_dir", "FLYWHEEL_DATA_DIR"),
    ("step_runner", "runner", "FLYWHEEL_STEP_RUNNER"),
    ("step_runner", "launcher", "FLYWHEEL_STEP_LAUNCHER"),
    ("step_runner", "processes", "FLYWHEEL_STEP_PROCESSES"),
    *(
        ("step_runner", f"k8s_{f}", f"FLYWHEEL_K8S_{f.upper()}")
        for f in ("image", "namespace", "gpus", "cpu", "memory", "data_pvc", "data_mount", "env_secret")
    ),
    ("feeds", "archive_dir", "FLYWHEEL_FEEDS_ARCHIVE"),
    ("feeds", "feed_urls", "FLYWHEEL_FEED_URLS"),
    ("feeds", "max_headlines", "FLYWHEEL_MAX_HEADLINES"),
    ("feeds", "min_headlines", "FLYWHEEL_MIN_HEADLINES"),
    ("feeds", "data_dir", "FLYWHEEL_DATA_DIR"),
    ("judge", "judge_model", "FLYWHEEL_JUDGE_MODEL"),
    ("audit_log", "path", "FLYWHEEL_AUDIT_LOG"),
    ("audit_log", "live_path", "FLYWHEEL_LIVE_AUDIT_LOG"),
    ("audit_log", "data_dir", "FLYWHEEL_DATA_DIR"),
    ("feedback_log", "path", "FLYWHEEL_FEEDBACK_LOG"),
    ("feedback_log", "data_dir", "FLYWHEEL_DATA_DIR"),
    ("tracking", "data_dir", "FLYWHEEL_DATA_DIR"),
    ("tracking", "tracking_uri", "FLYWHEEL_MLFLOW_TRACKING_URI"),
]
# What a run config sets instead: usable, and not the example above.
OTHER = {
    "FLYWHEEL_DATA_DIR": "{tmp}/other-data",
    "FLYWHEEL_WAREHOUSE_URL": "s3://flywheel-other/warehouse",
    "FLYWHEEL_S3_ENDPOINT": "http://127.0.0.1:9000",
    "FLYWHEEL_BASE_MODEL": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "FLYWHEEL_BACKEND": "torch",
    "FLYWHEEL_SAMPLER": "torch",
    "FLYWHEEL_DEVICE": "cuda:1",
    "FLYWHEEL_DTYPE": "float16",
    "FLYWHEEL_SEED": 7,
    "FLYWHEEL_MARKET_DATA": "file",
    "FLYWHEEL_PRICES_FILE": "{tmp}/other_close.csv",
    "FLYWHEEL_STEP_RUNNER": "subprocess",
    "FLYWHEEL_STEP_LAUNCHER": "accelerate",
    "FLYWHEEL_STEP_PROCESSES": 4,
    "FLYWHEEL_K8S_IMAGE": "registry.example/flywheel:2.0",
    "FLYWHEEL_K8S_NAMESPACE": "ml-other",
    "FLYWHEEL_K8S_GPUS": 4,
    "FLYWHEEL_K8S_CPU": "16",
    "FLYWHEEL_K8S_MEMORY": "64Gi",
    "FLYWHEEL_K8S_DATA_PVC": "flywheel-other",
    "FLYWHEEL_K8S_DATA_MOUNT": "/mnt/other",
    "FLYWHEEL_K8S_ENV_SECRET": "flywheel-other-s3",
    "FLYWHEEL_FEEDS_ARCHIVE": "{tmp}/other_archive",
    "FLYWHEEL_FEED_URLS": "https://example.net/other.xml",
    "FLYWHEEL_MAX_HEADLINES": 5,
    "FLYWHEEL_MIN_HEADLINES": 3,
    "FLYWHEEL_JUDGE_MODEL": "Qwen/Qwen3-4B",
    "FLYWHEEL_FEEDBACK_LOG": "{tmp}/other_feedback.jsonl",
    "FLYWHEEL_AUDIT_LOG": "{tmp}/other_audit.jsonl",
    "FLYWHEEL_LIVE_AUDIT_LOG": "{tmp}/other_live.jsonl",
    "FLYWHEEL_MLFLOW_TRACKING_URI": "sqlite:///{tmp}/other-mlflow.db",
}
ENV_VAR_TYPES = (dg.EnvVar, type(dg.EnvVar.int("FLYWHEEL_SEED")))


def _other(name: str, tmp: Path):
    value = OTHER[name]
    return value.format(tmp=tmp) if isinstance(value, str) else value


@pytest.fixture(scope="module")
def every_variable(tmp_path_factory):
    """The code location loaded once with every variable at its example; the environment kept for its runs."""
    folder = tmp_path_factory.mktemp("every_variable")
    with pytest.MonkeyPatch.context() as patch, environment(patch, {n: _valid(n, folder) for n in VARIABLES}):
        yield folder, load_definitions().resources


def _resolved(resources: dict, key: str, config: dict):
    """What an asset receives of resource `key` in a run whose run config sets `config` on it."""
    seen = {}

    @dg.asset(required_resource_keys={key})
    def receives(context):
        seen["value"] = getattr(context.resources, key)

    run_config = {"resources": {key: {"config": config}}}
    assert dg.materialize([receives], resources={key: resources[key]}, run_config=run_config).success
    return seen["value"]


def test_the_table_of_bound_fields_is_complete(every_variable):
    _, resources = every_variable
    found = set()
    for key, resource in resources.items():
        for field in type(resource).model_fields:
            value = getattr(resource, field)
            if isinstance(value, ENV_VAR_TYPES):
                found.add((key, field, value.env_var_name if isinstance(value, dg.EnvVar) else value.name))
    assert found == set(BOUND), (sorted(found - set(BOUND)), sorted(set(BOUND) - found))
    assert {v for _, _, v in BOUND} == set(OTHER)
    for name, value in OTHER.items():
        assert str(value) != VALID[name] and settings_problems({name: str(value)}) == [], name


@pytest.mark.parametrize("key,field,name", BOUND, ids=[f"{k}.{f}" for k, f, _ in BOUND])
def test_a_run_config_sets_the_fields_it_names_and_the_environment_keeps_the_others(key, field, name, every_variable):
    """The issue's case: FLYWHEEL_FEEDS_ARCHIVE set and a run config with `max_headlines: 12` (as
    scripts/demo_daily_rl.py passes) read the bundled archive: a resource's run config replaced every
    value bound from the environment. Now, for each field bound to a variable: a run config that sets
    another field leaves it at the variable's value, and one that sets it wins over the variable."""
    tmp, resources = every_variable
    siblings = [(f, n) for k, f, n in BOUND if k == key and f != field]
    # run config on another field: a sibling bound to a variable, else a field of no variable
    probe = {siblings[0][0]: _other(siblings[0][1], tmp)} if siblings else {"temperature": 0.25}
    kept = _resolved(resources, key, probe)
    assert str(getattr(kept, field)) == _valid(name, tmp), (field, getattr(kept, field))
    assert all(getattr(kept, f) == v for f, v in probe.items())
    # run config on this field: it wins; the siblings keep their variables' values
    over = _resolved(resources, key, {field: _other(name, tmp)})
    assert getattr(over, field) == _other(name, tmp)
    assert {f: str(getattr(over, f)) for f, _ in siblings} == {f: _valid(n, tmp) for f, n in siblings}


def test_the_demos_run_config_keeps_the_feeds_archive(every_variable):
    """scripts/demo_daily_rl.py's run config (`max_headlines: 12`) with FLYWHEEL_FEEDS_ARCHIVE set: the
    day reads that archive, 12 headlines of it (it read the bundled archive)."""
    from scripts.demo_daily_rl import DEMO_MAX_HEADLINES, demo_run_config

    tmp, resources = every_variable
    feeds = _resolved(resources, "feeds", demo_run_config()["resources"]["feeds"]["config"])
    assert (feeds.archive_dir, feeds.max_headlines) == (_valid("FLYWHEEL_FEEDS_ARCHIVE", tmp), DEMO_MAX_HEADLINES)
    assert feeds.min_headlines == int(_valid("FLYWHEEL_MIN_HEADLINES", tmp))
