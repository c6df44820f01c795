"""Weighted DPO: the loss written out (Rafailov et al. 2023) with per-pair weights, and a short
LoRA training on tiny-local."""

import math

import pytest
import torch
import torch.nn.functional as F

from tests.flywheel_fixtures import one_thread  # noqa: F401
from resources.models.weighted_dpo import PreferencePair, WeightedDPOConfig, train_weighted_dpo, weighted_dpo_loss


def _manual(pc, pr, rc, rr, w, beta):
    losses = [-math.log(1 / (1 + math.exp(-beta * ((a - c) - (b - d))))) for a, b, c, d in zip(pc, pr, rc, rr)]
    return sum(wi * li for wi, li in zip(w, losses)) / sum(w)


def test_loss_matches_the_formula_with_weights():
    pc, pr, rc, rr = [-10.0, -20.0, -5.0], [-12.0, -18.0, -9.0], [-11.0, -19.0, -6.0], [-11.5, -19.0, -8.0]
    w = [1.0, 0.3, 0.5]
    t = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    loss, metrics = weighted_dpo_loss(t(pc), t(pr), t(rc), t(rr), t(w), beta=0.1)
    assert loss.item() == pytest.approx(_manual(pc, pr, rc, rr, w, 0.1), rel=1e-12)
    assert metrics["rewards_accuracy"] == pytest.approx(2 / 3)


def test_equal_weights_give_plain_dpo_and_weights_matter():
    g = torch.Generator().manual_seed(0)
    pc, pr, rc, rr = (torch.randn(6, generator=g) * 5 - 20 for _ in range(4))
    plain = -F.logsigmoid(0.1 * ((pc - rc) - (pr - rr))).mean()
    loss, _ = weighted_dpo_loss(pc, pr, rc, rr, torch.full((6,), 0.7), 0.1)
    assert loss.item() == pytest.approx(plain.item(), rel=1e-6)
    w = torch.tensor([1.0, 0, 0, 0, 0, 0])
    only_first, _ = weighted_dpo_loss(pc, pr, rc, rr, w, 0.1)
    assert only_first.item() == pytest.approx(-F.logsigmoid(0.1 * ((pc[0] - rc[0]) - (pr[0] - rr[0]))).item(), rel=1e-6)


def test_at_the_reference_the_loss_is_log2_and_gradient_favours_chosen():
    pc = torch.tensor([-10.0, -30.0], requires_grad=True)
    pr = torch.tensor([-10.0, -30.0], requires_grad=True)
    loss, _ = weighted_dpo_loss(pc, pr, pc.detach(), pr.detach(), torch.tensor([1.0, 3.0]), 0.1)
    assert loss.item() == pytest.approx(math.log(2))
    loss.backward()
    assert (pc.grad < 0).all() and (pr.grad > 0).all()  # descent raises chosen, lowers rejected
    assert pc.grad[1] == pytest.approx(3 * pc.grad[0])  # the weight scales the pair's gradient


def test_defaults_are_the_issues():
    cfg = WeightedDPOConfig()
    assert (cfg.learning_rate, cfg.beta, cfg.lora.r, cfg.max_grad_norm) == (5e-5, 0.1, 8, 1.0)
    assert WeightedDPOConfig.with_overrides(learning_rate=1e-4, epochs=None).epochs == cfg.epochs


def test_training_moves_the_policy_towards_chosen(torch_policy, one_thread):
    prompt = [{"role": "user", "content": "Rebalance review. regime: neutral\nWrite the plan to execute."}]
    pairs = [
        PreferencePair(prompt, "Plan: 1 order.\nBuy AAPL (Information Technology), 2.0% of the portfolio.", "Plan: hold. No trades.", 1.0),
        PreferencePair(prompt, "Plan: hold. No trades.", "Plan: 1 order.\nBuy XOM (Energy), 2.0% of the portfolio.", 0.5),
    ]
    cfg = WeightedDPOConfig(learning_rate=5e-3, epochs=6, batch_size=2, seed=0)
    stats = train_weighted_dpo(torch_policy, pairs, cfg)
    assert stats.steps == 6 and torch_policy.has_adapter
    assert stats.losses[0] == pytest.approx(math.log(2), abs=1e-4)  # policy == reference at step 0
    assert stats.losses[-1] < stats.losses[0]
    assert stats.extra["rewards_margin"][-1] > 0
    with pytest.raises(ValueError):
        train_weighted_dpo(torch_policy, [PreferencePair(prompt, "a", "b", -0.5)], cfg)
