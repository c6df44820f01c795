"""Each torch file against its mlx mirror on the same inputs: `losses.py` (both losses, values,
metrics and gradients) and `training.py` (the loop: losses, gradient norms and weights after several
clipped AdamW steps). `sampling.py`'s filter: tests/models/mlx/test_mlx_backend.py; the backends' log-probs and
the trainers end to end on tiny-local: tests/models/mlx/test_mlx_backend.py, tests/models/mlx/test_mlx_training.py."""

from __future__ import annotations

import numpy as np
import pytest

from tests.mlx_fixtures import require_mlx
from tests.tolerances import gamma

require_mlx()

import mlx.core as mx  # noqa: E402
import mlx.nn as mnn  # noqa: E402
import torch  # noqa: E402

from outcome_flywheel.models.mlx import losses as mlx_losses  # noqa: E402
from outcome_flywheel.models.mlx import training as mlx_training
from outcome_flywheel.models.torch import losses as torch_losses  # noqa: E402
from outcome_flywheel.models.torch import training as torch_training

# Each mirror evaluates the same formula in fp32 on these hand-made inputs, a few dozen roundings
# deep (the token sums, a division, an exp, the clip, the sequences' mean): both lie within
# gamma(OPS) (tests/tolerances.py, Higham & Mary) of the exact value, relative to the magnitudes
# the formula combines (float64 here), so within twice that of each other. A wrong clip branch,
# weight or sign moves a value by ~1e-2 or more.
OPS = 7 + 5 + 10  # tokens + sequences + the per-sequence operations


def _bound(magnitude):
    return 2 * gamma(OPS) * np.asarray(magnitude, dtype=np.float64)


def _assert_same(t_loss, t_metrics, m_loss, m_metrics, magnitude):
    """Loss within `_bound(magnitude)`; every metric within the bound of its own size times the
    inputs' size (a ratio e^x errs by e^x |dx|, a mean of log-probs by its terms' size), counts and
    fractions exactly (no ratio lies within rounding of a threshold here)."""
    assert abs(t_loss.item() - m_loss.item()) <= _bound(magnitude)
    assert set(t_metrics) == set(m_metrics)
    for k in t_metrics:
        assert abs(t_metrics[k] - m_metrics[k].item()) <= _bound((1 + abs(t_metrics[k])) * magnitude), k


def _gspo_magnitudes(logp, old, mask, adv, behaviour=None):
    """Per sequence |A_i| w_i max(s_i, 1) (1 + mean_t |logp - old| + mean_t |logp|): what the loss
    (their mean) and its metrics are made of, w_i = exp(mean_t |old - behaviour|) for the TIS weight."""
    m = mask.astype(np.float64)
    t = m.sum(-1)
    x = ((logp - old) * m).sum(-1) / t
    w = np.exp((np.abs(old - behaviour) * m).sum(-1) / t) if behaviour is not None else 1.0
    size = 1 + (np.abs(logp - old) * m).sum(-1) / t + (np.abs(logp) * m).sum(-1) / t
    return np.abs(adv) * w * np.maximum(np.exp(x), 1.0) * size


def _gspo_inputs(shift: float):
    rng = np.random.default_rng(0)
    logp = rng.normal(-2.0, 0.5, size=(5, 7)).astype(np.float32)
    old = (logp + rng.normal(0, shift, size=logp.shape)).astype(np.float32)
    mask = np.ones_like(logp, dtype=bool)
    mask[1, 4:] = mask[3, 2:] = False
    adv = rng.normal(size=5).astype(np.float32)
    return logp, old, mask, adv


@pytest.mark.parametrize("objective", ["gspo", "reward_weighted"])
@pytest.mark.parametrize("shift", [0.01, 0.2])  # inside the clip band, and both clip branches active
def test_gspo_loss_matches_its_mirror(objective, shift):
    logp, old, mask, adv = _gspo_inputs(shift)
    eps = (0.05, 0.08)
    t_logp = torch.tensor(logp, requires_grad=True)
    t_loss, t_metrics = torch_losses.gspo_loss(
        t_logp, torch.tensor(old), torch.tensor(mask), torch.tensor(adv), *eps, objective
    )
    t_loss.backward()

    def m_fn(x):
        return mlx_losses.gspo_loss(x, mx.array(old), mx.array(mask), mx.array(adv), *eps, objective)

    m_loss, m_metrics = m_fn(mx.array(logp))
    magnitudes = _gspo_magnitudes(logp, old, mask, adv)
    _assert_same(t_loss, t_metrics, m_loss, m_metrics, magnitudes.mean())  # (was atol 1e-6, metrics 1e-5)
    m_grad = mx.grad(lambda x: m_fn(x)[0])(mx.array(logp))
    # d loss / d logp_it = -A_i s_i / (n T_i): entries of size magnitude_i / (n T_i) (was atol 1e-7)
    per_entry = magnitudes[:, None] / (len(adv) * mask.sum(-1, keepdims=True))
    assert (np.abs(np.array(m_grad) - t_logp.grad.numpy()) <= _bound(per_entry)).all()
    if shift > 0.1 and objective == "gspo":
        assert 0 < t_metrics["clip_fraction"] < 1


@pytest.mark.parametrize("objective", ["gspo", "reward_weighted"])
def test_gspo_loss_truncated_is_weight_matches_its_mirror(objective):
    """The TIS weight min(exp(mean_t(old - behaviour)), cap) is the same in both mirrors, and it truncates."""
    logp, old, mask, adv = _gspo_inputs(0.2)
    rng = np.random.default_rng(5)
    behaviour = (old - rng.normal(0.0, 1.5, size=(5, 1))).astype(np.float32)  # whole sequences shifted
    eps, cap = (0.05, 0.08), 1.5
    t_logp = torch.tensor(logp, requires_grad=True)
    t_loss, t_metrics = torch_losses.gspo_loss(
        t_logp, torch.tensor(old), torch.tensor(mask), torch.tensor(adv), *eps, objective, torch.tensor(behaviour), cap
    )
    t_loss.backward()

    def m_fn(x):
        return mlx_losses.gspo_loss(
            x, mx.array(old), mx.array(mask), mx.array(adv), *eps, objective, mx.array(behaviour), cap
        )

    m_loss, m_metrics = m_fn(mx.array(logp))
    magnitudes = _gspo_magnitudes(logp, old, mask, adv, behaviour)
    magnitude = magnitudes.mean()
    _assert_same(t_loss, t_metrics, m_loss, m_metrics, magnitude)  # (was atol 1e-6, metrics 1e-5)
    m_grad = np.array(mx.grad(lambda x: m_fn(x)[0])(mx.array(logp)))
    per_entry = magnitudes[:, None] / (len(adv) * mask.sum(-1, keepdims=True))  # (was atol 1e-6)
    assert (np.abs(m_grad - t_logp.grad.numpy()) <= _bound(per_entry)).all()
    # By hand: each sequence's plain term times its truncated weight.
    plain, _ = torch_losses.gspo_loss(
        torch.tensor(logp), torch.tensor(old), torch.tensor(mask), torch.tensor(adv), *eps, objective
    )
    lengths = mask.sum(-1)
    ratio = np.exp(((old - behaviour) * mask).sum(-1) / lengths)
    assert (ratio > cap).any() and (ratio < cap).any()
    assert t_metrics["is_truncated_fraction"] == pytest.approx(float((ratio > cap).mean()))
    # fp32 exp of a fp32 mean of 7 differences, against float64: one implementation's gamma
    assert abs(t_metrics["is_ratio_max"] - float(ratio.max())) <= gamma(OPS) * ratio.max() * (
        1 + np.abs(np.log(ratio)).max()
    )
    per_seq = []
    for i in range(5):
        one, _ = torch_losses.gspo_loss(*(torch.tensor(x[i : i + 1]) for x in (logp, old, mask, adv)), *eps, objective)
        per_seq.append(one.item() * min(ratio[i], cap))
    # fp32 against a float64 mean of fp32 terms: within one implementation's bound (was rel=1e-5)
    assert abs(t_loss.item() - float(np.mean(per_seq))) <= _bound(magnitude) / 2
    assert abs(t_loss.item() - plain.item()) > 1e-3  # the weight changed the loss


def test_gspo_loss_refuses_an_unknown_objective_in_both():
    logp, old, mask, adv = _gspo_inputs(0.01)
    with pytest.raises(ValueError):
        torch_losses.gspo_loss(
            torch.tensor(logp), torch.tensor(old), torch.tensor(mask), torch.tensor(adv), objective="ppo"
        )
    with pytest.raises(ValueError):
        mlx_losses.gspo_loss(mx.array(logp), mx.array(old), mx.array(mask), mx.array(adv), objective="ppo")


@pytest.mark.parametrize("mean_weight", [None, 0.8])
def test_weighted_dpo_loss_matches_its_mirror(mean_weight):
    rng = np.random.default_rng(1)
    pc, pr, rc, rr = (rng.normal(-30, 5, size=6).astype(np.float32) for _ in range(4))
    w = rng.uniform(0.3, 3.0, size=6).astype(np.float32)
    t_pc, t_pr = torch.tensor(pc, requires_grad=True), torch.tensor(pr, requires_grad=True)
    t_loss, t_metrics = torch_losses.weighted_dpo_loss(
        t_pc, t_pr, *(torch.tensor(x) for x in (rc, rr, w)), 0.1, mean_weight
    )
    t_loss.backward()

    def m_fn(a, b):
        return mlx_losses.weighted_dpo_loss(a, b, *(mx.array(x) for x in (rc, rr, w)), 0.1, mean_weight)

    m_loss, m_metrics = m_fn(mx.array(pc), mx.array(pr))
    # The margin beta ((pc - rc) - (pr - rr)) rounds relative to beta (|pc - rc| + |pr - rr|), the
    # rest (softplus, weights, the mean over 6) relative to the loss: magnitude per pair
    # (w / W) (l + beta (|pc - rc| + |pr - rr|)); each gradient entry (w / W) beta sigmoid(-m) times
    # (1 + that margin size) (was atol 1e-6 on the loss, 1e-5 on metrics, 1e-7 on gradients).
    spread = 0.1 * (np.abs(pc - rc) + np.abs(pr - rr)).astype(np.float64)
    margin = 0.1 * ((pc - rc) - (pr - rr)).astype(np.float64)
    share = w / (w.sum() if mean_weight is None else len(w) * mean_weight)
    magnitude = float((share * (np.logaddexp(0, -margin) + spread + 1.0)).sum())
    _assert_same(t_loss, t_metrics, m_loss, m_metrics, magnitude)
    g_pc, g_pr = mx.grad(lambda a, b: m_fn(a, b)[0], argnums=(0, 1))(mx.array(pc), mx.array(pr))
    per_entry = _bound(share * 0.1 / (1 + np.exp(margin)) * (1 + spread))
    assert (np.abs(np.array(g_pc) - t_pc.grad.numpy()) <= per_entry).all()
    assert (np.abs(np.array(g_pr) - t_pr.grad.numpy()) <= per_entry).all()


# -- training.py: the loop ------------------------------------------------------------------------
def _regression_batches(steps: int = 4):
    rng = np.random.default_rng(2)
    return [
        (rng.normal(size=(3, 4)).astype(np.float32), rng.normal(size=(3, 2)).astype(np.float32)) for _ in range(steps)
    ]


def test_training_loop_matches_its_mirror():
    """The same linear model, batches and AdamW settings: the same loss, pre-clip gradient norm and
    metric at every step (the clip at 0.5 is active), and the same weights after."""
    rng = np.random.default_rng(3)
    weight, bias = rng.normal(size=(2, 4)).astype(np.float32), rng.normal(size=2).astype(np.float32)
    batches = _regression_batches()

    t_model = torch.nn.Linear(4, 2)
    with torch.no_grad():
        t_model.weight.copy_(torch.tensor(weight))
        t_model.bias.copy_(torch.tensor(bias))

    def t_loss(model, batch):
        x, y = (torch.tensor(a) for a in batch)
        pred = model(x)
        return ((pred - y) ** 2).mean(), {"mean_pred": float(pred.detach().mean())}

    m_model = mnn.Linear(4, 2)
    m_model.update({"weight": mx.array(weight), "bias": mx.array(bias)})

    def m_loss(model, batch):
        x, y = (mx.array(a) for a in batch)
        pred = model(x)
        return ((pred - y) ** 2).mean(), {"mean_pred": mx.stop_gradient(pred).mean()}

    t_stats = torch_training.train(
        t_model, torch_training.adamw(t_model, 0.05), loss=t_loss, iterate_batches=batches, max_grad_norm=0.5
    )
    m_stats = mlx_training.train(
        m_model, mlx_training.adamw(m_model, 0.05), loss=m_loss, iterate_batches=batches, max_grad_norm=0.5
    )
    assert t_stats.steps == m_stats.steps == len(batches)
    # Not a bound derived end to end: the trajectories' rounding passes through AdamW's normalised
    # update m / sqrt(v). On these O(1) random batches no gradient entry is near zero, so each step
    # carries the gradient's relative rounding, 2 gamma(12) ~ 4e-6 (sums of 3 x 4 terms, the mean),
    # times lr 0.05 into the weights; 1e-5 over 4 steps admits a cancellation factor of ~10 per
    # entry. A wrong clip, bias correction or weight decay moves them by ~1e-2.
    np.testing.assert_allclose(m_stats.losses, t_stats.losses, atol=1e-5)
    np.testing.assert_allclose(m_stats.grad_norms, t_stats.grad_norms, rtol=1e-5)
    assert max(t_stats.grad_norms) > 0.5  # the clip did something
    np.testing.assert_allclose(m_stats.extra["mean_pred"], t_stats.extra["mean_pred"], atol=1e-5)
    np.testing.assert_allclose(np.array(m_model.weight), t_model.weight.detach().numpy(), atol=1e-5)
    np.testing.assert_allclose(np.array(m_model.bias), t_model.bias.detach().numpy(), atol=1e-5)
    assert t_model.training and m_model.training  # both were in training mode before, and are again


def test_training_loop_restores_eval_mode_and_refuses_a_frozen_model():
    t_model, m_model = torch.nn.Linear(4, 2), mnn.Linear(4, 2)
    t_model.eval()
    m_model.eval()
    seen = []

    def t_loss(model, batch):
        seen.append(("torch", model.training))
        return model(torch.tensor(batch[0])).sum(), {}

    def m_loss(model, batch):
        seen.append(("mlx", model.training))
        return model(mx.array(batch[0])).sum(), {}

    torch_training.train(
        t_model, torch_training.adamw(t_model, 1e-3), loss=t_loss, iterate_batches=_regression_batches(1)
    )
    mlx_training.train(m_model, mlx_training.adamw(m_model, 1e-3), loss=m_loss, iterate_batches=_regression_batches(1))
    assert seen == [("torch", True), ("mlx", True)]
    assert not t_model.training and not m_model.training
    for p in t_model.parameters():
        p.requires_grad_(False)
    m_model.freeze()
    with pytest.raises(ValueError, match="no trainable parameters"):
        torch_training.adamw(t_model, 1e-3)
    with pytest.raises(ValueError, match="no trainable parameters"):
        mlx_training.adamw(m_model, 1e-3)


def test_array_round_trips_and_seeding_match_their_mirror():
    class Backend:
        device = torch.device("cpu")

    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert np.array_equal(torch_training.to_numpy(torch_training.as_array(Backend(), a)), a)
    assert np.array_equal(mlx_training.to_numpy(mlx_training.as_array(Backend(), a)), a)
    torch_training.seed(4)
    first = torch.rand(3)
    torch_training.seed(4)
    assert torch.equal(first, torch.rand(3))
    mlx_training.seed(4)
    first_mx = np.array(mx.random.uniform(shape=(3,)))
    mlx_training.seed(4)
    assert np.array_equal(first_mx, np.array(mx.random.uniform(shape=(3,))))
