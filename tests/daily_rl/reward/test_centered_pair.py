"""The counterfactual term's `centered_pair` form (issue 46): the pair loss on each side pair's margin toward
long less the minibatch's mean one, by hand in both frameworks, its blindness to a shift of every side margin,
and in the trainer: it widens the side's contrast between a headline where long won and one where it lost."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from tests.daily_rl.reward.side_pairs import (
    DIRECTIONS,
    OTHER_MASK,
    OWN_LOGP,
    OWN_MASK,
    action_sums,
    assert_torch_by_hand,
    hand_vector,
    long_calls,
    long_margins,
    mlx_loss_and_grads,
    own_leaf,
    policy_on,
    term_only,
    torch_rows,
)

COEF = [0.8, -0.3, 0.5]
DIRECTIONS = [1.0, -1.0, 0.0]
Z = 8.0


def hand_centered():
    """x_i = l_own,i - l_other,i; on side pairs x~_i = x_i - d_i mean_j(d_j x_j) (the mean over d != 0), on the
    name pair x~ = x; loss = -sum_i |c_i| log sigmoid(sign(c_i) x~_i) / Z. Gradient: g_i = dloss/dx~_i =
    -c_i sigmoid(-sign(c_i) x~_i) / Z; dloss/dx_j = g_j - d_j mean_i(d_i g_i) on side pairs, g_j on the name."""
    own, other = action_sums()
    x = [a - b for a, b in zip(own, other)]
    sides = [i for i, d in enumerate(DIRECTIONS) if d]
    mean = sum(DIRECTIONS[i] * x[i] for i in sides) / len(sides)
    xt = [v - d * mean for v, d in zip(x, DIRECTIONS)]
    loss = -sum(abs(c) * -math.log1p(math.exp(-math.copysign(1.0, c) * v)) for c, v in zip(COEF, xt)) / Z
    g = [-c / (1 + math.exp(math.copysign(1.0, c) * v)) / Z for c, v in zip(COEF, xt)]
    mean_g = sum(DIRECTIONS[i] * g[i] for i in sides) / len(sides)
    dx = [gj - d * mean_g for gj, d in zip(g, DIRECTIONS)]
    own_grad = [[v * m for m in mask] for v, mask in zip(dx, OWN_MASK)]
    other_grad = [[-v * m for m in mask] for v, mask in zip(dx, OTHER_MASK)]
    return loss, own_grad, other_grad


def torch_loss(own_logp, directions=DIRECTIONS):
    import torch

    from outcome_flywheel.models.torch.losses import side_pair_loss

    rows = torch_rows(own_logp)
    centring = None if directions is None else torch.tensor(directions, dtype=torch.float64)
    loss, _ = side_pair_loss(*rows, torch.tensor(COEF, dtype=torch.float64), Z, centring)
    return loss, rows[3]


def test_centered_pair_by_hand_torch():
    own = own_leaf()
    loss, other = torch_loss(own)
    assert_torch_by_hand(loss, own, other, *hand_centered())


def test_a_shift_of_every_side_margin_leaves_the_centred_loss_and_not_the_pairs():
    """m_i += delta on both side pairs (the own long's log-prob up, the own short's down): the centred loss is the
    same to float64's rounding of a few sums (1e-12 relative), the uncentred pair's moves; the gradient along
    that shift, sum_i d_i dloss/dx_i over the side pairs, is 0 to the same rounding."""
    import torch

    shifted = [row[:] for row in OWN_LOGP]
    for i, d in enumerate(DIRECTIONS):
        j = OWN_MASK[i].index(1)
        shifted[i][j] += 0.7 * d
    before, _ = torch_loss(torch.tensor(OWN_LOGP, dtype=torch.float64))
    after, _ = torch_loss(torch.tensor(shifted, dtype=torch.float64))
    assert after.item() == pytest.approx(before.item(), rel=1e-12)
    plain_before, _ = torch_loss(torch.tensor(OWN_LOGP, dtype=torch.float64), None)
    plain_after, _ = torch_loss(torch.tensor(shifted, dtype=torch.float64), None)
    assert abs(plain_after.item() - plain_before.item()) > 1e-3
    own = torch.tensor(OWN_LOGP, dtype=torch.float64, requires_grad=True)
    torch_loss(own)[0].backward()
    along = sum(d * own.grad[i, OWN_MASK[i].index(1)].item() for i, d in enumerate(DIRECTIONS))
    scale = max(abs(v) for v in own.grad.flatten().tolist())
    assert abs(along) <= 1e-12 * scale


def test_centered_pair_by_hand_mlx():
    """The mlx mirror against the same hand figures, in float32: loss and both rows' gradients as one vector."""
    mx = pytest.importorskip("mlx.core")
    from outcome_flywheel.models.mlx.losses import side_pair_loss

    got = mlx_loss_and_grads(side_pair_loss, mx.array(OTHER_MASK), mx.array(COEF), Z, mx.array(DIRECTIONS))
    # float32: each value within a few ulps (2^-23 relative) of the float64 figure
    assert got == pytest.approx(hand_vector(*hand_centered()), rel=1e-6, abs=1e-8)


# -- the trainer ------------------------------------------------------------------------------
BEAT = ("Meta beats estimates", "Revenue rose.")
MISS = ("Meta misses estimates", "Revenue fell.")


@pytest.mark.parametrize("framework", ["torch", "mlx"])
def test_the_centred_pair_widens_the_side_between_a_headline_where_long_won_and_one_where_it_lost(
    tiny_model_dir, framework
):
    """Only the counterfactual term (no advantage anywhere), one minibatch of both headlines' long calls: long
    won on the beat (vs_spy +2 %) and lost on the miss (-2 %). The centred pair raises the beat's long margin
    against the miss's; the term is the whole gradient."""
    from outcome_flywheel.models.train.gspo import train_gspo

    examples = long_calls(tiny_model_dir, ((BEAT, 2.0), (MISS, -2.0)))
    config = term_only("centered_pair", 2)
    policy = policy_on(framework, tiny_model_dir)
    before = long_margins(policy, examples)
    stats = train_gspo(policy, examples, config)
    after = long_margins(policy, examples)
    assert (after[0] - after[1]) - (before[0] - before[1]) > 0, (before, after)
    assert stats.extra["grad_share_counterfactual"] == 1.0 and stats.extra["grad_norm_price"] == 0.0
    assert all(term != 0.0 for term in stats.extra["counterfactual_loss"])
    # the same pair twice: its centred margin is 0 whatever the model says, so the term is 2 |c| log 2 / Z (Z = 2
    # sequences x the note's tokens), where the uncentred pair's would be the model's; float32 sums of a few
    # dozen log-probs of size ~1-10 leave x~ within ~1e-5 of 0, a relative 1e-5 on log 2
    twice = train_gspo(policy, [examples[0]] * 2, replace(config, epochs=1, counterfactual_epochs=1))
    expected = 2 * abs(examples[0].counterfactual.coefficient) * math.log(2) / (2 * len(examples[0].response_ids))
    assert twice.extra["counterfactual_loss"][0] == pytest.approx(expected, rel=1e-5)
