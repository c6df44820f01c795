"""Tier 3, distillation, on tiny-local: completion-only SFT, the teacher's samples, the sensor's
threshold, phase runs gated honestly (an update the gate accepts moves `latest`, a blown-up one
does not), and training_audit rows for a GSPO day, a DPO run and a distillation run."""

import json

import dagster as dg
import numpy as np
import pandas as pd
import pytest
import torch

from assets.daily_rl.daily_update import daily_update
from assets.daily_rl.headlines import headlines
from outcome_flywheel.daily_rl.distillation.samples import (
    PHASES,
    SAMPLES_TABLE,
    samples_frame,
    split_reasoning,
    teacher_samples,
    trace_samples,
)
from outcome_flywheel.daily_rl.distillation.step import distill
from outcome_flywheel.daily_rl.distillation.train import DistillationError, DistillConfig, teacher_dir
from outcome_flywheel.daily_rl.policy.checkpoints import read_checkpoint
from outcome_flywheel.daily_rl.policy.gate import GateConfig
from outcome_flywheel.daily_rl.report.summary import distillation_summary
from outcome_flywheel.models.loader import load_backend
from outcome_flywheel.models.prompts import trading_note_messages
from outcome_flywheel.models.provision.tiny_local import TinyLocalConfig, cached_tiny_local
from outcome_flywheel.models.train.dpo import train_weighted_dpo
from outcome_flywheel.models.train.dpo_config import PreferencePair, WeightedDPOConfig
from outcome_flywheel.models.train.sft import encode_sft, sft_batch_loss, train_sft
from outcome_flywheel.models.train.sft_config import SFTConfig, SFTExample
from outcome_flywheel.training_audit import audited_training, read_audit
from pipelines.daily_rl import distillation_sensor
from tests.daily_fixtures import daily_resources, linked_data_dir

DAY = "2025-11-03"
SMALL = {"ops": {"daily_update": {"config": {"rollouts_per_headline": 4, "max_new_tokens": 40, "batch_size": 8}}}}
# A Qwen3-style answer (think block, then the note): the embedded tiny-local teacher writes none.
QWEN3_STYLE = (
    "<think>\nThe headline is a beat on earnings; the stock likely gaps up.\n</think>\n\n"
    "Trade Recommendation: Buy AAPL\nRationale: earnings beat\nRisk Factors: guidance\nTimeframe: 1 day\n"
    "Position Size: 2%\nStop Loss: 3%"
)
FAST_GATE = GateConfig(probe_headlines=2, probe_max_new_tokens=32, kl_rollouts=8)


@pytest.fixture(scope="module")
def day(tmp_path_factory, tiny_model_dir):
    """One day of the loop (headlines, daily_update: the base checkpoint, verified, `latest`) in its own data dir."""
    root = linked_data_dir(tmp_path_factory.mktemp("distill"), tiny_model_dir)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLYWHEEL_DATA_DIR", str(root))
        res = daily_resources(root, max_headlines=4)
        result = dg.materialize([headlines, daily_update], partition_key=DAY, resources=res, run_config=SMALL)
        assert result.success
        yield root, res


@pytest.fixture(scope="module")
def teacher_folder():
    """A second tiny-local, another seed and a short build (the embedded default teacher is seed + 1, full build)."""
    return cached_tiny_local(TinyLocalConfig(seed=1, train_steps=60, judge_examples=16))


def test_sft_loss_is_completion_only(tiny_model_dir):
    backend = load_backend("torch", tiny_model_dir, device="cpu")
    examples = [
        SFTExample(
            trading_note_messages("Apple beats estimates", "Revenue up"),
            "Trade Recommendation: Buy AAPL",
            prefix="<think>\nup\n</think>\n\n",
        )
    ]
    contexts, completions = encode_sft(backend, examples, 512)
    loss, _ = sft_batch_loss(backend, contexts, completions, [0])
    ids = torch.tensor([contexts[0] + completions[0]])
    with torch.no_grad():
        logits = backend.model(input_ids=ids).logits[0, :-1].float()
    nll = -torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]
    completion_only = nll[len(contexts[0]) - 1 :].mean()
    whole = nll.mean()
    assert abs(float(loss.detach()) - float(completion_only)) < 1e-4
    assert abs(float(whole) - float(completion_only)) > 0.1  # the check can tell a masked loss from an unmasked one


def test_sft_and_dpo_say_when_the_adapter_they_train_is_not_the_configured_one(tiny_model_dir):
    """A policy that holds an adapter trains that one: the stats say which, and that other configured LoRA
    settings were set aside, instead of leaving them looking applied."""
    from dataclasses import replace

    from outcome_flywheel.models.interface import LoraSettings

    backend = load_backend("torch", tiny_model_dir, device="cpu")
    examples = [
        SFTExample(trading_note_messages("Apple beats estimates", "Revenue up"), "Trade Recommendation: Buy AAPL")
    ]
    small = LoraSettings(r=4, alpha=8, target_modules=["gate_proj", "up_proj", "down_proj"])
    one_step = dict(learning_rate=1e-3, epochs=1, batch_size=1)
    fresh = train_sft(backend, examples, SFTConfig(lora=small, **one_step))
    assert fresh.extra["lora_adapter"] == "fresh LoRA: r 4, alpha 8, dropout 0, down_proj gate_proj up_proj"
    assert not fresh.extra["lora_settings_ignored"]
    again = train_sft(
        backend,
        examples,
        SFTConfig(lora=replace(small, target_modules=["up_proj", "down_proj", "gate_proj"]), **one_step),
    )
    assert (
        again.extra["lora_adapter"] == "LoRA already on the model: r 4, alpha 8, dropout 0, down_proj gate_proj up_proj"
    )
    assert not again.extra["lora_settings_ignored"]  # the same settings, the targets in another order
    other = train_sft(backend, examples, SFTConfig(**one_step))  # the default settings: r 8 on seven projections
    assert other.extra["lora_settings_ignored"]
    assert other.extra["lora_adapter"].endswith(
        f"; the configured r {LoraSettings().r}, alpha {LoraSettings().alpha:g}, "
        f"dropout {LoraSettings().dropout:g}, {' '.join(sorted(LoraSettings().target_modules))} applies to a fresh adapter only"
    )
    assert backend.adapter_settings().r == 4  # still the adapter it had
    pair = PreferencePair(trading_note_messages("Apple beats", ""), "Buy AAPL", "Sell AAPL", 1.0)
    dpo = train_weighted_dpo(backend, [pair], WeightedDPOConfig(learning_rate=1e-3, epochs=1, batch_size=1))
    assert dpo.extra["lora_settings_ignored"] and dpo.extra["lora_adapter"].startswith("LoRA already on the model: r 4")


def test_a_trace_with_reasoning_gives_three_samples_and_one_without_gives_one():
    prompt = trading_note_messages("Apple beats", "")
    assert split_reasoning(QWEN3_STYLE)[0].startswith("The headline")
    assert split_reasoning("<think>\n\n</think>\n\nBuy AAPL") == (None, "Buy AAPL")
    rows = trace_samples(DAY, "h1", prompt, QWEN3_STYLE, "teacher", "random 15%")
    assert sorted(r["phase"] for r in rows) == sorted(PHASES)
    consistency = next(r for r in rows if r["phase"] == "consistency")
    assert consistency["prefix"].startswith("<think>") and consistency["completion"].startswith("Trade Recommendation")
    assert [r["phase"] for r in trace_samples(DAY, "h2", prompt, "Trade Recommendation: Sell X", "teacher", "")] == [
        "answer"
    ]


def _samples(n: int) -> pd.DataFrame:
    prompt = trading_note_messages("Apple beats", "")
    return samples_frame([r for i in range(n) for r in trace_samples(DAY, f"h{i}", prompt, f"Note {i}", "t", "")])


def test_the_sensor_fires_at_n_new_samples_and_not_below(tmp_path, monkeypatch):
    from outcome_flywheel.storage import Warehouse

    warehouse = Warehouse(data_dir=str(tmp_path))
    monkeypatch.setenv("FLYWHEEL_DISTILL_MIN_SAMPLES", "5")
    warehouse.write(SAMPLES_TABLE, _samples(4), partition=DAY)
    result = distillation_sensor(dg.build_sensor_context(resources={"warehouse": warehouse}))
    assert isinstance(result, dg.SkipReason) and "4 new distillation samples, fewer than 5" in result.skip_message
    warehouse.write(SAMPLES_TABLE, _samples(5), partition=DAY)
    result = distillation_sensor(dg.build_sensor_context(resources={"warehouse": warehouse}))
    assert isinstance(result, dg.RunRequest) and "5 new distillation samples" in result.tags["flywheel/reason"]


def test_the_teacher_is_never_the_policy(day, monkeypatch):
    root, res = day
    with pytest.raises(DistillationError, match="policy's own base model"):
        teacher_dir(res["model_backend"], str(root / "models" / "tiny-local"))


def test_phase_runs_are_gated_and_audited(day, teacher_folder):
    root, res = day
    warehouse, models = res["warehouse"], res["model_backend"]
    # The teacher answers every headline of the day (the asset samples 15% + the confident ones).
    todays = warehouse.read("headlines", DAY)
    picks = [
        dict(headline_id=h, title=t, summary=s, why="test")
        for h, t, s in zip(todays["headline_id"], todays["title"], todays["summary"])
    ]
    teacher = load_backend("torch", teacher_folder, device="cpu")
    rows = teacher_samples(teacher, "tiny-local seed 1", DAY, picks, 0, 48)
    assert len(rows) == len(picks) and all(r["phase"] == "answer" for r in rows)  # tiny-local writes no think block
    rows += trace_samples(
        DAY, "qwen3-style", trading_note_messages("Apple beats", ""), QWEN3_STYLE, "qwen3-style", "test"
    )
    warehouse.write(SAMPLES_TABLE, samples_frame(rows), partition=DAY)
    ckpts = root / "checkpoints" / "policy"
    before = (ckpts / "latest").resolve()

    # A blown-up run (learning rate 3.0) must be rejected and leave `latest` where it was.
    blown = DistillConfig(
        sft=SFTConfig(learning_rate=3.0, epochs=3, batch_size=4), gate=FAST_GATE, ab_headlines=4, ab_max_new_tokens=32
    )
    with audited_training(warehouse, "distillation", "distillation:blown", "test") as entry:
        result = distill(warehouse, models, "blown", blown, log=lambda m: None)
        entry.gate_verdict = result.gate.verdict
    assert result.gate.verdict == "rejected", result.gate.reason
    assert [p["phase"] for p in result.phases if p["steps"]] == list(PHASES)  # each phase its own run
    # the parent is the base: the first phase adds the configured adapter, the later ones train it on
    adapters = [p["lora_adapter"] for p in result.phases if p["steps"]]
    assert adapters[0].startswith("fresh LoRA: r 8") and all(
        a.startswith("LoRA already on the model: r 8") and "configured" not in a for a in adapters[1:]
    ), adapters
    assert (ckpts / "latest").resolve() == before and result.checkpoint == ""

    # Samples are used once: a second run right away has none.
    with pytest.raises(DistillationError, match="0 unused"):
        distill(warehouse, models, "again", blown)

    # A gentle run on fresh samples: it changes the weights; the verdict follows the gate's numbers.
    warehouse.write(
        SAMPLES_TABLE, samples_frame([dict(r, sample_id=r["sample_id"] + "b") for r in rows]), partition="2025-11-04"
    )
    gentle = DistillConfig(
        sft=SFTConfig(learning_rate=5e-4, epochs=1, batch_size=4), gate=FAST_GATE, ab_headlines=4, ab_max_new_tokens=32
    )
    with audited_training(warehouse, "distillation", "distillation:gentle", "test") as entry:
        result = distill(warehouse, models, "gentle", gentle, log=lambda m: None)
        entry.gate_verdict = result.gate.verdict
    gate = result.gate
    expected = (
        "accepted"
        if (
            gate.kl_to_parent <= FAST_GATE.max_kl_to_parent
            and gate.probe_structure >= gate.probe_parent_structure - FAST_GATE.max_probe_regression
        )
        else "rejected"
    )
    assert gate.verdict == expected, gate.reason
    assert gate.kl_to_parent > 0  # the weights moved
    assert result.ab["n"] >= 1 and result.ab["label"]
    if gate.verdict == "accepted":
        latest = (ckpts / "latest").resolve()
        assert latest.name == f"{DAY}.distill-gentle" and read_checkpoint(latest)["verified"] is True
    else:
        assert (ckpts / "latest").resolve() == before
    runs = warehouse.read("distillation_runs")
    assert list(runs["run_id"]) == ["blown", "gentle"]
    assert "distillation: 2 run(s)" in distillation_summary(root)


def test_audit_rows_for_a_gspo_day_a_dpo_run_and_a_distillation_run(day):
    root, res = day
    warehouse, models = res["warehouse"], res["model_backend"]
    backend = models.load()
    pairs = [PreferencePair(trading_note_messages("Apple beats", ""), "Buy AAPL", "Sell AAPL") for _ in range(4)]
    with audited_training(warehouse, "dpo", "dpo:test", "test", {"pairs": len(pairs)}):
        train_weighted_dpo(backend, pairs, WeightedDPOConfig(epochs=1, batch_size=4))
    audit = read_audit(warehouse)
    gspo = audit[audit["tier"] == "gspo_daily"]
    # The GSPO day was audited by the step entry (daily_update through the step runner).
    assert len(gspo) == 1 and gspo["status"].iloc[0] == "succeeded" and gspo["gate_verdict"].iloc[0] == "not_trained"
    assert json.loads(gspo["inputs"].iloc[0])["partition"] == DAY
    assert (audit[audit["tier"] == "dpo"]["status"] == "succeeded").all()
    assert set(audit["tier"]) >= {"gspo_daily", "dpo"}
    assert not (root / "locks" / "trainer.lock").exists()  # every trainer released the lock


def test_sft_loss_matches_its_mlx_mirror():
    mx = pytest.importorskip("mlx.core", reason="mlx is not installed")
    from outcome_flywheel.models.mlx.losses import sft_loss as mlx_sft_loss
    from outcome_flywheel.models.torch.losses import sft_loss as torch_sft_loss

    rng = np.random.default_rng(0)
    logp = -rng.random((3, 7)).astype(np.float32)
    mask = rng.random((3, 7)) > 0.4
    ours, _ = torch_sft_loss(torch.tensor(logp), torch.tensor(mask))
    theirs, _ = mlx_sft_loss(mx.array(logp), mx.array(mask))
    assert abs(float(ours) - float(theirs)) < 1e-6
    assert abs(float(ours) + logp[mask].mean()) < 1e-6  # the masked mean, nothing else


def test_a_distilled_checkpoint_is_the_parent_of_the_next_day_and_a_rerun_reproduces_it(day):
    """Tier 3 joins the daily chain: the next day trains from the distilled checkpoint, D's notes
    (sampled by D's own checkpoint) off-policy through the truncated IS weight; the ledger and the
    audit say so, and a re-run of the next day gives the same checkpoint."""
    root, res = day
    warehouse, models = res["warehouse"], res["model_backend"]
    sampler = read_checkpoint(root / "checkpoints" / "policy" / DAY)["policy_version"]
    rows = [dict(r, sample_id=r["sample_id"] + "c") for r in warehouse.read(SAMPLES_TABLE, DAY).to_dict("records")]
    warehouse.write(SAMPLES_TABLE, samples_frame(rows), partition="2025-11-05")
    accept = DistillConfig(
        sft=SFTConfig(learning_rate=5e-4, epochs=1, batch_size=4),
        gate=GateConfig(enabled=False),
        ab_headlines=2,
        ab_max_new_tokens=16,
    )
    distilled = distill(warehouse, models, "chain", accept, log=lambda m: None)
    assert distilled.checkpoint == f"{DAY}.distill-chain"

    nxt = "2025-11-04"
    config = {"ops": {"daily_update": {"config": {**SMALL["ops"]["daily_update"]["config"], "gate_enabled": False}}}}
    assert dg.materialize([headlines, daily_update], partition_key=nxt, resources=res, run_config=config).success
    info = read_checkpoint(root / "checkpoints" / "policy" / nxt)
    assert info["parent_checkpoint"] == distilled.checkpoint and info["parent_version"] == distilled.policy_version
    ledger = warehouse.read("reward_ledger", nxt)
    judged = ledger[(ledger["step"] == "judged") & (ledger["status"] == "trained")]
    assert (
        len(judged)
        and set(judged["behavior_policy_version"]) == {sampler}
        and set(judged["policy_version"]) == {distilled.policy_version}
    )
    assert (judged["staleness_updates"] >= 1).all()  # a distillation (or two) between the sampler and the parent
    trained = judged[judged["is_ratio"].notna()]
    assert (
        len(trained) and ((trained["is_ratio"] > 0) & (trained["is_ratio"] != 1.0)).all()
    )  # pi_parent / pi_sampler, recomputed
    audit = read_audit(warehouse)
    row = audit[(audit["tier"] == "gspo_daily") & audit["inputs"].str.contains(nxt)].iloc[-1]
    assert json.loads(row["inputs"])["parent_checkpoint"] == distilled.checkpoint and row["status"] == "succeeded"

    # a re-run of the next day: the same parent, the same weights (the checkpoint's digest)
    assert dg.materialize([daily_update], partition_key=nxt, resources=res, run_config=config).success
    again = read_checkpoint(root / "checkpoints" / "policy" / nxt)
    assert again["parent_checkpoint"] == distilled.checkpoint and again["policy_version"] == info["policy_version"]


def test_a_distilled_checkpoint_verifies_in_bf16(tmp_path, tiny_model_dir, monkeypatch):
    """FLYWHEEL_DTYPE=bfloat16: the distilled checkpoint reloaded from disk gives the trained weights'
    log-probs back within verify_distilled's 1e-3 (the same arithmetic on both sides: a float32
    adapter under autocast), and `latest` moves to it."""
    root = linked_data_dir(tmp_path, tiny_model_dir)
    monkeypatch.setenv("FLYWHEEL_DATA_DIR", str(root))
    res = daily_resources(root, max_headlines=4, dtype="bfloat16")
    assert dg.materialize([headlines, daily_update], partition_key=DAY, resources=res, run_config=SMALL).success
    res["warehouse"].write(SAMPLES_TABLE, _samples(6), partition=DAY)
    config = DistillConfig(
        sft=SFTConfig(learning_rate=5e-4, epochs=1, batch_size=4), gate=GateConfig(enabled=False), ab_headlines=2
    )
    distilled = distill(res["warehouse"], res["model_backend"], "bf16", config, log=lambda m: None)
    assert distilled.checkpoint == f"{DAY}.distill-bf16"
    info = read_checkpoint(root / "checkpoints" / "policy" / distilled.checkpoint)
    assert info["verified"] and (root / "checkpoints" / "policy" / "latest").resolve().name == distilled.checkpoint
