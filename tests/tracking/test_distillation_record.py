"""A distillation run on the record (no model: its result as `run_distillation` returns it): the phases', gate's
and A/B's figures in the daily_rl experiment, and its checkpoint as `daily-policy@champion` once `latest` moved."""

import json

from mlflow import MlflowClient

from outcome_flywheel.daily_rl.day_record import record_distilled
from outcome_flywheel.daily_rl.distillation.train import DistillConfig, DistillResult
from outcome_flywheel.daily_rl.policy.gate import GateResult
from outcome_flywheel.tracking import Tracker
from outcome_flywheel.tracking.registry import POLICY_MODEL


def test_a_distillation_is_a_run_and_its_accepted_checkpoint_the_champion(tmp_path):
    root = tmp_path / "checkpoints" / "policy"
    name = "2025-11-05.distill-20251106T000000Z-abcd1234"
    (root / name).mkdir(parents=True)
    info = {"verified": True, "date": "2025-11-05", "policy_version": "2025-11-05@ddd", "kind": "lora"}
    (root / name / "checkpoint.json").write_text(json.dumps({**info, "gate": "accepted"}))
    (root / "latest").symlink_to(name)
    result = DistillResult(
        run_id="20251106T000000Z-abcd1234",
        parent_version="2025-11-05@ccc",
        checkpoint=name,
        policy_version="2025-11-05@ddd",
        gate=GateResult("accepted", "within the KL budget", kl_to_parent=0.01),
        phases=[
            {"phase": "answer", "examples": 12, "steps": 3, "loss_first": 2.0, "loss_last": 1.5},
            {"phase": "reasoning", "examples": 0, "steps": 0},
        ],
        ab={"difference": 0.05, "ci_low": -0.01, "ci_high": 0.11, "n": 8, "label": "no difference"},
        samples=12,
        wall_s=3.5,
    )
    tracker = Tracker(data_dir=str(tmp_path))
    links = record_distilled(tracker, result, DistillConfig(), root, "dagster-run-1")
    assert links["mlflow_record"] == "recorded", links
    client = MlflowClient(tracking_uri=tracker.store_uri(), registry_uri=tracker.store_uri())
    run = client.get_run(links["mlflow_run_id"])
    assert run.data.tags["asset_key"] == "distilled_policy" and run.data.tags["dagster_run_id"] == "dagster-run-1"
    assert run.data.tags["parent"] == "2025-11-05@ccc" and run.data.tags["policy_version"] == "2025-11-05@ddd"
    metrics = run.data.metrics
    assert metrics["phase/answer/loss_last"] == 1.5 and metrics["phase/reasoning/examples"] == 0
    assert metrics["ab/ci_low"] == -0.01 and metrics["ab/ci_high"] == 0.11 and metrics["gate_kl_to_parent"] == 0.01
    assert "distill.sft.learning_rate" in run.data.params
    champion = client.get_model_version_by_alias(POLICY_MODEL, "champion")
    assert champion.tags["checkpoint"] == name and champion.source == (root / name).resolve().as_uri()
    assert links["mlflow_champion_version"] == links["mlflow_challenger_version"] == str(champion.version)
