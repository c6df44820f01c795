"""The lean anchor (`side_lean_anchor`, issue 46): lambda (mean over the side pairs of d_i (x_i - x_old,i))^2, by hand
in both frameworks, 0 with no gradient where the day began, refused without a pair form, and in the trainer: it
holds back the move of every side margin that the pair term makes when long won everywhere."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.daily_rl.reward import side_pairs as sp

OLD = [1.0, -0.5, 3.0]  # x at pi_old
WEIGHT = 0.7


def hand_lean():
    """x_i = l_own,i - l_other,i; lean = mean over d != 0 of d_i (x_i - x_old,i); loss = w lean^2; dloss/dx_i =
    2 w lean d_i / n on the side pairs (n of them), 0 on the name pair; the own row's tokens take +dloss/dx_i, the
    other row's -dloss/dx_i."""
    own, other = sp.action_sums()
    sides = [i for i, d in enumerate(sp.DIRECTIONS) if d]
    lean = sum(sp.DIRECTIONS[i] * (own[i] - other[i] - OLD[i]) for i in sides) / len(sides)
    dx = [2 * WEIGHT * lean * d / len(sides) for d in sp.DIRECTIONS]
    own_grad = [[v * m for m in mask] for v, mask in zip(dx, sp.OWN_MASK)]
    other_grad = [[-v * m for m in mask] for v, mask in zip(dx, sp.OTHER_MASK)]
    return WEIGHT * lean**2, lean, own_grad, other_grad


def torch_lean(own_logp, old=OLD):
    import torch

    from outcome_flywheel.models.torch.losses import side_lean_loss

    rows = sp.torch_rows(own_logp)
    directions, start = (torch.tensor(v, dtype=torch.float64) for v in (sp.DIRECTIONS, old))
    loss, metrics = side_lean_loss(*rows, directions, start, WEIGHT)
    return loss, metrics, rows[3]


def test_lean_anchor_by_hand_torch():
    own = sp.own_leaf()
    loss, metrics, other = torch_lean(own)
    expected, lean, own_grad, other_grad = hand_lean()
    assert abs(lean) > 0.1  # the case moves: the figures below are not all zero
    sp.assert_torch_by_hand(loss, own, other, expected, own_grad, other_grad)
    assert metrics["side_lean"] == pytest.approx(lean, rel=1e-12)


def test_lean_anchor_is_zero_with_no_gradient_where_the_day_began():
    """x_old = x (the policy has not moved): loss 0 and every gradient 0; the name pair's x_old never counts."""
    import torch

    start = [a - b for a, b in zip(*sp.action_sums())]
    start[2] += 5.0  # the name pair's: left out of the lean
    own = torch.tensor(sp.OWN_LOGP, dtype=torch.float64, requires_grad=True)
    loss, metrics, other = torch_lean(own, start)
    loss.backward()
    assert loss.item() == pytest.approx(0.0, abs=1e-24)
    assert metrics["side_lean"] == pytest.approx(0.0, abs=1e-12)
    assert float(own.grad.abs().max()) <= 1e-12 and float(other.grad.abs().max()) <= 1e-12


def test_lean_anchor_by_hand_mlx():
    """The mlx mirror against the same figures, in float32: loss and both rows' gradients as one vector."""
    mx = pytest.importorskip("mlx.core")
    from outcome_flywheel.models.mlx.losses import side_lean_loss

    got = sp.mlx_loss_and_grads(side_lean_loss, mx.array(sp.OTHER_MASK), mx.array(sp.DIRECTIONS), mx.array(OLD), WEIGHT)
    expected, _, hand_own, hand_other = hand_lean()
    # float32: each value within a few ulps (2^-23 relative) of the float64 figure
    assert got == pytest.approx(sp.hand_vector(expected, hand_own, hand_other), rel=1e-6, abs=1e-8)


# -- the trainer ------------------------------------------------------------------------------
HEADLINES = [("Meta beats estimates", "Revenue rose."), ("Meta raises guidance", "Margins widened.")]


@pytest.mark.parametrize("framework", ["torch", "mlx"])
def test_the_anchor_holds_back_the_lean_the_pair_makes(tiny_model_dir, framework):
    """Long won on both headlines: the uncentred pair raises both long margins (a lean to Buy). With the anchor
    the same training moves their mean less; its first step starts at pi_old (lean 0) and it reports a lean on
    every step."""
    from outcome_flywheel.models.train.gspo import train_gspo

    examples = sp.long_calls(tiny_model_dir, [(headline, 2.0) for headline in HEADLINES])
    plain = sp.term_only("pair", 6, gradient_shares=False)
    moved = {}
    for name, config in (("plain", plain), ("anchored", replace(plain, side_lean_anchor=50.0))):
        policy = sp.policy_on(framework, tiny_model_dir)
        before = sp.long_margins(policy, examples)
        stats = train_gspo(policy, examples, config)
        moved[name] = float((sp.long_margins(policy, examples) - before).mean())
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
