"""The lean anchor (`side_lean_anchor`, issue 46): lambda (mean over the side pairs of d_i (x_i - x_old,i))^2, by hand
in both frameworks, 0 with no gradient where the day began, refused without a pair form, and in the trainer: it
holds back the move of every side margin that the pair term makes when long won everywhere."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from outcome_flywheel.daily_rl.reward.counterfactual import side_counterfactual
from outcome_flywheel.daily_rl.reward.signals import PriceReward
from outcome_flywheel.models.train.gspo_config import GSPOConfig

# three pairs: two sides (own long, own short) and one name pair (d = 0, outside the anchor)
OWN_LOGP = [[-0.5, -1.0, -0.25, 0.0], [-2.0, -0.1, -0.3, -0.7], [-0.9, -0.2, -1.1, -0.4]]
OWN_MASK = [[0, 1, 1, 0], [1, 0, 0, 0], [0, 0, 1, 0]]
OTHER_LOGP = [[-1.5, -3.0, -0.2], [-0.4, -0.9, -2.5], [-0.6, -1.7, -0.3]]
OTHER_MASK = [[0, 1, 0], [0, 1, 1], [1, 0, 0]]
DIRECTIONS = [1.0, -1.0, 0.0]
OLD = [1.0, -0.5, 3.0]  # x at pi_old
WEIGHT = 0.7


def hand_lean():
    """x_i = l_own,i - l_other,i; lean = mean over d != 0 of d_i (x_i - x_old,i); loss = w lean^2; dloss/dx_i =
    2 w lean d_i / n on the side pairs (n of them), 0 on the name pair; the own row's tokens take +dloss/dx_i, the
    other row's -dloss/dx_i."""
    own = [sum(m * lp for m, lp in zip(mask, row)) for mask, row in zip(OWN_MASK, OWN_LOGP)]
    other = [sum(m * lp for m, lp in zip(mask, row)) for mask, row in zip(OTHER_MASK, OTHER_LOGP)]
    sides = [i for i, d in enumerate(DIRECTIONS) if d]
    lean = sum(DIRECTIONS[i] * (own[i] - other[i] - OLD[i]) for i in sides) / len(sides)
    dx = [2 * WEIGHT * lean * d / len(sides) for d in DIRECTIONS]
    own_grad = [[v * m for m in mask] for v, mask in zip(dx, OWN_MASK)]
    other_grad = [[-v * m for m in mask] for v, mask in zip(dx, OTHER_MASK)]
    return WEIGHT * lean**2, lean, own_grad, other_grad


def torch_lean(own_logp, old=OLD):
    import torch

    from outcome_flywheel.models.torch.losses import side_lean_loss

    other = torch.tensor(OTHER_LOGP, dtype=torch.float64, requires_grad=True)
    loss, metrics = side_lean_loss(
        own_logp,
        torch.tensor(OWN_MASK, dtype=torch.float64),
        torch.tensor([0, 1, 2]),
        other,
        torch.tensor(OTHER_MASK, dtype=torch.float64),
        torch.tensor(DIRECTIONS, dtype=torch.float64),
        torch.tensor(old, dtype=torch.float64),
        WEIGHT,
    )
    return loss, metrics, other


def test_lean_anchor_by_hand_torch():
    import torch

    own = torch.tensor(OWN_LOGP, dtype=torch.float64, requires_grad=True)
    loss, metrics, other = torch_lean(own)
    loss.backward()
    expected, lean, own_grad, other_grad = hand_lean()
    assert abs(lean) > 0.1  # the case moves: the figures below are not all zero
    # float64: a handful of sums and one square, so 1e-12 relative is the arithmetic's
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    assert metrics["side_lean"] == pytest.approx(lean, rel=1e-12)
    assert own.grad.numpy() == pytest.approx(np.array(own_grad), rel=1e-12, abs=1e-15)
    assert other.grad.numpy() == pytest.approx(np.array(other_grad), rel=1e-12, abs=1e-15)


def test_lean_anchor_is_zero_with_no_gradient_where_the_day_began():
    """x_old = x (the policy has not moved): loss 0 and every gradient 0; the name pair's x_old never counts."""
    import torch

    own_sums = [sum(m * lp for m, lp in zip(mask, row)) for mask, row in zip(OWN_MASK, OWN_LOGP)]
    other_sums = [sum(m * lp for m, lp in zip(mask, row)) for mask, row in zip(OTHER_MASK, OTHER_LOGP)]
    start = [a - b for a, b in zip(own_sums, other_sums)]
    start[2] += 5.0  # the name pair's: left out of the lean
    own = torch.tensor(OWN_LOGP, dtype=torch.float64, requires_grad=True)
    loss, metrics, other = torch_lean(own, start)
    loss.backward()
    assert loss.item() == pytest.approx(0.0, abs=1e-24)
    assert metrics["side_lean"] == pytest.approx(0.0, abs=1e-12)
    assert float(own.grad.abs().max()) <= 1e-12 and float(other.grad.abs().max()) <= 1e-12


def test_lean_anchor_by_hand_mlx():
    """The mlx mirror against the same figures, in float32: loss and both rows' gradients as one vector."""
    mx = pytest.importorskip("mlx.core")
    from outcome_flywheel.models.mlx.losses import side_lean_loss

    fixed = (mx.array(OWN_MASK), mx.array([0, 1, 2]))
    rest = (mx.array(OTHER_MASK), mx.array(DIRECTIONS), mx.array(OLD), WEIGHT)
    grad_fn = mx.value_and_grad(lambda own, other: side_lean_loss(own, *fixed, other, *rest)[0], argnums=(0, 1))
    loss, grads = grad_fn(mx.array(OWN_LOGP), mx.array(OTHER_LOGP))
    got = np.concatenate([[loss.item()], *(np.array(g).ravel() for g in grads)])
    expected, _, hand_own, hand_other = hand_lean()
    want = np.concatenate([[expected], np.ravel(hand_own), np.ravel(hand_other)])
    # float32: each value within a few ulps (2^-23 relative) of the float64 figure
    assert got == pytest.approx(want, rel=1e-6, abs=1e-8)


@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf")])
def test_lean_anchor_refuses_a_negative_or_non_finite_weight(bad):
    with pytest.raises(ValueError, match="side_lean_anchor"):
        GSPOConfig(counterfactual_form="pair", side_lean_anchor=bad)


def test_lean_anchor_wants_a_pair_form():
    with pytest.raises(ValueError, match="counterfactual_form 'pair' or 'centered_pair'"):
        GSPOConfig(counterfactual_form="probability", side_lean_anchor=1.0)
    assert GSPOConfig(counterfactual_form="centered_pair", side_lean_anchor=1.0).side_lean_anchor == 1.0


# -- the trainer ------------------------------------------------------------------------------
NOTE = (
    "Trade Recommendation: Buy Meta.\nRationale: The headline matters for Meta because demand is strong.\n"
    "Risk Factors: Rates may stay higher.\nTimeframe: 1-2 weeks.\nPosition Size: 1% of the portfolio.\n"
    "Stop Loss: 3% below entry."
)
HEADLINES = [("Meta beats estimates", "Revenue rose."), ("Meta raises guidance", "Margins widened.")]


def long_margins(policy, examples) -> np.ndarray:
    """log pi(Buy) - log pi(Sell) at each example's side (long calls: the other row is the short one)."""
    out = []
    for e in examples:
        pair = e.counterfactual
        prompt = policy.prompt_ids(e.prompt)
        logp, _ = policy.batch_logprobs([prompt] * 2, [e.response_ids, pair.other_response_ids], 1.0)
        logp = policy.framework.to_numpy(logp)
        own = sum(v for v, m in zip(logp[0], pair.own_mask) if m)
        out.append(own - sum(v for v, m in zip(logp[1], pair.other_mask) if m))
    return np.array(out)


@pytest.mark.parametrize("framework", ["torch", "mlx"])
def test_the_anchor_holds_back_the_lean_the_pair_makes(tiny_model_dir, framework):
    """Long won on both headlines: the uncentred pair raises both long margins (a lean to Buy). With the anchor
    the same training moves their mean less; its first step starts at pi_old (lean 0) and it reports a lean on
    every step."""
    from transformers import AutoTokenizer

    from outcome_flywheel.models.interface import LoraSettings
    from outcome_flywheel.models.prompts import trading_note_messages
    from outcome_flywheel.models.train.gspo import train_gspo
    from outcome_flywheel.models.train.gspo_config import GSPOExample

    if framework == "mlx":
        pytest.importorskip("mlx.core")
        from outcome_flywheel.models.mlx.backend import MLXBackend as Backend
    else:
        from outcome_flywheel.models.torch.backend import TorchBackend as Backend
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = tokenizer(NOTE, add_special_tokens=False)["input_ids"]
    examples = []
    for headline in HEADLINES:
        value = PriceReward().value("matured", 2.0)
        pair = side_counterfactual(tokenizer, ids, NOTE, headline, value, PriceReward(), 10.0, 4.0)
        assert pair.direction == 1 and pair.coefficient > 0
        examples.append(
            GSPOExample(trading_note_messages(*headline), ids, [0.0] * len(ids), 0.0, [0.0] * len(ids), "price", pair)
        )
    plain = GSPOConfig(
        batch_size=2,
        epochs=6,
        learning_rate=5e-3,
        lora=LoraSettings(r=4, alpha=8),
        counterfactual_form="pair",
        counterfactual_epochs=6,
        share_prompt_prefix=False,
        gradient_shares=False,
    )
    moved = {}
    for name, config in (("plain", plain), ("anchored", replace(plain, side_lean_anchor=50.0))):
        policy = Backend(tiny_model_dir) if framework == "mlx" else Backend(tiny_model_dir, device="cpu")
        policy.framework.seed(0)
        before = long_margins(policy, examples)
        stats = train_gspo(policy, examples, config)
        moved[name] = float((long_margins(policy, examples) - before).mean())
        if name == "anchored":
            leans = stats.extra["side_lean"]
            assert len(leans) == stats.steps == 6
            # step 1 reads pi_old's own forward: x = x_old up to the forward's float32 rounding of ~40 log-probs
            assert abs(leans[0]) < 1e-3, leans
            assert max(abs(v) for v in leans[1:]) > 1e-3, leans
        else:
            assert "side_lean" not in stats.extra
    assert moved["plain"] > 0.05, moved  # the pair leans to Buy where long won everywhere
    assert moved["anchored"] < 0.5 * moved["plain"], moved
