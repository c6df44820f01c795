"""Weighted DPO: the loss written out (Rafailov et al. 2023) with per-pair weights, and a short
LoRA training on tiny-local."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from outcome_flywheel.models.segments import completion_segments, encode_segments, flatten_segments
from outcome_flywheel.models.torch.losses import weighted_dpo_loss
from outcome_flywheel.models.train.dpo import train_weighted_dpo
from outcome_flywheel.models.train.dpo_config import PreferencePair, WeightedDPOConfig
from outcome_flywheel.preferences.style_match import score_candidates
from outcome_flywheel.preferences.weighting import HOLD_TEXT
from tests.flywheel_fixtures import one_thread  # noqa: F401
from tests.tolerances import dpo_loss_tolerance, gamma, logprob_tolerances, margin_tolerances


def _manual(pc, pr, rc, rr, w, beta):
    losses = [-math.log(1 / (1 + math.exp(-beta * ((a - c) - (b - d))))) for a, b, c, d in zip(pc, pr, rc, rr)]
    return sum(wi * li for wi, li in zip(w, losses)) / sum(w)


def test_loss_matches_the_formula_with_weights():
    pc, pr, rc, rr = [-10.0, -20.0, -5.0], [-12.0, -18.0, -9.0], [-11.0, -19.0, -6.0], [-11.5, -19.0, -8.0]
    w = [1.0, 0.3, 0.5]
    t = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    loss, metrics = weighted_dpo_loss(t(pc), t(pr), t(rc), t(rr), t(w), beta=0.1)
    # float64 on hand-made numbers, ~20 roundings of 2^-53 (~2e-15 relative): 1e-12 is its bound
    # with room for the cancellation in (pc - rc) - (pr - rr)
    assert loss.item() == pytest.approx(_manual(pc, pr, rc, rr, w, 0.1), rel=1e-12)
    assert metrics["rewards_accuracy"] == pytest.approx(2 / 3)


def test_equal_weights_give_plain_dpo_and_weights_matter():
    g = torch.Generator().manual_seed(0)
    pc, pr, rc, rr = (torch.randn(6, generator=g) * 5 - 20 for _ in range(4))
    plain = -F.logsigmoid(0.1 * ((pc - rc) - (pr - rr))).mean()
    loss, _ = weighted_dpo_loss(pc, pr, rc, rr, torch.full((6,), 0.7), 0.1)
    # the same fp32 formula two ways, ~14 roundings each, relative to what it combines: the
    # margins' beta (|pc - rc| + |pr - rr|) and the losses (was rel=1e-6)
    size = (-F.logsigmoid(0.1 * ((pc - rc) - (pr - rr))) + 0.1 * ((pc - rc).abs() + (pr - rr).abs())).double()
    assert loss.item() == pytest.approx(plain.item(), abs=2 * gamma(14) * size.mean().item())
    w = torch.tensor([1.0, 0, 0, 0, 0, 0])
    only_first, _ = weighted_dpo_loss(pc, pr, rc, rr, w, 0.1)
    assert only_first.item() == pytest.approx(
        -F.logsigmoid(0.1 * ((pc[0] - rc[0]) - (pr[0] - rr[0]))).item(), abs=2 * gamma(14) * size[0].item()
    )


def test_at_the_reference_the_loss_is_log2_and_gradient_favours_chosen():
    pc = torch.tensor([-10.0, -30.0], requires_grad=True)
    pr = torch.tensor([-10.0, -30.0], requires_grad=True)
    loss, _ = weighted_dpo_loss(pc, pr, pc.detach(), pr.detach(), torch.tensor([1.0, 3.0]), 0.1)
    # margins exactly 0: log 2 rounded to fp32 and weighted, a few u (~1e-7) below approx's 1e-6
    assert loss.item() == pytest.approx(math.log(2))
    loss.backward()
    assert (pc.grad < 0).all() and (pr.grad > 0).all()  # descent raises chosen, lowers rejected
    assert pc.grad[1] == pytest.approx(3 * pc.grad[0])  # the weight scales the pair's gradient


def test_defaults_are_the_measured_ones():
    # benchmarks/flywheel_auc.py: the settings that learn every consistent synthetic operator.
    cfg = WeightedDPOConfig()
    assert (cfg.learning_rate, cfg.beta, cfg.epochs, cfg.lora.r, cfg.max_grad_norm, cfg.completion_unit) == (
        1e-3,
        0.02,
        8,
        8,
        1.0,
        "line",
    )
    assert WeightedDPOConfig.with_overrides(learning_rate=1e-4, epochs=None).epochs == cfg.epochs
    with pytest.raises(ValueError, match="completion_unit"):
        WeightedDPOConfig(completion_unit="token")


def test_completion_segments():
    plan = "Plan: 2 orders.\nBuy AAPL (Information Technology), 2.0% of the portfolio.\n\nSell XOM (Energy), 1.0% of the portfolio."
    assert completion_segments(plan, "line") == plan.replace("\n\n", "\n").split("\n")
    assert completion_segments(plan, "sequence") == [plan]
    assert completion_segments("Plan: hold. No trades.", "line") == ["Plan: hold. No trades."]
    with pytest.raises(ValueError):
        completion_segments(plan, "word")
    prompts, responses, owner = flatten_segments([[1, 2], [3]], [[[4], [5, 6]], [[7]]])
    assert (prompts, responses, owner) == ([[1, 2], [1, 2], [3]], [[4], [5, 6], [7]], [0, 0, 1])


def test_line_unit_log_prob_is_the_sum_of_each_line_as_its_own_response(torch_policy, one_thread):
    """What the trainer sums for a pair equals each line scored alone after the prompt, added up."""
    prompt = [{"role": "user", "content": "Rebalance review. regime: neutral\nWrite the plan to execute."}]
    plans = [
        "Plan: 2 orders.\nBuy AAPL (Information Technology), 2.0% of the portfolio.\nSell XOM (Energy), 1.0% of the portfolio.",
        "Plan: hold. No trades.",
    ]
    p_ids = [torch_policy.prompt_ids(prompt)] * 2
    with torch.no_grad():
        summed = torch_policy.sequence_logps(
            p_ids, [encode_segments(torch_policy.encode_response, t, "line") for t in plans]
        )
        whole = torch_policy.sequence_logps(
            p_ids, [encode_segments(torch_policy.encode_response, t, "sequence") for t in plans]
        )

        # The same tokens in other batches (other padding, other fp32 rounding): a sum within its
        # tokens' rounding bounds plus the fp32 sum's own, relative to the summed magnitudes
        # (tests/tolerances.py; was abs=1e-4, and 1e-5 for the one-line plan).
        def bound(lines):
            ids = [torch_policy.encode_response(x) for x in lines]
            logps = torch_policy.response_logprobs([prompt] * len(lines), ids)
            tols = logprob_tolerances(torch_policy, [prompt] * len(lines), ids)
            return sum(float(t.sum()) + 2 * gamma(len(lp)) * float(np.abs(lp).sum()) for t, lp in zip(tols, logps))

        for k, text in enumerate(plans):
            lines = text.split("\n")
            logp = torch_policy.response_logprobs(
                [prompt] * len(lines), [torch_policy.encode_response(x) for x in lines]
            )
            assert summed[k].item() == pytest.approx(sum(float(x.sum()) for x in logp), abs=bound(lines))
            full = torch_policy.response_logprobs([prompt], [torch_policy.encode_response(text)])[0]
            assert whole[k].item() == pytest.approx(float(full.sum()), abs=bound([text]))
    # A one-line completion is the same either way; a multi-line one is not.
    assert summed[1].item() == pytest.approx(whole[1].item(), abs=bound([plans[1]]))
    assert abs(summed[0].item() - whole[0].item()) > max(1e-2, bound(plans[0].split("\n")) + bound([plans[0]]))


def test_training_moves_the_policy_towards_chosen(torch_policy, one_thread):
    prompt = [{"role": "user", "content": "Rebalance review. regime: neutral\nWrite the plan to execute."}]
    pairs = [
        PreferencePair(
            prompt,
            "Plan: 1 order.\nBuy AAPL (Information Technology), 2.0% of the portfolio.",
            "Plan: hold. No trades.",
            1.0,
        ),
        PreferencePair(
            prompt, "Plan: hold. No trades.", "Plan: 1 order.\nBuy XOM (Energy), 2.0% of the portfolio.", 0.5
        ),
    ]
    cfg = WeightedDPOConfig(learning_rate=5e-3, epochs=6, batch_size=2, seed=0)
    # policy == reference at step 0 (a fresh adapter adds exact zeros), but the trainer scores the
    # reference and the policy in different batches: the loss within `dpo_loss_tolerance` of
    # log 2 (tests/tolerances.py; was abs=1e-4)
    at_reference = dpo_loss_tolerance(torch_policy, pairs, cfg.beta, cfg.completion_unit)
    stats = train_weighted_dpo(torch_policy, pairs, cfg)
    assert stats.steps == 6 and torch_policy.has_adapter
    assert stats.losses[0] == pytest.approx(math.log(2), abs=at_reference)
    assert stats.losses[-1] < stats.losses[0]
    assert stats.extra["rewards_margin"][-1] > 0
    # The style score reads the contrast the pairs trained: each plan's implicit reward against holding's.
    aapl, xom = pairs[0].chosen, pairs[1].rejected
    margin, score = score_candidates(torch_policy, [prompt, prompt], [aapl, xom], cfg.completion_unit, cfg.beta)
    assert score[0] > 0.5 > score[1]
    assert score[0] == pytest.approx(1 / (1 + math.exp(-cfg.beta * margin[0])))

    def reward(text):
        lines = text.split("\n")
        ids = [torch_policy.encode_response(x) for x in lines]
        on = torch_policy.response_logprobs([prompt] * len(lines), ids, use_adapter=True)
        off = torch_policy.response_logprobs([prompt] * len(lines), ids, use_adapter=False)
        return sum(float(a.sum()) - float(b.sum()) for a, b in zip(on, off))

    # scored in one batch or text by text: within the margin's rounding bound (was abs=1e-3)
    assert margin[0] == pytest.approx(
        reward(aapl) - reward(HOLD_TEXT), abs=margin_tolerances(torch_policy, [prompt], [aapl], cfg.completion_unit)[0]
    )
    with pytest.raises(ValueError):
        train_weighted_dpo(torch_policy, [PreferencePair(prompt, "a", "b", -0.5)], cfg)
