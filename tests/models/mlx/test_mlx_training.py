"""GSPO and weighted DPO on mlx against torch, through the one trainer body (`models/train/gspo.py`,
`models/train/dpo.py`): the same loss and gradient norm on the same batch before any step (within the
rounding bounds that `gspo_tolerances` / `dpo_tolerances` carry from each token's log-prob through
the loss, tests/tolerances.py), and one optimiser step lowers the batch loss in both frameworks.
The losses alone, torch vs mlx on the same tensors: tests/models/test_models_parity.py."""

from __future__ import annotations

import numpy as np
import pytest

from tests.mlx_fixtures import PROMPTS, RESPONSES, SMALL_LORA, max_abs_diff, mlx_adapter_dir, require_mlx
from tests.tolerances import (
    assert_logprobs_close,
    dpo_loss_tolerance,
    dpo_margin_bounds,
    gamma,
    gradient_bound,
    logprob_gradient_scales,
    logprob_tolerances,
    longest,
)

require_mlx()

import mlx.core as mx  # noqa: E402
import torch  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402

from outcome_flywheel.models.mlx import losses as mlx_losses  # noqa: E402
from outcome_flywheel.models.mlx.backend import MLXBackend  # noqa: E402
from outcome_flywheel.models.segments import encode_segments, flatten_segments  # noqa: E402
from outcome_flywheel.models.torch import losses as torch_losses  # noqa: E402
from outcome_flywheel.models.torch.backend import TorchBackend  # noqa: E402
from outcome_flywheel.models.train.dpo import train_weighted_dpo
from outcome_flywheel.models.train.dpo_config import PreferencePair, WeightedDPOConfig
from outcome_flywheel.models.train.gspo import train_gspo
from outcome_flywheel.models.train.gspo_config import GSPOConfig, GSPOExample

EXTRA_RESPONSES = [
    "Trade Recommendation: Hold.\nRationale: the move is priced in.",
    "Position Size: 2% of the book.\nStop Loss: 4% below entry.",
    "Rationale: guidance was cut twice this year.\nTimeframe: 1 week.",
]
ADVANTAGES = [1.3, -0.4, 0.6, -1.1, 0.9, -1.3]


@pytest.fixture(scope="module")
def adapter(tiny_model_dir, tmp_path_factory):
    """An mlx LoRA adapter with random non-zero factors, saved in PEFT layout."""
    return mlx_adapter_dir(tiny_model_dir, tmp_path_factory.mktemp("train") / "adapter", seed=3)


def gspo_examples(backend, behaviour=None):
    prompts = [PROMPTS[i % 3] for i in range(6)]
    responses = [backend.encode_response(t) for t in RESPONSES + EXTRA_RESPONSES]
    behaviour = behaviour or backend.response_logprobs(prompts, responses)
    return [
        GSPOExample(prompt=p, response_ids=r, behavior_logprobs=[float(x) for x in b], advantage=a)
        for p, r, b, a in zip(prompts, responses, behaviour, ADVANTAGES)
    ]


def torch_gspo_sampling():
    from dataclasses import replace

    from outcome_flywheel.daily_rl.policy.rollouts import ROLLOUT_SAMPLING

    return replace(ROLLOUT_SAMPLING, max_new_tokens=32)


def dpo_pairs():
    return [
        PreferencePair(PROMPTS[0], RESPONSES[0], EXTRA_RESPONSES[0], 1.0),
        PreferencePair(PROMPTS[1], RESPONSES[1], EXTRA_RESPONSES[1], 3.0),
        PreferencePair(PROMPTS[2], EXTRA_RESPONSES[2], RESPONSES[2], 0.3),
        PreferencePair(PROMPTS[0], EXTRA_RESPONSES[1], RESPONSES[1], 1.5),
    ]


# -- the batch losses, computed without a step ---------------------------------------------------
def torch_gspo_batch_loss(backend, examples, config):
    logp, mask = backend.batch_logprobs(
        [backend.prompt_ids(e.prompt) for e in examples], [e.response_ids for e in examples]
    )
    old = torch.zeros_like(logp)
    for i, e in enumerate(examples):
        old[i, : len(e.behavior_logprobs)] = torch.tensor(e.behavior_logprobs)
    adv = torch.tensor([e.advantage for e in examples])
    with torch.no_grad():
        loss, _ = torch_losses.gspo_loss(logp, old, mask, adv, *config.clip_band(), config.objective)
    return float(loss)


def mlx_gspo_batch_loss(backend, examples, config):
    logp, mask = backend.batch_logprobs(
        [backend.prompt_ids(e.prompt) for e in examples], [e.response_ids for e in examples]
    )
    old = np.zeros(mask.shape, dtype=np.float32)
    for i, e in enumerate(examples):
        old[i, : len(e.behavior_logprobs)] = e.behavior_logprobs
    adv = mx.array([e.advantage for e in examples])
    loss, _ = mlx_losses.gspo_loss(logp, mx.array(old), mask, adv, *config.clip_band(), config.objective)
    return loss.item()


def torch_dpo_batch_loss(backend, pairs, beta):
    p = [backend.prompt_ids(x.prompt) for x in pairs]
    c = [encode_segments(backend.encode_response, x.chosen, "line") for x in pairs]
    r = [encode_segments(backend.encode_response, x.rejected, "line") for x in pairs]
    with torch.no_grad():
        with backend.adapter_disabled():
            ref_c, ref_r = backend.sequence_logps(p, c), backend.sequence_logps(p, r)
        pol_c, pol_r = backend.sequence_logps(p, c), backend.sequence_logps(p, r)
        loss, _ = torch_losses.weighted_dpo_loss(
            pol_c, pol_r, ref_c, ref_r, torch.tensor([x.weight for x in pairs]), beta
        )
    return float(loss)


def mlx_dpo_batch_loss(backend, pairs, beta):
    p = [backend.prompt_ids(x.prompt) for x in pairs]
    c = [encode_segments(backend.encode_response, x.chosen, "line") for x in pairs]
    r = [encode_segments(backend.encode_response, x.rejected, "line") for x in pairs]
    with backend.adapter_disabled():
        ref_c, ref_r = backend.sequence_logps(p, c), backend.sequence_logps(p, r)
    pol_c, pol_r = backend.sequence_logps(p, c), backend.sequence_logps(p, r)
    loss, _ = mlx_losses.weighted_dpo_loss(pol_c, pol_r, ref_c, ref_r, mx.array([x.weight for x in pairs]), beta)
    return loss.item()


# -- tolerances: each token's log-prob bound carried through the loss ------------------------------
def gspo_tolerances(torch_policy, examples, config) -> tuple[float, float, int]:
    """(loss, gradient norm) tolerances of a batch's "gspo" or "reward_weighted" loss, torch
    against mlx, and how many sequences may be clipped in one and not the other. With
    x_i = mean_t(logp - old) and per-token bounds e_t (tests/tolerances.py), x_i is within
    dx_i = mean_t e_t + 2 gamma(T) mean_t |logp - old| (the fp32 mean). gspo's term
    -min(A e^x, clip(e^x) A) is |A| e^x-Lipschitz in x (continuous across the band's edge), so it
    moves by at most |A| s expm1(dx); reward_weighted's -A x by |A| dx. The gradient
    (1/n) sum_i c_i grad x_i (c_i = -A_i s_i, 0 once clipped, or -A_i) errs by
    (1/n) sum_i |c_i| gamma(k + V) G_i / T_i (the backward's rounding, G_i the scale of
    `logprob_gradient_scales`) + |dc_i| ||grad x_i||,
    and by the whole |A_i| s_i ||grad x_i|| for a sequence whose ratio lies within its error of its
    clip edge (clipped in one backend, not in the other); the loss and norm arithmetic adds
    2 gamma(n + T + 4) of their magnitudes."""
    prompts, responses = [e.prompt for e in examples], [e.response_ids for e in examples]
    temperature = config.temperature
    tols = logprob_tolerances(torch_policy, prompts, responses, temperature)
    logps = torch_policy.response_logprobs(prompts, responses, temperature=temperature)
    scales, sequence_grads = logprob_gradient_scales(torch_policy, prompts, responses, temperature)
    g_backward = gradient_bound(torch_policy, longest(torch_policy, prompts, responses))
    n, t_max = len(examples), max(len(r) for r in responses)
    arithmetic = 2 * gamma(n + t_max + 4)
    low, high = config.clip_band() if config.objective == "gspo" else (None, None)
    loss_tol = grad_tol = magnitude = grad_magnitude = 0.0
    ambiguous = 0
    for e, lp, tol, scale, seq_grad in zip(examples, logps, tols, scales, sequence_grads):
        diff = np.asarray(lp, np.float64) - np.asarray(e.behavior_logprobs, np.float64)
        a, dx = abs(e.advantage), float(tol.mean()) + 2 * gamma(len(lp)) * float(np.abs(diff).mean())
        if config.objective == "gspo":
            s = float(np.exp(diff.mean()))
            ds = 2 * s * np.expm1(dx)  # both backends' ratios within s expm1(dx) of the exact one
            edge = 1.0 + high if e.advantage > 0 else 1.0 - low  # the edge where this term's branch turns
            clipped = s > edge if e.advantage > 0 else s < edge
            c, dc = (0.0, 0.0) if clipped else (a * s, a * s * np.expm1(dx))
            loss_tol += a * s * np.expm1(dx) / n
            if abs(s - edge) <= ds:
                ambiguous += 1
                grad_tol += a * (s + ds) * seq_grad / len(lp) / n
        else:
            c, dc = a, 0.0
            loss_tol += a * dx / n
        grad_tol += (c * g_backward * scale / len(lp) + dc * seq_grad / len(lp)) / n
        magnitude += c * (1.0 + float(np.abs(diff).mean()) + float(np.abs(lp).mean())) / n
        grad_magnitude += c * seq_grad / len(lp) / n
    return loss_tol + arithmetic * magnitude, grad_tol + arithmetic * grad_magnitude, ambiguous


def dpo_tolerances(torch_policy, pairs, beta, gradients: bool = True) -> tuple[float, float]:
    """(loss, gradient norm) tolerances of the weighted DPO loss of `pairs` (one batch, `line`
    segments), torch against mlx. The margins m_i and their bounds dm_i: `dpo_margin_bounds`; the
    loss's: `dpo_loss_tolerance` (tests/tolerances.py). The gradient -sum_i c_i grad(pi_c - pi_r)_i,
    c_i = (w_i / W) beta sigmoid(-beta m_i), errs by sum_i c_i gamma(k + V) G_i (the policy rows'
    scales, `logprob_gradient_scales`) + (w_i / W) beta^2 / 4 dm_i ||grad(pi_c - pi_r)_i||
    (`gradients=False`: the loss's alone, nan for the norm's)."""
    margin, dm = dpo_margin_bounds(torch_policy, pairs)
    loss_tol = dpo_loss_tolerance(torch_policy, pairs, beta, margins=(margin, dm))
    if not gradients:
        return loss_tol, float("nan")
    prompts = [x.prompt for x in pairs]
    segments = [encode_segments(torch_policy.encode_response, x.chosen, "line") for x in pairs]
    segments += [encode_segments(torch_policy.encode_response, x.rejected, "line") for x in pairs]
    rows_p, rows_r, item = flatten_segments(prompts + prompts, segments)
    n, owner = len(pairs), np.asarray(item) % len(pairs)
    scales, row_grads = logprob_gradient_scales(torch_policy, rows_p, rows_r)
    g_backward = gradient_bound(torch_policy, longest(torch_policy, rows_p, rows_r))
    grad_scale = np.bincount(owner, weights=scales, minlength=n)
    grad_pair = np.bincount(owner, weights=row_grads, minlength=n)  # >= ||grad(pi_c - pi_r)||
    w = np.array([x.weight for x in pairs]) / sum(x.weight for x in pairs)
    c = w * beta / (1.0 + np.exp(beta * margin))
    arithmetic = 2 * gamma(n + 4)
    grad_tol = float(
        (c * g_backward * grad_scale + w * beta**2 / 4 * dm * grad_pair).sum() + arithmetic * (c * grad_pair).sum()
    )
    return loss_tol, grad_tol


# -- on tiny-local with a non-trivial adapter: same loss before any step ------------------------
def test_gspo_batch_loss_matches_torch_before_any_step(tiny_model_dir, adapter):
    torch_policy = TorchBackend(tiny_model_dir, adapter_path=adapter, device="cpu")
    mlx_policy = MLXBackend(tiny_model_dir, adapter_path=adapter)
    # pi_old = the base (adapter off), so the ratios are far from 1 and both clip branches occur.
    base = TorchBackend(tiny_model_dir, device="cpu")
    examples = gspo_examples(base)
    config = GSPOConfig(
        objective="gspo",
        kl_beta=0.0,
        epochs=1,
        epsilon_low=0.05,
        epsilon_high=0.08,
        batch_size=6,
        lora=SMALL_LORA,
        old_logprobs="stored",
    )
    t_loss, m_loss = (
        torch_gspo_batch_loss(torch_policy, examples, config),
        mlx_gspo_batch_loss(mlx_policy, examples, config),
    )
    # Derived from the per-token bounds (was a flat 1e-4 for the loss, rel=1e-3 for the norm).
    loss_tol, grad_tol, ambiguous = gspo_tolerances(torch_policy, examples, config)
    assert abs(t_loss - m_loss) <= loss_tol
    # The trainers' first recorded loss is the same quantity, and so is the gradient norm.
    t_stats = train_gspo(torch_policy, examples, config)
    m_stats = train_gspo(mlx_policy, examples, config)
    assert t_stats.steps == m_stats.steps == 1
    assert abs(t_stats.losses[0] - t_loss) <= loss_tol and abs(m_stats.losses[0] - m_loss) <= loss_tol
    assert abs(m_stats.grad_norms[0] - t_stats.grad_norms[0]) <= grad_tol  # | ||a|| - ||b|| | <= ||a - b||
    assert ambiguous or grad_tol < 0.01 * t_stats.grad_norms[0]  # a 1% error in the gradient shows
    # the same sequences clipped, but for a ratio within rounding of its edge (the adapter is random)
    assert (
        abs(m_stats.extra["clip_fraction"][0] - t_stats.extra["clip_fraction"][0]) <= ambiguous / len(examples) + 1e-7
    )


def test_weighted_dpo_batch_loss_matches_torch_before_any_step(tiny_model_dir, adapter):
    torch_policy = TorchBackend(tiny_model_dir, adapter_path=adapter, device="cpu")
    mlx_policy = MLXBackend(tiny_model_dir, adapter_path=adapter)
    pairs = dpo_pairs()
    t_loss, m_loss = torch_dpo_batch_loss(torch_policy, pairs, 0.1), mlx_dpo_batch_loss(mlx_policy, pairs, 0.1)
    # Derived from the per-token bounds (was a flat 1e-4 for the loss, rel=1e-3 for the norm).
    loss_tol, grad_tol = dpo_tolerances(torch_policy, pairs, 0.1)
    # the adapter (random each run) moved the policy off the reference: some pair's margin lies
    # beyond its rounding bound (the loss itself may land near log 2 by chance)
    margins, bounds = dpo_margin_bounds(torch_policy, pairs)
    assert (np.abs(margins) > bounds).any()
    assert abs(t_loss - m_loss) <= loss_tol
    config = WeightedDPOConfig(learning_rate=2e-3, batch_size=4, epochs=1, lora=SMALL_LORA, beta=0.1)
    t_stats = train_weighted_dpo(torch_policy, pairs, config)
    m_stats = train_weighted_dpo(mlx_policy, pairs, config)
    assert abs(t_stats.losses[0] - t_loss) <= loss_tol and abs(m_stats.losses[0] - m_loss) <= loss_tol
    assert abs(m_stats.grad_norms[0] - t_stats.grad_norms[0]) <= grad_tol  # | ||a|| - ||b|| | <= ||a - b||
    # ~1.3% of the norm: each margin's bound (~0.1 nat over ~40 tokens, adapter on and off) moves its
    # pair's factor sigma(-beta m) by up to beta^2/4 of it. A 5% error in the gradient shows.
    assert grad_tol < 0.05 * t_stats.grad_norms[0]
    assert m_stats.extra["n_pairs"] == t_stats.extra["n_pairs"] == 4


# -- one optimiser step lowers the batch loss, in both --------------------------------------------
@pytest.mark.parametrize("objective", ["gspo", "reward_weighted"])
def test_one_gspo_step_lowers_the_batch_loss_in_both(tiny_model_dir, objective):
    """The daily loop's case: a fresh adapter, rollouts scored by the policy that sampled them."""
    config = GSPOConfig(objective=objective, kl_beta=0.0, learning_rate=2e-3, batch_size=6, epochs=1, lora=SMALL_LORA)
    for policy in (TorchBackend(tiny_model_dir, device="cpu"), MLXBackend(tiny_model_dir)):
        examples = gspo_examples(policy)
        batch_loss = torch_gspo_batch_loss if policy.name == "torch" else mlx_gspo_batch_loss
        stats = train_gspo(policy, examples, config)  # adds the LoRA adapter, then one step
        assert stats.steps == 1 and policy.has_adapter
        if objective == "gspo":  # every ratio is exactly 1 before the step: loss = -mean(A)
            # in fp32: A rounded to fp32, summed over 6 and divided, gamma(6 + 2) of mean|A| (was 1e-4)
            assert abs(stats.losses[0] - (-np.mean(ADVANTAGES))) <= gamma(len(ADVANTAGES) + 2) * np.mean(
                np.abs(ADVANTAGES)
            )
        after = batch_loss(policy, examples, config)
        assert after < stats.losses[0] - 1e-6, (policy.name, stats.losses[0], after)


def test_one_weighted_dpo_step_lowers_the_batch_loss_in_both(tiny_model_dir):
    config = WeightedDPOConfig(learning_rate=2e-3, batch_size=4, epochs=1, lora=SMALL_LORA)
    pairs = dpo_pairs()
    # A fresh adapter (B = 0) adds exact zeros, but the trainer scores the reference (chosen and
    # rejected apart) and the policy (together) in different layouts: the margins are within the
    # per-token bounds, the loss within `dpo_tolerances` of log 2 (was a flat 1e-4).
    loss_tol, _ = dpo_tolerances(TorchBackend(tiny_model_dir, device="cpu"), pairs, config.beta, gradients=False)
    results = {}
    for policy in (TorchBackend(tiny_model_dir, device="cpu"), MLXBackend(tiny_model_dir)):
        batch_loss = torch_dpo_batch_loss if policy.name == "torch" else mlx_dpo_batch_loss
        stats = train_weighted_dpo(policy, pairs, config)
        assert stats.steps == 1
        assert abs(stats.losses[0] - np.log(2)) <= loss_tol  # fresh adapter = reference
        after = batch_loss(policy, pairs, config.beta)
        assert after < stats.losses[0] - 1e-6, (policy.name, stats.losses[0], after)
        results[policy.name] = after
    # Fresh adapters differ (each framework's own random A), so the post-step losses only agree
    # roughly: not a rounding comparison, and no rounding bound applies; 0.05 is a loose sanity band.
    assert results["mlx"] == pytest.approx(results["torch"], abs=0.05)


def test_trainers_refuse_bad_input(tiny_model_dir):
    policy = MLXBackend(tiny_model_dir)
    config = WeightedDPOConfig(lora=SMALL_LORA)
    with pytest.raises(ValueError):
        train_weighted_dpo(policy, [], config)
    with pytest.raises(ValueError):
        train_weighted_dpo(policy, [PreferencePair(PROMPTS[0], "a", "b", 0.0)], config)
    bad = GSPOExample(PROMPTS[0], [1, 2, 3], [-1.0], 1.0)
    with pytest.raises(ValueError):
        train_gspo(policy, [bad], GSPOConfig(lora=SMALL_LORA))


def test_gspo_trainers_follow_one_batching_plan_over_several_steps(tiny_model_dir):
    """Full fine-tune from the same fp32 weights, 2 epochs of minibatches of 2 (6 AdamW steps): the
    same plan (whole prompt groups shuffled by one seeded generator) gives the same loss at every
    step and the same policy after, in torch and mlx."""
    torch_policy, mlx_policy = TorchBackend(tiny_model_dir, device="cpu"), MLXBackend(tiny_model_dir)
    examples = gspo_examples(torch_policy)
    config = GSPOConfig(objective="reward_weighted", learning_rate=1e-3, batch_size=2, epochs=2, lora=None, seed=5)
    t_stats, m_stats = train_gspo(torch_policy, examples, config), train_gspo(mlx_policy, examples, config)
    assert t_stats.steps == m_stats.steps == 6
    # Not rounding bounds: AdamW divides each gradient by its own running size, so a gradient entry
    # at rounding level takes a full lr step either way and the two trajectories drift apart by
    # up to ~lr per weight per step; 2e-3 on the losses and 2e-2 on the trained log-probs bound
    # that drift (the policies moved > 0.05), they say nothing of fp32 rounding.
    np.testing.assert_allclose(m_stats.losses, t_stats.losses, atol=2e-3)
    assert len(set(np.round(t_stats.losses, 3))) > 3  # the steps saw different batches
    prompts, responses = [e.prompt for e in examples], [e.response_ids for e in examples]
    trained_torch = torch_policy.response_logprobs(prompts, responses)
    assert max_abs_diff(mlx_policy.response_logprobs(prompts, responses), trained_torch) < 2e-2
    assert max_abs_diff(trained_torch, [np.array(e.behavior_logprobs) for e in examples]) > 0.05  # they did move


def test_gspo_ratio_is_exactly_one_first_and_bf16_full_fine_tune_keeps_its_updates(tiny_model_dir):
    """As tests/daily_rl/reward/test_daily_signal.py for torch: pi_old recomputed at the sampling temperature gives
    a ratio of exactly 1 at the first step; a full fine-tune of a bf16 model trains fp32 weights."""
    policy = MLXBackend(tiny_model_dir)
    groups = policy.sample(PROMPTS[:2], 3, torch_gspo_sampling(), seeds=[1, 2])
    examples = [
        GSPOExample(prompt=PROMPTS[i], response_ids=s.token_ids, behavior_logprobs=s.logprobs, advantage=a)
        for i, g in enumerate(groups)
        for s, a in zip(g, (1.0, -0.5, -0.5))
    ]
    config = GSPOConfig(batch_size=6, learning_rate=1e-3, lora=SMALL_LORA, temperature=0.8)
    # The sampler's cached decode against teacher forcing: per token within the bound of two fp32
    # computations (tests/tolerances.py), measured before the step; the trainer's own largest gap
    # within the largest of them (was a flat 1e-4).
    prompts, ids = [e.prompt for e in examples], [e.response_ids for e in examples]
    tolerances = logprob_tolerances(TorchBackend(tiny_model_dir, device="cpu"), prompts, ids, temperature=0.8)
    assert_logprobs_close(
        [np.array(e.behavior_logprobs) for e in examples],
        policy.response_logprobs(prompts, ids, temperature=0.8),
        tolerances,
    )
    stats = train_gspo(policy, examples, config)
    assert stats.extra["ratio_min"][0] == stats.extra["ratio_max"][0] == 1.0
    assert stats.extra["behavior_logprob_gap_max"] <= max(float(t.max()) for t in tolerances)

    bf16 = MLXBackend(tiny_model_dir, dtype="bfloat16")
    full = GSPOConfig(
        objective="reward_weighted", batch_size=2, learning_rate=1e-5, lora=None, temperature=0.8, epochs=1
    )
    before = {k: np.array(v.astype(mx.float32)) for k, v in tree_flatten(bf16.model.parameters())}
    assert train_gspo(bf16, examples, full).steps == 3
    assert bf16.dtype == mx.float32
    after = {k: np.array(v) for k, v in tree_flatten(bf16.model.parameters())}
    changed = np.mean(np.concatenate([(after[k] != before[k]).ravel() for k in before if "layers" in k]))
    assert changed > 0.5  # in bf16 an update of ~1e-5 changes almost none of them
