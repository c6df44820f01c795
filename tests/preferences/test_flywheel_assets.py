"""The flywheel's Dagster assets on bundled data and tiny-local: partitions, quarantine, outcomes,
the dataset and its blocking checks, adapter + eval + drift, status, style score, schedule, sensor."""

import json
from datetime import datetime, timezone

import dagster as dg
import pandas as pd
import pytest

from assets.preferences.adapter import HISTORY_TABLE, preference_adapter
from assets.preferences.dataset import dpo_dataset, holdout_leaks
from assets.preferences.decisions import operator_decisions
from assets.preferences.evaluation import holdout_eval, style_drift
from assets.preferences.outcomes import decision_outcomes, pending_partitions_ready
from outcome_flywheel.cli import flywheel_status, style_score
from pipelines.preferences import flywheel_outcomes_schedule, training_decision
from tests.flywheel_fixtures import bundled_decisions, flywheel_resources, one_thread, write_log  # noqa: F401
from tests.tolerances import margin_tolerances

FIRST, LAST = "2025-11-17", "2026-01-08"
RANGE = {"dagster/asset_partition_range_start": FIRST, "dagster/asset_partition_range_end": LAST}


@pytest.fixture()
def small_log(tmp_path):
    """The bundled sample's decisions of FIRST..LAST, plus a bad line and a repeated id."""
    lines = bundled_decisions(FIRST, LAST)
    lines.insert(3, '{"decision_id": "broken", "ts": ')
    again = json.loads(lines[0])
    again["reason"] = "corrected"
    lines.append(json.dumps(again))
    return write_log(tmp_path / "audit.jsonl", lines)


@pytest.fixture()
def resources(small_log, warehouse, model_backend, data_dir):
    return flywheel_resources(warehouse, model_backend, small_log, data_dir)


def _decisions_and_outcomes(resources, instance=None):
    return dg.materialize([operator_decisions, decision_outcomes], resources=resources, tags=RANGE, instance=instance)


def test_decisions_and_outcomes_over_a_range_in_one_run(resources, warehouse, small_log):
    result = _decisions_and_outcomes(resources)
    assert result.success
    n_lines = sum(1 for line in small_log.read_text().splitlines() if line.strip())
    decisions = warehouse.read_all("operator_decisions")
    quarantine = warehouse.read("operator_decisions_quarantine")
    # counts in = counts out + quarantined + repeated ids dropped
    assert n_lines == len(decisions) + len(quarantine) + 1
    assert quarantine["line_number"].tolist() == [4]
    assert decisions["decision_id"].is_unique
    assert (
        decisions.set_index("decision_id").loc[
            json.loads(small_log.read_text().splitlines()[-1])["decision_id"], "reason"
        ]
        == "corrected"
    )
    checks = result.get_asset_check_evaluations()
    assert [c.passed for c in checks if c.check_name == "counts_reconcile"] == [True]
    # One partition per day of the range, empty days included.
    assert (
        warehouse.partitions("operator_decisions")[0] == FIRST
        and warehouse.partitions("operator_decisions")[-1] == LAST
    )
    outcomes = warehouse.read_all("decision_outcomes")
    assert len(outcomes) == len(decisions)
    assert set(outcomes["status"]) == {"matured", "pending"}
    matured = outcomes[outcomes["status"] == "matured"]
    assert matured["vs_spy_pct"].notna().all() and (matured["window_days"] == 5).all()
    assert outcomes.loc[outcomes["status"] == "pending", "return_pct"].isna().all()  # never invented

    # Re-running gives the same rows (computed_at aside), never duplicates.
    before = outcomes.drop(columns="computed_at")
    assert _decisions_and_outcomes(resources).success
    after = warehouse.read_all("decision_outcomes").drop(columns="computed_at")
    pd.testing.assert_frame_equal(before, after)
    pd.testing.assert_frame_equal(decisions, warehouse.read_all("operator_decisions"))

    # The schedule re-runs pending partitions once their exit has closed (the prices may have come).
    ready = pending_partitions_ready(outcomes, datetime(2026, 6, 1, tzinfo=timezone.utc))
    assert ready and set(ready) == set(outcomes.loc[outcomes["status"] == "pending", "decision_date"])
    assert pending_partitions_ready(outcomes, datetime(2026, 1, 8, tzinfo=timezone.utc)) == []
    context = dg.build_schedule_context(
        scheduled_execution_time=datetime(2026, 6, 1, 22, 0, tzinfo=timezone.utc),
        resources={"warehouse": warehouse, "audit_log": resources["audit_log"]},
    )
    requests = flywheel_outcomes_schedule(context)
    assert sorted(r.partition_key for r in requests) == ready


def test_dataset_exports_and_blocking_checks(resources, warehouse):
    assert _decisions_and_outcomes(resources).success
    first = dg.materialize([dpo_dataset], resources=resources)
    assert first.success
    assert all(c.passed for c in first.get_asset_check_evaluations())
    pairs = warehouse.read("dpo_dataset")
    for col in [
        "pair_id",
        "decision_id",
        "split",
        "decision",
        "verdict",
        "treatment",
        "outcome_weight",
        "effective_weight",
        "prompt",
        "chosen",
        "rejected",
    ]:
        assert col in pairs.columns
    view = warehouse.query("SELECT count(*) AS n FROM dpo_dataset WHERE split = 'holdout'")
    assert view["n"][0] == (pairs["split"] == "holdout").sum() > 0
    export_dir = warehouse.path("exports", "preference")
    train = pairs[pairs["split"] == "train"]
    n_swaps = int((train["replication"] == 1.5).sum())
    expected_rows = (
        3 * int((train["replication"] == 3.0).sum()) + int((train["replication"] == 1.0).sum()) + (3 * n_swaps) // 2
    )
    for fmt in ("trl", "nemo_rl", "openai"):
        rows = (export_dir / f"{fmt}.jsonl").read_text().splitlines()
        meta = json.loads((export_dir / f"{fmt}.meta.json").read_text())
        assert meta["rows"] == len(rows) == expected_rows and meta["holdout_pairs_excluded"] > 0
    # Rebuilding gives the same pairs.
    assert dg.materialize([dpo_dataset], resources=resources).success
    pd.testing.assert_frame_equal(pairs, warehouse.read("dpo_dataset"))
    # The leak check fires on a holdout pair that sits in training.
    tampered = pairs.copy()
    hold_id = tampered.loc[tampered["split"] == "holdout", "decision_id"].iloc[0]
    tampered.loc[tampered["decision_id"] == hold_id, "split"] = "train"
    assert holdout_leaks(tampered) == [hold_id]
    exported = [json.loads(r) for r in (export_dir / "trl.jsonl").read_text().splitlines()]
    assert holdout_leaks(pairs, exported) == []
    h = pairs[pairs["split"] == "holdout"].iloc[0]
    leaked = exported + [
        {"prompt": json.loads(h.prompt), "chosen": [{"content": h.chosen}], "rejected": [{"content": h.rejected}]}
    ]
    assert holdout_leaks(pairs, leaked) == [h.decision_id]


def test_adapter_eval_drift_status_and_style_score(resources, warehouse, model_backend, one_thread):
    instance = dg.DagsterInstance.ephemeral()
    assert _decisions_and_outcomes(resources, instance).success
    status = flywheel_status(warehouse, min_new_pairs=10)
    assert status["n_dpo_pairs"] > 0 and status["latest_adapter"] is None
    assert style_score([{"symbol": "MSFT", "side": "buy", "weight": 0.02}], warehouse=warehouse)["available"] is False

    cfg = {"ops": {"preference_adapter": {"config": {"epochs": 1, "batch_size": 16}}}}
    result = dg.materialize(
        [dpo_dataset, preference_adapter, holdout_eval, style_drift],
        resources=resources,
        run_config=cfg,
        instance=instance,
    )
    assert result.success
    latest = warehouse.path("adapters", "preference", "latest")
    assert (
        latest.is_symlink()
        and (latest / "adapter_model.safetensors").exists()
        and (latest / "adapter_config.json").exists()
    )
    info = json.loads((latest / "train_info.json").read_text())
    hist = warehouse.read_all(HISTORY_TABLE)
    assert hist["status"].tolist() == ["succeeded"] and hist["n_pairs"][0] == info["n_pairs"] == len(info["trained"])
    # the memory budget's plan beside the figures: no budget on the CPU, so each minibatch whole
    meta = next(
        e.materialization.metadata
        for e in result.get_asset_materialization_events()
        if e.asset_key.path[-1] == "preference_adapter"
    )
    assert meta["micro_batches"].value == meta["steps"].value == info["steps"]
    assert meta["layers_recomputed"].value is False

    scored = warehouse.read("holdout_eval")
    pairs = warehouse.read("dpo_dataset")
    assert sorted(scored["decision_id"]) == sorted(pairs.loc[pairs["split"] == "holdout", "decision_id"])
    assert ((scored["style_match_score"] > 0) & (scored["style_match_score"] < 1)).all()
    assert scored["margin_logp"].abs().max() > 0  # the adapter changed something
    ev = warehouse.read_all("holdout_eval_history")
    assert len(ev) == 1 and {"auc", "auc_low", "auc_high", "n_holdout", "label"} <= set(ev.columns)
    assert warehouse.read("style_drift")["drift"][0] in ("high", "low", "unknown")

    status = flywheel_status(warehouse, min_new_pairs=10)
    assert status["latest_adapter"] == str(latest.resolve())
    assert status["n_new_pairs_since_last_adapter"] == 0 and not status["ready_to_train"]
    assert any("new pairs" in r for r in status["blocking_reasons"])
    assert status["last_eval"]["adapter_run"] == info["run"]

    scored_one = style_score(
        [{"symbol": "MSFT", "side": "buy", "weight": 0.02}],
        {"regime": "neutral"},
        model_backend=model_backend,
        warehouse=warehouse,
    )
    assert scored_one["available"] and 0 < scored_one["style_match_score"] < 1
    assert scored_one["adapter_path"] == str(latest.resolve()) and scored_one["comment"]
    # A proposal scored on its own reads the same prompt, plan and contrast as the holdout evaluation.
    assert info["prompt_context_keys"] == [] and info["config"]["completion_unit"] == "line"
    decisions = (
        warehouse.read_all("operator_decisions").drop_duplicates("decision_id", keep="last").set_index("decision_id")
    )
    row = scored.iloc[0]
    d = decisions.loc[row.decision_id]
    again = style_score(
        json.loads(d.proposal_orders_json),
        json.loads(d.context_json),
        d.proposal_text if isinstance(d.proposal_text, str) else None,
        model_backend=model_backend,
        warehouse=warehouse,
    )
    # Scored alone or in the holdout's batch (other padding, so other fp32 rounding): the margin
    # within the sum of its tokens' rounding bounds (tests/tolerances.py, relative to the summed
    # magnitudes; was abs=1e-4), the score sigmoid(beta m) within beta / 4 of that (was abs=1e-5).
    pair = pairs.set_index("decision_id").loc[row.decision_id]
    tolerance = margin_tolerances(
        model_backend.load(adapter_path=latest), [json.loads(pair.prompt)], [pair.proposal_plan], "line"
    )[0]
    assert again["margin_logp"] == pytest.approx(row.margin_logp, abs=tolerance)
    assert again["style_match_score"] == pytest.approx(
        row.style_match_score, abs=info["config"]["beta"] / 4 * tolerance
    )

    # The sensor's rule: nothing new -> no run; cooldown respected; a run in progress blocks.
    now = datetime.now(timezone.utc)
    assert training_decision(warehouse, now, in_progress=1, min_new=0, cooldown_s=0)[0] is False
    start, reason, _ = training_decision(warehouse, now, in_progress=0, min_new=0, cooldown_s=3600)
    assert not start and "cooldown" in reason
    start, reason, _ = training_decision(warehouse, now, in_progress=0, min_new=1, cooldown_s=0)
    assert not start and "0 new pairs" in reason
    start, _, key = training_decision(warehouse, now, in_progress=0, min_new=0, cooldown_s=0)
    assert start and key.startswith("train-")


def test_a_failed_training_is_recorded_and_latest_does_not_move(resources, warehouse):
    result = dg.materialize([preference_adapter], resources=resources, raise_on_error=False)
    assert not result.success
    hist = warehouse.read_all(HISTORY_TABLE)
    assert hist["status"].tolist() == ["failed"] and "no training pairs" in hist["error"][0]
    assert not warehouse.path("adapters", "preference", "latest").exists()
    assert not any(p.name.startswith(".staging") for p in warehouse.path("adapters", "preference").glob(".*"))


def test_a_holdout_leak_blocks_training(resources, warehouse, monkeypatch):
    assert _decisions_and_outcomes(resources).success
    # Pretend the hash rule changed under the dataset: every training pair now "belongs" to the holdout.
    monkeypatch.setattr("assets.preferences.dataset.holdout_split", lambda decision_id: "holdout")
    result = dg.materialize([dpo_dataset, preference_adapter], resources=resources, raise_on_error=False)
    assert not result.success
    check = [c for c in result.get_asset_check_evaluations() if c.check_name == "no_holdout_in_training"][0]
    assert not check.passed
    assert not warehouse.read_all(HISTORY_TABLE).shape[0]  # the adapter never started
