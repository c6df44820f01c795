"""The code location as the Dagster UI shows it: a snapshot of its shape, and what every entry must carry.

`tests/snapshots/defs.json` holds the sorted shape of `pipelines.definitions.defs`: assets (group,
kinds, partitions, deps), asset checks (asset, blocking), jobs (assets), schedules (cron, timezone,
default status) and sensors. A change to it fails here with the difference; when the change is
meant, regenerate the file and commit it with the change:

    UPDATE_DEFS_SNAPSHOT=1 .venv/bin/python -m pytest -q tests/pipelines/test_defs.py
"""

from __future__ import annotations

import json
import os
import types
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest

from assets.catalog import COLUMNS, UNDESCRIBED
from outcome_flywheel.settings import PROJECT_ROOT
from tests import PROJECT_ROOT

SNAPSHOT = PROJECT_ROOT / "tests" / "snapshots" / "defs.json"
UPDATE_VARIABLE = "UPDATE_DEFS_SNAPSHOT"
HIDDEN_JOB = "__ASSET_JOB"  # Dagster's implicit job over all assets; not shown as a job in the UI


@pytest.fixture(scope="module")
def defs() -> dg.Definitions:
    from pipelines.definitions import defs

    return defs


@pytest.fixture(scope="module")
def graph(defs):
    return defs.resolve_asset_graph()


def _partitions(partitions_def) -> str | None:
    if partitions_def is None:
        return None
    if isinstance(partitions_def, dg.DailyPartitionsDefinition):
        return "daily"  # the start date follows the environment; test_partition_windows checks it
    return type(partitions_def).__name__


def shape(defs: dg.Definitions) -> dict:
    graph = defs.resolve_asset_graph()
    repo = defs.get_repository_def()
    assets = {}
    for key in sorted(graph.get_all_asset_keys(), key=lambda k: k.to_user_string()):
        node = graph.get(key)
        assets[key.to_user_string()] = {
            "group": node.group_name,
            "kinds": sorted(node.kinds),
            "partitions": _partitions(node.partitions_def),
            "deps": sorted(k.to_user_string() for k in node.parent_keys),
            "pools": sorted(node.pools or []),
        }
    checks = {}
    for check_key in sorted(graph.asset_check_keys, key=lambda k: (k.asset_key.to_user_string(), k.name)):
        spec = graph.get_check_spec(check_key)
        checks[f"{check_key.asset_key.to_user_string()}:{check_key.name}"] = {"blocking": spec.blocking}
    jobs = {}
    for name in sorted(repo.job_names):
        if name == HIDDEN_JOB:
            continue
        job = repo.get_job(name)
        jobs[name] = {
            "assets": sorted(k.to_user_string() for k in job.asset_layer.executable_asset_keys),
            "partitioned": job.partitions_def is not None,
        }
    schedules = {
        s.name: {
            "job": s.job_name,
            "cron": s.cron_schedule,
            "timezone": s.execution_timezone,
            "default_status": s.default_status.value,
        }
        for s in sorted(repo.schedule_defs, key=lambda s: s.name)
    }
    sensors = {
        s.name: {
            "jobs": sorted(t.job_name for t in s.targets),
            "default_status": s.default_status.value,
            "minimum_interval_seconds": s.minimum_interval_seconds,
        }
        for s in sorted(repo.sensor_defs, key=lambda s: s.name)
    }
    return {"assets": assets, "asset_checks": checks, "jobs": jobs, "schedules": schedules, "sensors": sensors}


def _differences(old, new, path="") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new)):
            where = f"{path}.{k}" if path else k
            if k not in new:
                out.append(f"- removed {where}: {json.dumps(old[k])}")
            elif k not in old:
                out.append(f"+ added   {where}: {json.dumps(new[k])}")
            else:
                out += _differences(old[k], new[k], where)
        return out
    return [] if old == new else [f"~ changed {path}: {json.dumps(old)} -> {json.dumps(new)}"]


def test_definitions_match_the_snapshot(defs):
    current = shape(defs)
    text = json.dumps(current, indent=1, sort_keys=True) + "\n"
    if os.environ.get(UPDATE_VARIABLE):
        SNAPSHOT.parent.mkdir(parents=True, exist_ok=True)
        SNAPSHOT.write_text(text)
        return
    assert SNAPSHOT.exists(), f"no snapshot yet: run with {UPDATE_VARIABLE}=1 to write {SNAPSHOT}"
    committed = json.loads(SNAPSHOT.read_text())
    diff = _differences(committed, current)
    assert not diff, (
        "the code location's shape differs from tests/snapshots/defs.json:\n  "
        + "\n  ".join(diff)
        + f"\nIf the change is meant: {UPDATE_VARIABLE}=1 .venv/bin/python -m pytest -q tests/pipelines/test_defs.py, and commit the snapshot."
    )


def test_every_asset_check_job_schedule_and_sensor_is_described(defs, graph):
    repo = defs.get_repository_def()
    missing = [
        f"asset {k.to_user_string()}"
        for k in graph.get_all_asset_keys()
        if not (graph.get(k).description or "").strip()
    ]
    missing += [
        f"check {k.asset_key.to_user_string()}:{k.name}"
        for k in graph.asset_check_keys
        if not (graph.get_check_spec(k).description or "").strip()
    ]
    missing += [
        f"job {name}"
        for name in repo.job_names
        if name != HIDDEN_JOB and not (repo.get_job(name).description or "").strip()
    ]
    missing += [f"schedule {s.name}" for s in repo.schedule_defs if not (s.description or "").strip()]
    missing += [f"sensor {s.name}" for s in repo.sensor_defs if not (s.description or "").strip()]
    assert not missing, f"without a description: {missing}"


def test_every_asset_has_owners_and_a_code_reference(graph):
    for key in graph.get_all_asset_keys():
        node = graph.get(key)
        assert node.owners, f"{key.to_user_string()} has no owners"
        refs = node.metadata.get("dagster/code_references")
        assert refs is not None and refs.code_references, f"{key.to_user_string()} has no code reference"


def _schema(node) -> dg.TableSchema | None:
    value = node.metadata.get("dagster/column_schema")
    return getattr(value, "schema", value)


def test_table_assets_carry_a_described_column_schema(graph):
    for key in graph.get_all_asset_keys():
        node = graph.get(key)
        schema = _schema(node)
        if "parquet" in node.kinds:
            assert schema is not None, f"{key.to_user_string()} writes a table but has no dagster/column_schema"
        if schema is None:
            continue
        undescribed = [c.name for c in schema.columns if not c.description or c.description == UNDESCRIBED]
        assert not undescribed, (
            f"{key.to_user_string()}: columns without a description in assets/catalog.py: {undescribed}"
        )
        name = node.metadata["dagster/table_name"]
        table = str(getattr(name, "value", name)).rsplit(".", 1)[-1]
        stale = set(COLUMNS[table]) - {c.name for c in schema.columns}
        assert not stale, f"assets/catalog.py describes columns {sorted(stale)} that the table {table} does not have"


def test_tables_built_in_the_assets_layer_have_the_columns_described():
    """Tables whose column list lives only in assets/catalog.py: what the method really returns."""
    from assets.catalog import column_names
    from outcome_flywheel.daily_rl.day_result import training_summary
    from outcome_flywheel.daily_rl.policy.rollouts import ROLLOUT_COLUMNS
    from outcome_flywheel.daily_rl.reward.rollout_scores import SCORE_COLUMNS
    from outcome_flywheel.preferences.metrics import drift_level
    from outcome_flywheel.preferences.style_match import score_holdout
    from outcome_flywheel.preferences.weighting import PAIR_COLUMNS

    info = {"policy_version": "2025-11-03@base", "kind": "base", "parent_version": None}
    gspo = types.SimpleNamespace(objective="gspo", learning_rate=1e-3)
    timings = {"score_s": 0.0, "train_s": 0.0, "generate_s": 0.0, "kl_s": 0.0}
    row = training_summary(
        "2025-11-03",
        info,
        None,
        [],
        pd.DataFrame(columns=SCORE_COLUMNS),
        pd.DataFrame(columns=ROLLOUT_COLUMNS),
        0,
        0.0,
        gspo,
        "2025-11-03",
        timings,
    )
    assert list(row) == column_names("policy_training")

    scored = score_holdout(None, pd.DataFrame(columns=PAIR_COLUMNS), "line", 0.02)
    assert set(scored.columns) | {"adapter_run", "evaluated_at"} == set(column_names("holdout_eval"))
    assert set(drift_level([])) | {"computed_at", "last_runs"} == set(column_names("style_drift"))


def _config_fields_without_description(config_field, path: str) -> list[str]:
    missing = []
    config_type = config_field.config_type
    for name, field in (getattr(config_type, "fields", None) or {}).items():
        where = f"{path}.{name}"
        if not (field.description or "").strip():
            missing.append(where)
        missing += _config_fields_without_description(field, where)
    return missing


def test_run_config_fields_are_described(defs, graph):
    missing = []
    seen = set()
    for key in graph.get_all_asset_keys():
        assets_def = graph.get(key).assets_def
        op = assets_def.op
        if op.name in seen or op.config_schema is None:
            continue
        seen.add(op.name)
        missing += (
            _config_fields_without_description(op.config_field, f"ops.{op.name}.config") if op.config_field else []
        )
    assert {"daily_update", "preference_adapter", "base_model"} <= seen
    for name, resource in defs.get_repository_def().get_top_level_resources().items():
        if resource.config_field is not None:
            missing += _config_fields_without_description(resource.config_field, f"resources.{name}.config")
    assert not missing, f"run-config fields without a description (UI launchpad): {missing}"


def test_base_model_is_upstream_of_what_loads_it_and_daily_update_keys_share_their_deps(graph):
    keys = ("rollout_scores", "policy_checkpoint", "rollouts")
    deps = {k: {p.to_user_string() for p in graph.get(dg.AssetKey(k)).parent_keys} - {k} for k in keys}
    assert all(d == {"headlines", "base_model"} for d in deps.values()), deps  # same shape: asset backfills accept it
    for key in ("preference_adapter", "holdout_eval"):
        assert dg.AssetKey("base_model") in graph.get(dg.AssetKey(key)).parent_keys


def test_partition_windows_start_where_the_data_starts(monkeypatch):
    from assets.partitions import DAILY_RL_FIRST_DAY, PREFERENCES_FIRST_DAY, start_date

    for name in ("FLYWHEEL_START_DATE", "FLYWHEEL_DAILY_RL_START_DATE", "FLYWHEEL_PREFERENCES_START_DATE"):
        monkeypatch.delenv(name, raising=False)
    assert (
        sorted(p.name for p in (PROJECT_ROOT / "sample_data" / "feeds_archive").iterdir() if p.is_dir())[0]
        == DAILY_RL_FIRST_DAY
    )
    assert start_date("FLYWHEEL_DAILY_RL_START_DATE", DAILY_RL_FIRST_DAY) == "2025-11-03"
    monkeypatch.setenv("FLYWHEEL_START_DATE", "2025-01-01")  # both areas
    assert start_date("FLYWHEEL_PREFERENCES_START_DATE", PREFERENCES_FIRST_DAY) == "2025-01-01"
    monkeypatch.setenv("FLYWHEEL_PREFERENCES_START_DATE", "2025-05-01")  # one area wins over it
    assert start_date("FLYWHEEL_PREFERENCES_START_DATE", PREFERENCES_FIRST_DAY) == "2025-05-01"


def test_the_daily_loop_in_archive_mode_ends_with_the_archive(monkeypatch):
    from assets.partitions import archive_end_date

    for name in ("FLYWHEEL_FEED_URLS", "FLYWHEEL_FEEDS_ARCHIVE"):
        monkeypatch.delenv(name, raising=False)
    last = sorted(p.name for p in (PROJECT_ROOT / "sample_data" / "feeds_archive").iterdir() if p.is_dir())[-1]
    assert last == "2025-11-28" and archive_end_date("2025-11-03") == "2025-11-29"  # Dagster's end is exclusive
    monkeypatch.setenv("FLYWHEEL_FEED_URLS", "https://example.com/feed.xml")  # live: up to today
    assert archive_end_date("2025-11-03") is None


def test_the_bundled_audit_log_starts_on_the_preference_partitions_first_day():
    from assets.partitions import PREFERENCES_FIRST_DAY
    from outcome_flywheel.preferences.audit_log import records_frame
    from outcome_flywheel.preferences.audit_log_file import AuditLog

    frame = records_frame(AuditLog().parse(), "America/New_York")
    assert frame["decision_date"].min() == PREFERENCES_FIRST_DAY


def test_a_job_run_by_the_demo_belongs_to_the_code_location(data_dir):
    """What the UI needs to list a run on its job's page (its `.dagster/repository` tag; the public
    `execute_job` gives no code-location origin, see tests/pipelines/test_public_dagster_api.py)."""
    from pipelines.launch import IN_PROCESS, REPOSITORY_NAME, code_location_name, run_job

    instance = dg.DagsterInstance.ephemeral()
    # data_dir as run config: the definitions may have been imported before FLYWHEEL_DATA_DIR was set.
    config = {"resources": {"model_backend": {"config": {"data_dir": str(data_dir)}}}, **IN_PROCESS}
    result = run_job("base_model_job", instance, run_config=config)
    assert result.success
    run = instance.get_run_by_id(result.run_id)
    assert run.job_name == "base_model_job"
    assert code_location_name() == "outcome_flywheel"
    label = f"{REPOSITORY_NAME}@{code_location_name()}"
    assert instance.get_runs_count(dg.RunsFilter(job_name="base_model_job", tags={".dagster/repository": label})) == 1


def test_the_workspace_loads_as_the_ui_loads_it():
    """`dagster dev -w workspace.yaml` loads the module without an attribute name: exactly one
    Definitions object may sit at its top level, and the definitions must validate."""
    import subprocess
    import sys

    dagster_cli = Path(sys.executable).parent / "dagster"
    done = subprocess.run(
        [str(dagster_cli), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_backfill_script_selects_the_whole_daily_rl_group(graph):
    from scripts.backfill_daily_rl import ASSETS

    group = {k.to_user_string() for k in graph.get_all_asset_keys() if graph.get(k).group_name == "daily_rl"}
    assert set(ASSETS) == group


def test_daily_update_checks_are_the_ones_declared_beside_their_code(graph):
    """Each check of `daily_update` is declared once (policy/verify.py): the asset's check specs and the
    step's check -> asset mapping are both read from that declaration."""
    from outcome_flywheel.daily_rl.day_step import CHECK_ASSET
    from outcome_flywheel.daily_rl.policy.verify import DAILY_UPDATE_CHECKS, UPDATE_ACCEPTED_BY_GATE

    specs = graph.get(dg.AssetKey("rollouts")).assets_def.check_specs
    assert {(s.asset_key.to_user_string(), s.name, s.blocking, s.description) for s in specs} == {
        (c.asset, c.name, c.blocking, c.description) for c in DAILY_UPDATE_CHECKS
    }
    assert CHECK_ASSET == {c.name: c.asset for c in DAILY_UPDATE_CHECKS}
    assert [c.name for c in DAILY_UPDATE_CHECKS if not c.blocking] == [UPDATE_ACCEPTED_BY_GATE.name]


def _other_value(value, annotation):
    """A value of the run-config field's type that differs from `value` (its settings default)."""
    kind = next(a for a in getattr(annotation, "__args__", (annotation,)) if a is not type(None))
    if kind is bool:
        return not value
    if kind is int:
        return (value or 0) + 3
    if kind is float:
        return (value or 0.0) + 0.125
    if kind is str:
        # another valid choice where the field has a fixed set (objective, credit spans, baselines)
        return {
            "token": "gspo",
            "gspo": "token",
            "side": "call",
            "ticker": "side",
            "loo": "group_std",
            "shared": "per_part",
            "group": "day",
            "note": "ticker",
            "k3": "exact",
            "exact": "k3",
            "probability": "pair",
        }.get(value, "2024-01-02")
    if getattr(kind, "__origin__", None) is list:  # list[str]: the LoRA target modules (a tuple in the settings)
        return ["gate_proj", "up_proj", "down_proj"]
    return {"structure": 1.0}  # dict[str, float]: the reward weights


def test_each_daily_update_run_config_field_sets_the_settings_field_it_is_derived_from():
    """The run config is derived from `RUN_CONFIG_PATHS` and the dataclass fields; a field given in the run
    reaches the `DailyUpdateSettings` field its path names and is described by that field's help (or, where
    the dataclass has none, by the asset's `RUN_CONFIG_DESCRIPTIONS`)."""
    import dataclasses
    import functools

    from assets.daily_rl.daily_update import RUN_CONFIG_DESCRIPTIONS, DailyUpdateConfig
    from outcome_flywheel.daily_rl.day_settings import RUN_CONFIG_PATHS, DailyUpdateSettings
    from resources.settings import path_field

    def at(settings, path):
        return functools.reduce(getattr, path.split("."), settings)

    assert list(DailyUpdateConfig.model_fields) == list(RUN_CONFIG_PATHS)
    defaults = DailyUpdateConfig().settings("tiny-local")
    assert defaults == DailyUpdateSettings()
    for name, path in RUN_CONFIG_PATHS.items():
        if path is None:
            continue
        owner, leaf = path_field(DailyUpdateSettings, path)
        help_text = {f.name: f.metadata.get("help", "") for f in dataclasses.fields(owner)}[leaf]
        description = DailyUpdateConfig.model_fields[name].description
        assert (
            description.startswith(RUN_CONFIG_DESCRIPTIONS[name])
            if name in RUN_CONFIG_DESCRIPTIONS
            else (help_text and help_text in description)
        ), name
        value = {  # fixed sets of choices where the general rule picks no valid other value
            "frozen_span": "ticker",  # default None: its one other valid value
            "kl_span": "note",  # default ticker, whose general other value is a credit span
        }.get(name) or _other_value(at(defaults, path), DailyUpdateConfig.model_fields[name].annotation)
        expected = tuple(value) if isinstance(value, list) else value
        # the exact KL takes the ticker span only; the lean anchor and target hold the pair forms' side pairs
        beside = {
            "kl_span": {"kl_estimator": "k3"},
            "side_lean_anchor": {"counterfactual_form": "pair"},
            "side_lean_target": {"counterfactual_form": "pair"},
        }.get(name, {})
        assert at(DailyUpdateConfig(**{name: value, **beside}).settings("tiny-local"), path) == expected, name
    assert (
        DailyUpdateConfig(full_fine_tune=True, lora_r=4, lora_target_modules=["q_proj"])
        .settings("tiny-local")
        .gspo.lora
        is None
    )


def test_a_models_own_defaults_sit_under_the_run_config_and_over_the_dataclasses(tmp_path, monkeypatch):
    """smollm2-135m-instruct's own defaults (`MODEL_RUN_DEFAULTS`) apply where a run config leaves a field out,
    each differs from the dataclasses' (else it is no default of its own), a given field overrides them, and a
    model without any (tiny-local, a hub id) keeps the dataclasses'. The asset takes them from the models
    resource: a default of its own that breaks a rule fails the run before any process starts. The launchpad's
    description of each such field names the model's own default."""
    import functools

    import dagster as dg

    from assets.daily_rl.daily_update import DailyUpdateConfig, daily_update
    from assets.daily_rl.headlines import headlines
    from outcome_flywheel.daily_rl.day_settings import MODEL_RUN_DEFAULTS, RUN_CONFIG_PATHS, DailyUpdateSettings
    from tests.daily_fixtures import daily_resources

    def at(settings, name):
        value = functools.reduce(getattr, RUN_CONFIG_PATHS[name].split("."), settings)
        return dict(value) if name == "reward_weights" else value

    own = MODEL_RUN_DEFAULTS["smollm2-135m-instruct"]
    smol, plain = DailyUpdateConfig().settings("smollm2-135m-instruct"), DailyUpdateSettings()
    assert own and set(own) <= set(RUN_CONFIG_PATHS)
    for name, value in own.items():
        assert at(smol, name) == value and at(plain, name) != value, name
        assert f"smollm2-135m-instruct: {value!r}" in DailyUpdateConfig.model_fields[name].description, name
    given = DailyUpdateConfig(learning_rate=5e-4, price_baseline="loo", reward_weights={"structure": 1.0})
    mixed = given.settings("smollm2-135m-instruct")
    assert (mixed.gspo.learning_rate, mixed.price_baseline, dict(mixed.reward.weights)) == (
        5e-4,
        "loo",
        {"structure": 1.0},
    )
    assert mixed.gspo.epochs == own["epochs"] and mixed.gspo.counterfactual_form == own["counterfactual_form"]
    assert DailyUpdateConfig().settings("tiny-local") == plain == DailyUpdateConfig().settings("Qwen/Qwen3-0.6B")

    monkeypatch.setitem(MODEL_RUN_DEFAULTS, "tiny-local", {"kl_to_base_rollouts": 0})
    res = daily_resources(tmp_path)
    result = dg.materialize([headlines, daily_update], partition_key="2025-11-03", resources=res, raise_on_error=False)
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert "kl_to_base_rollouts must be at least 1" in str(failure.event_specific_data.error), failure
    assert not res["warehouse"].exists("rollouts", "2025-11-03")


def test_lora_target_modules_from_the_run_config_are_checked():
    """A run's `lora_target_modules` (a list in Dagster's config) becomes the adapter's tuple of names; an empty
    list or a bare string is refused with the reason, before any model loads."""
    import pytest

    from assets.daily_rl.daily_update import DailyUpdateConfig

    lora = DailyUpdateConfig(lora_target_modules=["gate_proj", "up_proj", "down_proj"]).settings("tiny-local").gspo.lora
    assert lora.target_modules == ("gate_proj", "up_proj", "down_proj") and (lora.r, lora.alpha) == (8, 16)
    with pytest.raises(ValueError, match="non-empty list of module names"):
        DailyUpdateConfig(lora_target_modules=[]).settings("tiny-local")
    from outcome_flywheel.models.interface import LoraSettings

    with pytest.raises(ValueError, match="non-empty list of module names"):
        LoraSettings(target_modules="q_proj")


def test_the_gates_probe_is_capped_at_the_notes_budget():
    """`sized`: the gate's greedy probe never runs past the day's max_new_tokens (it would judge text the
    policy never writes), and a larger note budget leaves the probe's own."""
    from outcome_flywheel.daily_rl.day_settings import DailyUpdateSettings
    from outcome_flywheel.models.loader import ModelLoader

    probe = DailyUpdateSettings().gate.probe_max_new_tokens
    short, n, tokens = DailyUpdateSettings(max_new_tokens=32, rollouts_per_headline=3).sized(ModelLoader())
    assert (short.gate.probe_max_new_tokens, n, tokens) == (32, 3, 32)
    long, _, tokens = DailyUpdateSettings(max_new_tokens=probe + 100).sized(ModelLoader(base_model="some/model"))
    assert (long.gate.probe_max_new_tokens, tokens) == (probe, probe + 100)
    assert long.gate == DailyUpdateSettings().gate
