"""Both loops end to end with FLYWHEEL_BACKEND=mlx: the same assets and configuration as torch,
only the environment variable changes. Sizes are cut down (few headlines, 2 rollouts, short
notes) because the Linux mlx[cpu] wheel is slow (docs/mlx.md)."""

from __future__ import annotations

import json

import dagster as dg
import numpy as np
import pytest

from tests.mlx_fixtures import require_mlx
from tests.tolerances import assert_logprobs_close, logprob_tolerances, margin_tolerances

require_mlx()

from resources.models import ModelBackendResource  # noqa: E402
from resources.steps import StepRunnerResource

DAY1, DAY2 = "2025-11-03", "2025-11-04"


@pytest.fixture()
def mlx_backend_resource(data_dir, monkeypatch) -> ModelBackendResource:
    """The resource exactly as the deployment builds it, from the environment."""
    monkeypatch.setenv("FLYWHEEL_BACKEND", "mlx")
    monkeypatch.setenv("FLYWHEEL_BASE_MODEL", "tiny-local")
    resource = ModelBackendResource.from_env()
    assert resource.process_config_and_initialize().backend == "mlx"
    return resource


def test_daily_loop_materialises_two_days_with_mlx(data_dir, warehouse, mlx_backend_resource, monkeypatch):
    """Also the layers recomputed (FLYWHEEL_TRAIN_RECOMPUTE=always, mlx/recompute.py) in the Dagster
    run, and the day's row saying so."""
    monkeypatch.setenv("FLYWHEEL_TRAIN_RECOMPUTE", "always")
    from assets.daily_rl.daily_update import daily_update
    from assets.daily_rl.headlines import headlines
    from outcome_flywheel.daily_rl.feeds.source import FeedSource
    from outcome_flywheel.daily_rl.judge.llm_judge import Judge
    from outcome_flywheel.market_data import MarketData
    from outcome_flywheel.tracking import Tracker

    resources = {
        "warehouse": warehouse,
        "model_backend": mlx_backend_resource,
        "feeds": FeedSource(max_headlines=3, data_dir=str(data_dir)),
        "judge": Judge(max_new_tokens=4),
        "market_data": MarketData(data_dir=str(data_dir)),  # daily_update reads matured prices
        "step_runner": StepRunnerResource(runner="in_process"),
        "tracking": Tracker(data_dir=str(data_dir), tracking_uri="off"),
    }
    run_config = {"ops": {"daily_update": {"config": {"rollouts_per_headline": 2, "max_new_tokens": 24}}}}
    for day in (DAY1, DAY2):
        result = dg.materialize(
            [headlines, daily_update], partition_key=day, resources=resources, run_config=run_config
        )
        assert result.success
        checks = result.get_asset_check_evaluations()
        assert checks and all(c.passed for c in checks), [(c.check_name, c.passed) for c in checks]

    rollouts = warehouse.read("rollouts", DAY2)
    assert len(rollouts) == 2 * len(warehouse.read("headlines", DAY2)) > 0
    scores = warehouse.read("rollout_scores", DAY2)
    assert len(scores) == len(warehouse.read("rollouts", DAY1))
    training = warehouse.read("policy_training", DAY2).iloc[0]
    assert bool(training["trained"]) and training["steps"] >= 1 and np.isfinite(training["loss"])
    assert bool(training["train_recomputed"]) and training["train_micro_batches"] == training["steps"]

    # Day 2's checkpoint is a PEFT-layout LoRA adapter written by mlx: torch scores it too, the same.
    ckpt = warehouse.path("checkpoints", "policy", DAY2)
    assert (ckpt / "adapter_model.safetensors").exists()
    assert json.loads((ckpt / "adapter_config.json").read_text())["peft_type"] == "LORA"
    from outcome_flywheel.models.torch.backend import TorchBackend

    torch_policy = TorchBackend(
        mlx_backend_resource.process_config_and_initialize().base_model_dir(), adapter_path=ckpt, device="cpu"
    )
    prompts = [json.loads(p) for p in rollouts["prompt"]]
    responses = [list(r) for r in rollouts["response_ids"]]
    stored = [np.asarray(b, dtype=np.float32) for b in rollouts["behavior_logprobs"]]
    temperature = float(rollouts["temperature"].iloc[0])
    rescored = torch_policy.response_logprobs(prompts, responses, temperature=temperature)
    # mlx's sampler against torch's teacher forcing, two fp32 implementations: each token within
    # 2 (gamma(k) (|z_y/T| + |lse|) + gamma(V)) (tests/tolerances.py): 1.1e-3..1.8e-3 here, where
    # the gap is <2e-5 (a flat 1e-4 before). A wrong temperature or a 1% error breaks it.
    assert_logprobs_close(stored, rescored, logprob_tolerances(torch_policy, prompts, responses, temperature))


def test_flywheel_materialises_end_to_end_with_mlx(data_dir, warehouse, mlx_backend_resource, tmp_path):
    """operator decisions -> outcomes -> dpo_dataset -> preference_adapter -> holdout_eval ->
    style_drift, trained and scored by mlx; the adapter on disk is PEFT and torch agrees with
    mlx's holdout margins."""
    from assets.preferences.adapter import HISTORY_TABLE, preference_adapter
    from assets.preferences.dataset import dpo_dataset
    from assets.preferences.decisions import operator_decisions
    from assets.preferences.evaluation import holdout_eval, style_drift
    from assets.preferences.outcomes import decision_outcomes
    from outcome_flywheel.preferences.style_match import score_candidates, scoring_settings
    from tests.flywheel_fixtures import bundled_decisions, flywheel_resources, write_log

    first, last = "2025-12-01", "2025-12-19"  # ~18 decisions: one DPO step of <=16 pairs
    log = write_log(tmp_path / "audit.jsonl", bundled_decisions(first, last))
    resources = flywheel_resources(warehouse, mlx_backend_resource, log, data_dir)
    instance = dg.DagsterInstance.ephemeral()
    tags = {"dagster/asset_partition_range_start": first, "dagster/asset_partition_range_end": last}
    assert dg.materialize(
        [operator_decisions, decision_outcomes], resources=resources, tags=tags, instance=instance
    ).success
    cfg = {"ops": {"preference_adapter": {"config": {"epochs": 1, "batch_size": 16}}}}
    result = dg.materialize(
        [dpo_dataset, preference_adapter, holdout_eval, style_drift],
        resources=resources,
        run_config=cfg,
        instance=instance,
    )
    assert result.success
    assert all(c.passed for c in result.get_asset_check_evaluations() if c.severity == dg.AssetCheckSeverity.ERROR)

    latest = warehouse.path("adapters", "preference", "latest")
    assert (latest / "adapter_model.safetensors").exists()
    assert json.loads((latest / "adapter_config.json").read_text())["peft_type"] == "LORA"
    history = warehouse.read_all(HISTORY_TABLE)
    assert history["status"].tolist() == ["succeeded"]

    scored = warehouse.read("holdout_eval")
    assert len(scored) > 0 and scored["margin_logp"].abs().max() > 0
    assert ((scored["style_match_score"] > 0) & (scored["style_match_score"] < 1)).all()
    assert warehouse.read("style_drift")["drift"][0] in ("high", "low", "unknown")

    # The same adapter in torch gives the same style margins.
    from outcome_flywheel.models.torch.backend import TorchBackend

    pairs = warehouse.read("dpo_dataset")
    hold = pairs[pairs["split"] == "holdout"].sort_values("decision_id").head(4)
    torch_policy = TorchBackend(
        mlx_backend_resource.process_config_and_initialize().base_model_dir(), adapter_path=latest, device="cpu"
    )
    torch_margins, _ = score_candidates(
        torch_policy, [json.loads(p) for p in hold["prompt"]], hold["proposal_plan"].tolist(), *scoring_settings(latest)
    )
    mlx_margins = scored.set_index("decision_id").loc[hold["decision_id"], "margin_logp"].to_numpy()
    # A margin is four sums of fp32 log-probs (plan and hold, adapter on and off), each token within
    # its rounding bound in either backend: the tolerance is the sum of those bounds, relative to the
    # summed |z_y| + |lse|, so it grows with the plan's length (a flat atol=1e-4 failed on another
    # machine at 1.16e-4, relative 5e-6). Here 0.05-0.11, 0.4-1% of the margins (gaps <1e-4): a sign
    # flip, a 2% scale error or a margin read without the adapter falls outside it; single tokens
    # are compared per token in tests/models/mlx/test_mlx_lora.py.
    tolerance = margin_tolerances(
        torch_policy,
        [json.loads(p) for p in hold["prompt"]],
        hold["proposal_plan"].tolist(),
        scoring_settings(latest)[0],
    )
    assert (np.abs(mlx_margins - torch_margins) <= tolerance).all(), (mlx_margins, torch_margins, tolerance)
    assert (np.abs(1.02 * mlx_margins - torch_margins) > tolerance).any()  # tight enough to see a 2% error
