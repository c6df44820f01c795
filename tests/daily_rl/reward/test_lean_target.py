"""The lean target (`side_lean_target`, issue 46): mu KL(p || sigmoid(M)) on the side pairs' mean margin toward long
M, p = the update's share of side pairs where long did better (Laplace's rule): by hand in both frameworks, no
gradient at M = logit(p), p counted as documented, refused without a pair form, and in the trainer: it takes the
side margins' mean toward logit(p) where the centred pair alone leaves it to the optimiser's walk."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from outcome_flywheel.models.train.counterfactual import long_win_share
from outcome_flywheel.models.train.gspo_config import Counterfactual, GSPOConfig, GSPOExample
from tests.daily_rl.reward import side_pairs as sp

SHARE = 0.3  # p
MU = 0.7


def hand_target(share=SHARE):
    """M = mean over d != 0 of d_i x_i (x = l_own - l_other); loss = mu (p log(p / s) + (1 - p) log((1 - p) /
    (1 - s))), s = sigmoid(M); dloss/dM = mu (s - p), so dloss/dx_i = mu (s - p) d_i / n on the side pairs (n of
    them), 0 on the name pair; the own row's tokens take +dloss/dx_i, the other row's -dloss/dx_i."""
    own, other = sp.action_sums()
    sides = [i for i, d in enumerate(sp.DIRECTIONS) if d]
    margin = sum(sp.DIRECTIONS[i] * (own[i] - other[i]) for i in sides) / len(sides)
    s = 1.0 / (1.0 + math.exp(-margin))
    loss = MU * (share * math.log(share / s) + (1 - share) * math.log((1 - share) / (1 - s)))
    dx = [MU * (s - share) * d / len(sides) for d in sp.DIRECTIONS]
    own_grad = [[v * m for m in mask] for v, mask in zip(dx, sp.OWN_MASK)]
    other_grad = [[-v * m for m in mask] for v, mask in zip(dx, sp.OTHER_MASK)]
    return loss, margin, own_grad, other_grad


def torch_target(own_logp, share=SHARE, directions=sp.DIRECTIONS, old=None, weight=0.0):
    import torch

    from outcome_flywheel.models.torch.losses import side_lean_loss

    rows = sp.torch_rows(own_logp)
    d = torch.tensor(directions, dtype=torch.float64)
    start = None if old is None else torch.tensor(old, dtype=torch.float64)
    loss, metrics = side_lean_loss(*rows, d, start, weight, share, MU)
    return loss, metrics, rows[3]


def test_lean_target_by_hand_torch():
    own = sp.own_leaf()
    loss, metrics, other = torch_target(own)
    expected, margin, own_grad, other_grad = hand_target()
    assert expected > 0.05 and abs(own_grad[0][1]) > 1e-3  # the case moves: the figures below are not all zero
    sp.assert_torch_by_hand(loss, own, other, expected, own_grad, other_grad)
    assert metrics["side_lean_margin"] == pytest.approx(margin, rel=1e-12)
    assert "side_lean" not in metrics  # the anchor is off (no x_old)


def test_lean_target_is_zero_with_no_gradient_at_the_outcomes_lean():
    """p = sigmoid(M): KL 0 and every gradient 0 (its minimum is where the mean margin sits at logit(p))."""
    import torch

    _, margin, _, _ = hand_target()
    own = torch.tensor(sp.OWN_LOGP, dtype=torch.float64, requires_grad=True)
    loss, _, other = torch_target(own, share=1.0 / (1.0 + math.exp(-margin)))
    loss.backward()
    assert loss.item() == pytest.approx(0.0, abs=1e-12)
    assert float(own.grad.abs().max()) <= 1e-12 and float(other.grad.abs().max()) <= 1e-12


def test_lean_target_adds_to_the_anchor_and_takes_nothing_without_a_side_pair():
    """Both terms on: the anchor's loss plus the target's, each metric its own. Only the name pair (d = 0): the
    target's loss and gradient are 0 and its margin NaN."""
    import torch

    from tests.daily_rl.reward.test_lean_anchor import OLD, WEIGHT, hand_lean

    own = torch.tensor(sp.OWN_LOGP, dtype=torch.float64, requires_grad=True)
    loss, metrics, _ = torch_target(own, old=OLD, weight=WEIGHT)
    anchor, lean, _, _ = hand_lean()
    assert loss.item() == pytest.approx(anchor + hand_target()[0], rel=1e-12)
    assert metrics["side_lean"] == pytest.approx(lean, rel=1e-12)

    own = torch.tensor(sp.OWN_LOGP, dtype=torch.float64, requires_grad=True)
    loss, metrics, other = torch_target(own, directions=[0.0, 0.0, 0.0])
    loss.backward()
    assert loss.item() == 0.0 and math.isnan(metrics["side_lean_margin"])
    assert float(own.grad.abs().max()) == 0.0 and float(other.grad.abs().max()) == 0.0


def test_lean_target_by_hand_mlx():
    """The mlx mirror against the same figures, in float32: loss and both rows' gradients as one vector, and M."""
    mx = pytest.importorskip("mlx.core")
    from outcome_flywheel.models.mlx.losses import side_lean_loss

    rest = (mx.array(sp.OTHER_MASK), mx.array(sp.DIRECTIONS), None, 0.0, SHARE, MU)
    got = sp.mlx_loss_and_grads(side_lean_loss, *rest)
    expected, margin, hand_own, hand_other = hand_target()
    # float32: each value within a few ulps (2^-23 relative) of the float64 figure; the KL's two logs of ~0.3-0.7
    # subtract to ~0.1, which costs about a digit of relative precision on the loss
    assert got == pytest.approx(sp.hand_vector(expected, hand_own, hand_other), rel=1e-5, abs=1e-7)
    own, fixed = mx.array(sp.OWN_LOGP), (mx.array(sp.OWN_MASK), mx.array([0, 1, 2]))
    metric = side_lean_loss(own, *fixed, mx.array(sp.OTHER_LOGP), *rest)[1]["side_lean_margin"]
    assert metric.item() == pytest.approx(margin, rel=1e-6)


def _example(direction: int, coefficient: float) -> GSPOExample:
    pair = Counterfactual([True], [1], [True], coefficient, direction)
    return GSPOExample([{"role": "user", "content": "x"}], [1], [0.0], 0.0, [0.0], "price", pair)


def test_the_share_counts_side_pairs_where_long_did_better_with_one_win_and_one_loss_added():
    """Long better: own long with c > 0 or own short with c < 0. Name pairs (d = 0), ties (c = 0) and notes
    without a pair do not count; none left: None (the target is off for the update)."""
    examples = [_example(1, 0.4), _example(-1, -0.2), _example(-1, 0.3), _example(1, 0.0), _example(0, 0.5)]
    examples.append(replace(examples[0], counterfactual=None))
    assert long_win_share(examples) == pytest.approx((2 + 1) / (3 + 2), rel=1e-15)
    assert long_win_share([_example(1, 0.4)] * 4) == pytest.approx(5 / 6, rel=1e-15)  # not 1: a finite margin
    assert long_win_share(examples[3:]) is None


LEAN_TERMS = ("side_lean_anchor", "side_lean_target")


@pytest.mark.parametrize("name", LEAN_TERMS)
@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf")])
def test_a_lean_term_refuses_a_negative_or_non_finite_weight(name, bad):
    with pytest.raises(ValueError, match=name):
        GSPOConfig(counterfactual_form="pair", **{name: bad})


@pytest.mark.parametrize("name", LEAN_TERMS)
def test_a_lean_term_wants_a_pair_form(name):
    with pytest.raises(ValueError, match=f"{name} .*counterfactual_form 'pair' or 'centered_pair'"):
        GSPOConfig(counterfactual_form="probability", **{name: 1.0})
    assert getattr(GSPOConfig(counterfactual_form="centered_pair", **{name: 1.0}), name) == 1.0


# -- the trainer ------------------------------------------------------------------------------
HEADLINES = [
    ("Meta beats estimates", "Revenue rose."),
    ("Meta raises guidance", "Margins widened."),
    ("Meta expands buyback", "Cash grew."),
    ("Meta wins contract", "Orders rose."),
]


@pytest.mark.parametrize("framework", ["torch", "mlx"])
def test_the_target_takes_the_mean_side_margin_toward_the_outcomes_lean(tiny_model_dir, framework):
    """Four long calls, one outcome everywhere, chosen against the base's lean (long lost where the base leans
    long, won where it leans short), so p = 1/6 or 5/6 and logit(p) lies across 0 from the base's mean margin.
    The centred pair alone cannot move the mean (its loss is blind to it); with the target the mean margin moves
    toward logit(p) and further than without it, and every step reports M and p."""
    from outcome_flywheel.models.train.gspo import train_gspo

    probe = sp.long_calls(tiny_model_dir, [(headline, 2.0) for headline in HEADLINES])
    base_margins = sp.long_margins(sp.policy_on(framework, tiny_model_dir), probe)
    base = float(base_margins.mean())
    vs_spy = -2.0 if base > 0 else 2.0
    examples = sp.long_calls(tiny_model_dir, [(headline, vs_spy) for headline in HEADLINES])
    share = 1 / 6 if vs_spy < 0 else 5 / 6
    goal = math.log(share / (1 - share))
    plain = sp.term_only("centered_pair", 6, gradient_shares=False)
    distance = {}
    for name, config in (("plain", plain), ("target", replace(plain, side_lean_target=5.0))):
        policy = sp.policy_on(framework, tiny_model_dir)
        stats = train_gspo(policy, examples, config)
        distance[name] = abs(float(sp.long_margins(policy, examples).mean()) - goal)
        if name == "target":
            assert stats.extra["side_lean_share"] == pytest.approx([share] * stats.steps, rel=1e-12)
            margins = stats.extra["side_lean_margin"]
            assert len(margins) == stats.steps == 12 and all(math.isfinite(m) for m in margins), margins
            # the first step reads the base's own margins, the mean over its minibatch of two of the four calls
            firsts = [(a + b) / 2 for i, a in enumerate(base_margins) for b in base_margins[i + 1 :]]
            assert min(abs(margins[0] - m) for m in firsts) < 1e-3, (margins[0], firsts)
        else:
            assert "side_lean_margin" not in stats.extra
    start = abs(base - goal)
    assert distance["target"] < start - 0.05, (base, goal, distance)
    assert distance["target"] < distance["plain"] - 0.05, (base, goal, distance)


def test_the_days_record_keeps_the_first_and_last_margin_that_a_step_read():
    """`price_training`'s side_lean_margin_first / _last: the first and last finite step values (a step whose
    minibatch had no side pair reports NaN and is skipped); NaN where the target was off."""
    from types import SimpleNamespace

    from outcome_flywheel.daily_rl.reward.training_record import step_mean, step_value

    stats = SimpleNamespace(extra={"side_lean_margin": [float("nan"), 0.8, 0.1, -0.4, float("nan")]})
    assert step_value(stats, "side_lean_margin", 0) == 0.8 and step_value(stats, "side_lean_margin", -1) == -0.4
    assert math.isnan(step_value(SimpleNamespace(extra={}), "side_lean_margin", 0))
    assert math.isnan(step_value(None, "side_lean_margin", -1))
    assert step_mean(SimpleNamespace(extra={"side_lean_share": [0.25, 0.25]}), "side_lean_share") == 0.25
