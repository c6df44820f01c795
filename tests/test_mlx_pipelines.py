"""Both loops end to end with FLYWHEEL_BACKEND=mlx: the same assets and configuration as torch,
only the environment variable changes. Sizes are cut down (few headlines, 2 rollouts, short
notes) because the Linux mlx[cpu] wheel is slow (docs/mlx.md)."""

from __future__ import annotations

import json

import dagster as dg
import numpy as np
import pytest

from tests.mlx_fixtures import require_mlx

require_mlx()

from resources.models import ModelBackendResource  # noqa: E402

DAY1, DAY2 = "2025-11-03", "2025-11-04"


@pytest.fixture()
def mlx_backend_resource(data_dir, monkeypatch) -> ModelBackendResource:
    """The resource exactly as the deployment builds it, from the environment."""
    monkeypatch.setenv("FLYWHEEL_BACKEND", "mlx")
    monkeypatch.setenv("FLYWHEEL_BASE_MODEL", "tiny-local")
    resource = ModelBackendResource.from_env()
    assert resource.process_config_and_initialize().backend == "mlx"
    return resource


def test_daily_loop_materialises_two_days_with_mlx(data_dir, warehouse, mlx_backend_resource):
    from assets.daily_rl.daily_update import daily_update
    from assets.daily_rl.headlines import headlines
    from resources.feeds import FeedSource
    from resources.judge import JudgeResource

    resources = {
        "warehouse": warehouse,
        "model_backend": mlx_backend_resource,
        "feeds": FeedSource(max_headlines=3, data_dir=str(data_dir)),
        "judge": JudgeResource(max_new_tokens=4),
    }
    run_config = {"ops": {"daily_update": {"config": {"rollouts_per_headline": 2, "max_new_tokens": 24}}}}
    for day in (DAY1, DAY2):
        result = dg.materialize([headlines, daily_update], partition_key=day, resources=resources, run_config=run_config)
        assert result.success
        checks = result.get_asset_check_evaluations()
        assert checks and all(c.passed for c in checks), [(c.check_name, c.passed) for c in checks]

    rollouts = warehouse.read("rollouts", DAY2)
    assert len(rollouts) == 2 * len(warehouse.read("headlines", DAY2)) > 0
    scores = warehouse.read("rollout_scores", DAY2)
    assert len(scores) == len(warehouse.read("rollouts", DAY1))
    training = warehouse.read("policy_training", DAY2).iloc[0]
    assert bool(training["trained"]) and training["steps"] >= 1 and np.isfinite(training["loss"])

    # Day 2's checkpoint is a PEFT-layout LoRA adapter written by mlx: torch scores it too, the same.
    ckpt = warehouse.path("checkpoints", "policy", DAY2)
    assert (ckpt / "adapter_model.safetensors").exists()
    assert json.loads((ckpt / "adapter_config.json").read_text())["peft_type"] == "LORA"
    from resources.models.torch_backend import TorchBackend

    torch_policy = TorchBackend(mlx_backend_resource.process_config_and_initialize().base_model_dir(), adapter_path=ckpt, device="cpu")
    prompts = [json.loads(p) for p in rollouts["prompt"]]
    responses = [list(r) for r in rollouts["response_ids"]]
    stored = [np.asarray(b, dtype=np.float32) for b in rollouts["behavior_logprobs"]]
    rescored = torch_policy.response_logprobs(prompts, responses)
    assert max(float(np.abs(a - b).max()) for a, b in zip(stored, rescored)) < 1e-4
