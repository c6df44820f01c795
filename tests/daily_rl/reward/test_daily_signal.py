"""The daily loop's learning signal is what it claims to be (torch; the mlx mirrors are in
tests/test_mlx_*.py): behaviour log-probs at the sampling temperature, a GSPO ratio of exactly 1
before the first step, an exact KL to the base, and a bf16 full fine-tune that keeps its updates."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from outcome_flywheel.daily_rl.policy.rollouts import ROLLOUT_SAMPLING
from outcome_flywheel.models.interface import LoraSettings
from outcome_flywheel.models.prompts import trading_note_messages
from outcome_flywheel.models.torch.backend import TorchBackend
from outcome_flywheel.models.train.gspo import train_gspo
from outcome_flywheel.models.train.gspo_config import GSPOConfig, GSPOExample
from tests.mlx_fixtures import perturb_torch_lora
from tests.tolerances import assert_logprobs_close, kl_tolerances, logprob_tolerances, worst_ratio

PROMPTS = [
    trading_note_messages("Nvidia beats estimates", "Revenue rose."),
    trading_note_messages("Boeing cuts outlook"),
]
SAMPLING = replace(ROLLOUT_SAMPLING, max_new_tokens=40)


@pytest.fixture(scope="module")
def base(tiny_model_dir):
    return TorchBackend(tiny_model_dir, device="cpu")


@pytest.fixture(scope="module")
def sampled(base):
    """(prompts, samples) of the base at the rollouts' sampling settings, one row per sample."""
    groups = base.sample(PROMPTS, 4, SAMPLING, seeds=[1, 2])
    return [PROMPTS[i] for i, g in enumerate(groups) for _ in g], [s for g in groups for s in g]


def _examples(sampled) -> list[GSPOExample]:
    prompts, samples = sampled
    return [
        GSPOExample(prompt=p, response_ids=s.token_ids, behavior_logprobs=s.logprobs, advantage=1.0 if j % 2 else -1.0)
        for j, (p, s) in enumerate(zip(prompts, samples))
    ]


def test_stored_logprobs_are_teacher_forcing_at_the_sampling_temperature(base, sampled):
    prompts, samples = sampled
    ids = [s.token_ids for s in samples]
    stored = [np.array(s.logprobs) for s in samples]
    at_t = base.response_logprobs(prompts, ids, temperature=SAMPLING.temperature)
    at_1 = base.response_logprobs(prompts, ids)
    # the sampler's cached decode and teacher forcing, two fp32 computations: per token within the
    # rounding bound of tests/tolerances.py (~1e-3; was a flat 1e-4)
    bounds = logprob_tolerances(base, prompts, ids, temperature=SAMPLING.temperature)
    assert_logprobs_close(stored, at_t, bounds)
    # the temperature-1 convention is measurably another distribution, beyond the bound
    assert worst_ratio(stored, at_1, bounds) > 1.0
    assert np.median(np.concatenate([np.abs(a - b) for a, b in zip(stored, at_1)])) > 1e-3


def test_gspo_ratio_is_exactly_one_before_the_first_step(tiny_model_dir, sampled):
    config = GSPOConfig(
        batch_size=8, learning_rate=1e-3, lora=LoraSettings(r=4, alpha=8), temperature=SAMPLING.temperature
    )
    stats = train_gspo(TorchBackend(tiny_model_dir, device="cpu"), _examples(sampled), config)
    assert stats.extra["old_logprobs"] == "recomputed"
    assert stats.extra["ratio_min"][0] == stats.extra["ratio_max"][0] == 1.0
    assert stats.extra["clip_fraction"][0] == 0.0
    # pi_old is the policy that sampled them: the largest gap within the largest token bound (was 1e-4)
    prompts, samples = sampled
    bound = max(
        float(b.max())
        for b in logprob_tolerances(
            TorchBackend(tiny_model_dir, device="cpu"),
            prompts,
            [s.token_ids for s in samples],
            temperature=SAMPLING.temperature,
        )
    )
    assert stats.extra["behavior_logprob_gap_max"] <= bound
    # Trained at temperature 1, the stored values would not be the behaviour policy.
    wrong = train_gspo(TorchBackend(tiny_model_dir, device="cpu"), _examples(sampled), replace(config, temperature=1.0))
    assert wrong.extra["behavior_logprob_gap_max"] > max(1e-3, bound)


def _brute_force_kl(policy_logits: torch.Tensor, base_logits: torch.Tensor, temperature: float) -> np.ndarray:
    p = torch.log_softmax(policy_logits.double() / temperature, -1)
    q = torch.log_softmax(base_logits.double() / temperature, -1)
    return (p.exp() * (p - q)).sum(-1).numpy()


def _full_logits(backend: TorchBackend, prompt, response) -> torch.Tensor:
    """All logits of one `prompt + response` sequence, at the positions predicting the response."""
    ids = backend.prompt_ids(prompt)
    with torch.no_grad():
        logits = backend.model(input_ids=torch.tensor([ids + list(response)])).logits[0]
    return logits[len(ids) - 1 : len(ids) - 1 + len(response)]


def test_token_kl_is_the_exact_kl_over_the_vocabulary(tiny_model_dir, sampled):
    prompts, samples = sampled
    responses = [s.token_ids for s in samples]
    policy = TorchBackend(tiny_model_dir, device="cpu")
    policy.add_lora(LoraSettings(r=4, alpha=8))
    perturb_torch_lora(policy)
    vocab = policy.model.get_output_embeddings().weight.shape[0]
    # several response positions per chunk, and several chunks per batch
    kl = policy.token_kl(prompts, responses, temperature=0.8, batch_size=3, chunk_elements=vocab * 7)
    expected = []
    for p, r in zip(prompts, responses):
        with_adapter = _full_logits(policy, p, r)
        with policy.adapter_disabled():
            without = _full_logits(policy, p, r)
        expected.append(_brute_force_kl(with_adapter, without, 0.8))
    assert [len(k) for k in kl] == [len(r) for r in responses]
    # The chunked fp32 KL against the float64 KL of full-forward fp32 logits (two forwards, batched
    # and one at a time): per position within `kl_tolerances` (tests/tolerances.py; was a flat 1e-5).
    bounds = kl_tolerances(policy, prompts, responses, temperature=0.8)
    assert worst_ratio(kl, expected, bounds) <= 1.0
    assert worst_ratio([1.01 * k for k in kl], expected, bounds) > 1.0  # a 1% error shows
    # KL >= 0, to within its rounding bound (was -1e-7)
    assert all((k >= -b).all() for k, b in zip(kl, bounds)) and np.mean(np.concatenate(kl)) > 1e-3
    # A separate base model as the reference (the full fine-tune case) gives the same numbers.
    separate = policy.token_kl(
        prompts, responses, temperature=0.8, reference=TorchBackend(tiny_model_dir, device="cpu")
    )
    assert worst_ratio(separate, expected, bounds) <= 1.0


def test_full_fine_tune_in_bf16_keeps_its_updates(tiny_model_dir, sampled, tmp_path):
    """lr 1e-5, three AdamW steps: in plain bf16 most updates round away; fp32 master weights
    under bf16 autocast move the same weights as an fp32 run, in the same direction."""
    config = GSPOConfig(
        objective="reward_weighted",
        learning_rate=1e-5,
        batch_size=3,
        lora=None,
        epochs=1,
        temperature=SAMPLING.temperature,
    )
    examples = _examples(sampled)

    def deltas(backend: TorchBackend) -> dict[str, torch.Tensor]:
        before = {n: p.detach().float().clone() for n, p in backend.model.named_parameters()}
        stats = train_gspo(backend, examples, config)
        assert stats.steps == 3
        return {n: p.detach().float() - before[n] for n, p in backend.model.named_parameters()}

    fp32 = deltas(TorchBackend(tiny_model_dir, device="cpu"))
    bf16_policy = TorchBackend(tiny_model_dir, device="cpu", dtype="bfloat16")
    bf16 = deltas(bf16_policy)
    moved = torch.cat([(d != 0).flatten() for d in fp32.values()])
    moved_in_bf16 = torch.cat([(d != 0).flatten() for d in bf16.values()])
    assert moved.float().mean() > 0.5
    assert (moved_in_bf16 & moved).float().sum() / moved.float().sum() > 0.95
    a, b = torch.cat([d.flatten() for d in fp32.values()]), torch.cat([d.flatten() for d in bf16.values()])
    assert torch.nn.functional.cosine_similarity(a, b, dim=0) > 0.9
    # The checkpoint keeps the fp32 masters; loaded for training it continues from them exactly.
    bf16_policy.save(tmp_path / "full")
    again = TorchBackend(tmp_path / "full", device="cpu", dtype="bfloat16", master_weights=True)
    for (name, p), (_, q) in zip(bf16_policy.model.named_parameters(), again.model.named_parameters()):
        assert q.dtype == torch.float32 and torch.equal(p, q), name
