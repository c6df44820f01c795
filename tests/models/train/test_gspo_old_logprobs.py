"""pi_old for GSPO at the sampling temperature: recomputed by the training forward by default (ratio exactly 1), stored values
within their fp32 rounding bound (tests/tolerances.py)."""

import numpy as np
import torch

from outcome_flywheel.models.interface import LoraSettings, SamplingConfig
from outcome_flywheel.models.prompts import trading_note_messages
from outcome_flywheel.models.train.gspo import train_gspo
from outcome_flywheel.models.train.gspo_config import GSPOConfig, GSPOExample
from tests.tolerances import logprob_tolerances

PROMPTS = [
    trading_note_messages("Nvidia beats estimates", "Revenue rose."),
    trading_note_messages("Boeing cuts outlook"),
]


def _examples(policy) -> list[GSPOExample]:
    groups = policy.sample(PROMPTS, 4, SamplingConfig(max_new_tokens=40), seeds=[1, 2])
    return [
        GSPOExample(
            prompt=PROMPTS[i], response_ids=s.token_ids, behavior_logprobs=s.logprobs, advantage=1.0 if j % 2 else -1.0
        )
        for i, g in enumerate(groups)
        for j, s in enumerate(g)
    ]


def test_stored_logprobs_in_fp32_start_near_ratio_one_and_recompute_exactly_at_one(torch_policy, tiny_model_dir):
    from outcome_flywheel.models.torch.backend import TorchBackend

    examples = _examples(torch_policy)  # sampled at temperature 0.8 (SamplingConfig's default)
    # stored == teacher forcing at T in fp32, each token within the rounding bound of the two
    # computations (sampler's cached decode, training forward), so each s_i = exp(mean_t(logp - old))
    # within expm1(mean_t bound) of 1 (~1e-3; was 1e-5); stored at T = 1 it would be ~0.1 off
    bounds = logprob_tolerances(
        torch_policy, [e.prompt for e in examples], [e.response_ids for e in examples], temperature=0.8
    )
    config = GSPOConfig(
        batch_size=8, learning_rate=1e-3, lora=LoraSettings(r=4, alpha=8), temperature=0.8, old_logprobs="stored"
    )
    stats = train_gspo(torch_policy, examples, config)
    assert stats.extra["old_logprobs"] == "stored"
    assert abs(stats.extra["ratio_mean"][0] - 1.0) <= max(float(np.expm1(b.mean())) for b in bounds)
    default = train_gspo(
        TorchBackend(tiny_model_dir, device="cpu"),
        examples,
        GSPOConfig(batch_size=8, learning_rate=1e-3, lora=LoraSettings(r=4, alpha=8), temperature=0.8),
    )
    assert default.extra["old_logprobs"] == "recomputed" and default.extra["ratio_mean"][0] == 1.0


def test_bf16_recomputes_pi_old_so_clipping_is_not_active_before_any_step(torch_policy):
    examples = _examples(torch_policy)  # sampled in fp32: the stored values are off for a bf16 forward
    torch_policy.model.to(torch.bfloat16)
    torch_policy.dtype = torch.bfloat16
    config = GSPOConfig(batch_size=8, learning_rate=1e-3, lora=LoraSettings(r=4, alpha=8), temperature=0.8)
    stats = train_gspo(torch_policy, examples, config)
    assert stats.extra["old_logprobs"] == "recomputed"
    # bf16 rounds every weight and activation by up to 2^-8 relative (~0.05 nat on logits of ~10):
    # its log-probs sit far more than 1e-4 from the stored fp32 values
    assert stats.extra["behavior_logprob_gap_max"] > 1e-4
    # pi_old recomputed by the same bf16 forward: ratio exactly 1 (1e-6 only covers the fp32 mean)
    assert abs(stats.extra["ratio_mean"][0] - 1.0) < 1e-6 and stats.extra["clip_fraction"][0] == 0.0


def test_pi_old_is_computed_once_per_example_whatever_the_epochs():
    """pi_old is one policy: each example's log-probs come from the first batch that holds it (the
    first epoch's arrangement, where the training forward meets the same batch) and later epochs'
    arrangements reuse them, bit for bit, with no pass of their own; pi_ref likewise."""
    import contextlib
    from types import SimpleNamespace

    from outcome_flywheel.models.torch.training import FRAMEWORK
    from outcome_flywheel.models.train.batching import EncodedExample
    from outcome_flywheel.models.train.gspo import old_logprobs

    rng = np.random.default_rng(0)
    examples = [
        EncodedExample([1, 2], rng.integers(5, 50, n).tolist(), list(rng.normal(size=n)), 1.0, index=i)
        for i, n in enumerate([3, 5, 2, 4])
    ]
    passes = []

    def logprobs(batch):  # a batch-dependent result, as bf16 kernels can give: the pass is told apart
        passes.append([b.index for b in batch])
        width = max(len(b.response_ids) for b in batch)
        values = torch.zeros(len(batch), width)
        for k, b in enumerate(batch):
            values[k, : len(b.response_ids)] = -1.0 - b.index - 0.01 * len(passes)
        return values, values != 0

    backend = SimpleNamespace(
        framework=FRAMEWORK,
        model=torch.nn.Linear(1, 1),
        device=torch.device("cpu"),
        adapter_disabled=contextlib.nullcontext,
    )
    e0, e1, e2, e3 = examples
    epochs = [[e0, e1], [e2, e3], [e1, e2], [e3, e0]]  # two epochs, rearranged
    old, gaps, ratios, ref = old_logprobs(backend, epochs, logprobs, recompute=True, reference=True)
    # pi_ref and pi_old: one pass each per first-epoch batch, none for the second epoch
    assert passes == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert sorted(ratios) == [0, 1, 2, 3] and len(gaps) == 4
    row = {}
    for batch, values in zip(epochs[:2], old[:2]):
        for k, b in enumerate(batch):
            row[b.index] = values[k, : len(b.response_ids)]
    for batch, values in zip(epochs[2:], old[2:]):
        for k, b in enumerate(batch):
            assert torch.equal(values[k, : len(b.response_ids)], row[b.index])
            assert torch.all(values[k, len(b.response_ids) :] == 0)
    assert torch.equal(ref[2][0, :5], ref[0][1, :5])  # e1's pi_ref, first seen in batch 0
