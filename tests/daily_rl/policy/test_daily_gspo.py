"""GSPO loss by hand, and the trainer on tiny-local."""

import math
from dataclasses import replace

import pytest
import torch

from outcome_flywheel.models.interface import SamplingConfig
from outcome_flywheel.models.prompts import trading_note_messages
from outcome_flywheel.models.torch.losses import gspo_loss
from outcome_flywheel.models.train.gspo import train_gspo
from outcome_flywheel.models.train.gspo_config import GSPOConfig, GSPOExample
from tests.tolerances import (
    assert_logprobs_close,
    gamma,
    gradient_bound,
    logprob_gradient_scales,
    logprob_tolerances,
    longest,
)


def _batch():
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, 0.0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    adv = torch.tensor([1.5, -0.5])
    return logp, mask, adv


def test_gspo_at_ratio_one_matches_reward_weighted_gradient():
    logp, mask, adv = _batch()
    a = logp.clone().requires_grad_(True)
    loss_g, metrics = gspo_loss(a, logp.detach(), mask, adv, objective="gspo")
    loss_g.backward()
    b = logp.clone().requires_grad_(True)
    loss_r, _ = gspo_loss(b, logp.detach(), mask, adv, objective="reward_weighted")
    loss_r.backward()
    # fp32 on hand-made numbers, both -A_i / (n T_i) (times s_i = 1) after ~8 roundings each:
    # within 2 gamma(8) of the entry (tests/tolerances.py; was atol=1e-7)
    assert (torch.abs(a.grad - b.grad) <= 2 * gamma(8) * torch.abs(b.grad)).all()
    # value at s_i = 1: -mean(A); reward-weighted: -mean(A * mean_t logp), each fp32 within
    # gamma(T + n + 4) of the sum of its terms' sizes (was abs=1e-7 and 1e-6)
    assert loss_g.item() == pytest.approx(-adv.mean().item(), abs=2 * gamma(6) * adv.abs().mean().item())
    by_hand = -(1.5 * (-3.5 / 3) + (-0.5) * (-1.0 / 2)) / 2
    assert loss_r.item() == pytest.approx(by_hand, abs=gamma(9) * (1.5 * 3.5 / 3 + 0.5 * 1.0 / 2) / 2)
    assert metrics["clip_fraction"] == 0.0 and metrics["ratio_mean"] == pytest.approx(1.0)
    # padding carries no gradient
    assert a.grad[1, 2].item() == 0.0


def test_gspo_sequence_ratio_and_clipping_by_hand():
    logp, mask, adv = _batch()
    eps_low, eps_high = 0.2, 0.3
    # sequence 0 moved up by +0.5 per token: s_0 = e^0.5 > 1.3 with A > 0 -> clipped (no gradient)
    # sequence 1 moved down by -0.1 per token: s_1 = e^-0.1 = 0.905 > 0.8 with A < 0 -> inside, unclipped
    old = logp.clone()
    new = logp.clone()
    new[0] += 0.5
    new[1, :2] -= 0.1
    new.requires_grad_(True)
    loss, metrics = gspo_loss(new, old, mask, adv, eps_low, eps_high, "gspo")
    s0, s1 = math.exp(0.5), math.exp(-0.1)
    expected = (-min(s0 * 1.5, 1.3 * 1.5) + -min(s1 * -0.5, min(max(s1, 0.8), 1.3) * -0.5)) / 2
    # fp32 (sums of 3, exp, clip, products, mean) against float64: gamma(10) of the terms' sizes
    # (was rel=1e-6)
    assert loss.item() == pytest.approx(expected, abs=gamma(10) * (1.3 * 1.5 + s1 * 0.5 * (1 + 0.1)) / 2)
    assert metrics["clip_fraction"] == pytest.approx(0.5)
    loss.backward()
    assert torch.all(new.grad[0] == 0)  # clipped sequence: the gradient is gone
    assert torch.all(new.grad[1, :2] != 0)
    # ratio pushed the other way on a negative advantage: clipped too
    new2 = logp.clone()
    new2[1, :2] -= 0.5  # s_1 = e^-0.5 = 0.61 < 0.8 with A < 0
    _, m2 = gspo_loss(new2, old, mask, adv, eps_low, eps_high, "gspo")
    assert m2["clip_fraction"] == pytest.approx(0.5)


def test_gspo_engages_clipping_beyond_paper_epsilons():
    logp, mask, adv = _batch()
    tiny_shift = logp + 2e-4  # s = e^{2e-4} inside (1 - 3e-4, 1 + 4e-4)
    big_shift = logp + 1e-3  # s = e^{1e-3} beyond 1 + 4e-4
    _, inside = gspo_loss(tiny_shift, logp, mask, adv)
    _, beyond = gspo_loss(big_shift, logp, mask, adv)
    assert inside["clip_fraction"] == 0.0
    assert beyond["clip_fraction"] == pytest.approx(0.5)  # the A > 0 sequence


def test_config_rejects_unknown_objective():
    with pytest.raises(ValueError):
        GSPOConfig(objective="ppo")


def _examples(policy, n=8):
    prompts = [trading_note_messages("Apple beats quarterly estimates", "Revenue rose 8%.")]
    [group] = policy.sample(prompts, n, SamplingConfig(max_new_tokens=24), seeds=[3])
    advantages = torch.linspace(-1.5, 1.5, n).tolist()
    return [GSPOExample(prompts[0], s.token_ids, s.logprobs, a) for s, a in zip(group, advantages)], group


def test_train_gspo_moves_likelihood_with_the_advantage(torch_policy):
    examples, group = _examples(torch_policy)
    prompts = [ex.prompt for ex in examples]
    before = [lp.mean() for lp in torch_policy.response_logprobs(prompts, [ex.response_ids for ex in examples])]
    # stored behaviour log-probs are what teacher forcing at the sampling temperature reproduces
    forced = torch_policy.response_logprobs(prompts, [ex.response_ids for ex in examples], temperature=0.8)
    # the sampler's cached decode and teacher forcing, two fp32 computations: per token within the
    # rounding bound of tests/tolerances.py (was atol=1e-4)
    bounds = logprob_tolerances(torch_policy, prompts, [ex.response_ids for ex in examples], temperature=0.8)
    assert_logprobs_close([ex.behavior_logprobs for ex in examples], forced, bounds)
    torch.manual_seed(0)
    config = GSPOConfig(learning_rate=5e-3, batch_size=4, epochs=3, objective="reward_weighted", temperature=0.8)
    stats = train_gspo(torch_policy, examples, config)
    assert torch_policy.has_adapter  # LoRA by default
    assert stats.steps == 6 and len(stats.grad_norms) == 6 and "clip_fraction" in stats.extra
    after = [lp.mean() for lp in torch_policy.response_logprobs(prompts, [ex.response_ids for ex in examples])]
    delta = [float(a - b) for a, b in zip(after, before)]
    # best-advantage responses gained likelihood relative to the worst ones
    assert delta[-1] > delta[0]
    assert sum(d for d, ex in zip(delta, examples) if ex.advantage > 0) > sum(
        d for d, ex in zip(delta, examples) if ex.advantage < 0
    )


def test_a_carried_adapter_keeps_its_settings_and_says_when_the_configured_ones_differ(torch_policy):
    from outcome_flywheel.models.interface import LoraSettings

    policy = torch_policy
    examples, _ = _examples(policy, n=4)
    mlp = LoraSettings(r=4, alpha=8, target_modules=["gate_proj", "up_proj", "down_proj"])
    one_step = dict(learning_rate=1e-3, batch_size=4, epochs=1, temperature=0.8)
    fresh = train_gspo(policy, examples, GSPOConfig(lora=mlp, **one_step))
    assert fresh.extra["lora_adapter"] == "fresh LoRA: r 4, alpha 8, dropout 0, down_proj gate_proj up_proj"
    assert not fresh.extra["lora_settings_ignored"] and policy.adapter_settings() == replace(
        mlp, target_modules=sorted(mlp.target_modules)
    )
    same = train_gspo(policy, examples, GSPOConfig(lora=mlp, **one_step))  # the next day, same settings
    assert same.extra["lora_adapter"].startswith("LoRA carried from the parent: r 4, alpha 8")
    assert not same.extra["lora_settings_ignored"]
    other = train_gspo(policy, examples, GSPOConfig(lora=LoraSettings(), **one_step))  # the run config changed
    assert other.extra["lora_settings_ignored"]
    assert "; the configured r 8, alpha 16, dropout 0, down_proj gate_proj k_proj" in other.extra["lora_adapter"]
    full = train_gspo(policy, examples, GSPOConfig(lora=None, **one_step))  # full fine-tuning asked for
    assert full.extra["lora_settings_ignored"] and full.extra["lora_adapter"].endswith(
        "; full fine-tuning applies to a policy without an adapter only"
    )
    # the adapter trained is still the carried one: its targets, not the configured seven
    assert policy.adapter_settings().target_modules == ("down_proj", "gate_proj", "up_proj")
    trainable = [n for n, p in policy.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n and "_proj" in n and "q_proj" not in n for n in trainable)


def test_train_gspo_one_at_a_time_takes_one_step_per_example(torch_policy):
    examples, _ = _examples(torch_policy, n=4)
    stats = train_gspo(torch_policy, examples, GSPOConfig(one_at_a_time=True, learning_rate=1e-3, epochs=1))
    assert stats.steps == 4 and stats.extra["examples"] == 4


def test_train_gspo_full_fine_tune_has_no_adapter(torch_policy):
    examples, _ = _examples(torch_policy, n=4)
    stats = train_gspo(torch_policy, examples, GSPOConfig(lora=None, learning_rate=1e-4, batch_size=4, epochs=1))
    assert not torch_policy.has_adapter and stats.steps == 1
    assert torch_policy.num_parameters(trainable_only=True) == torch_policy.num_parameters()


def test_shared_prefix_logprobs_match_plain_padded_batches(torch_policy):
    from outcome_flywheel.models.interface import LoraSettings

    torch_policy.add_lora(LoraSettings())
    torch.manual_seed(0)
    for p in torch_policy.trainable_parameters():  # a non-trivial adapter, so the prompt's KV matters
        p.data.add_(0.05 * torch.randn_like(p))
    prompts = [
        torch_policy.prompt_ids(trading_note_messages("Apple beats quarterly estimates", "Revenue rose 8%.")),
        torch_policy.prompt_ids(trading_note_messages("Boeing recalls products in its defense line", "")),
    ]
    p_ids = [prompts[i % 2] for i in range(5)]
    r_ids = [list(range(10, 10 + n)) for n in (1, 7, 3, 12, 5)]
    plain, plain_mask = torch_policy.batch_logprobs(p_ids, r_ids)
    shared, shared_mask = torch_policy.batch_logprobs(p_ids, r_ids, shared_prefix=True)
    assert torch.equal(plain_mask, shared_mask)
    # Two fp32 computations (the prompt's KV cached, or run with every row): per token within the
    # rounding bound of tests/tolerances.py (was atol=1e-4)
    bounds = logprob_tolerances(torch_policy, p_ids, r_ids)
    assert_logprobs_close(
        [row[m].detach().numpy() for row, m in zip(shared, shared_mask)],
        [row[m].detach().numpy() for row, m in zip(plain, plain_mask)],
        bounds,
    )
    plain.sum().backward()
    g_plain = [p.grad.clone() for p in torch_policy.trainable_parameters()]
    torch_policy.model.zero_grad()
    shared.sum().backward()
    # The gradient of the summed log-probs, two fp32 backward passes: within gamma(k + V) of each
    # row's backward magnitude (tests/tolerances.py, `logprob_gradient_scales`), in norm (was
    # atol=rtol=1e-3 per entry); a prefix cache that dropped the adapter's KV would be O(1) off.
    difference = torch.sqrt(
        sum(((a - p.grad) ** 2).sum() for a, p in zip(g_plain, torch_policy.trainable_parameters()))
    )
    magnitudes, _ = logprob_gradient_scales(torch_policy, p_ids, r_ids)
    bound = gradient_bound(torch_policy, longest(torch_policy, p_ids, r_ids)) * sum(magnitudes)
    norm = torch.sqrt(sum((a**2).sum() for a in g_plain))
    assert difference <= bound < 0.01 * norm, (float(difference), bound, float(norm))
