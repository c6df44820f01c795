"""What the pair forms' tests share (`test_centered_pair.py`, `test_lean_anchor.py`): three hand-made pairs (two
sides, own long and own short, and one name pair), a long call on Meta, and the trainer's pieces around it."""

from __future__ import annotations

import numpy as np
import pytest

from outcome_flywheel.daily_rl.reward.counterfactual import side_counterfactual
from outcome_flywheel.daily_rl.reward.signals import PriceReward

OWN_LOGP = [[-0.5, -1.0, -0.25, 0.0], [-2.0, -0.1, -0.3, -0.7], [-0.9, -0.2, -1.1, -0.4]]
OWN_MASK = [[0, 1, 1, 0], [1, 0, 0, 0], [0, 0, 1, 0]]
OTHER_LOGP = [[-1.5, -3.0, -0.2], [-0.4, -0.9, -2.5], [-0.6, -1.7, -0.3]]
OTHER_MASK = [[0, 1, 0], [0, 1, 1], [1, 0, 0]]
DIRECTIONS = [1.0, -1.0, 0.0]  # +1 own long, -1 own short, 0 the name pair


def action_sums() -> tuple[list[float], list[float]]:
    """(l_own, l_other) of each pair: its action's log-probs summed over the action's tokens."""
    own = [sum(m * lp for m, lp in zip(mask, row)) for mask, row in zip(OWN_MASK, OWN_LOGP)]
    other = [sum(m * lp for m, lp in zip(mask, row)) for mask, row in zip(OTHER_MASK, OTHER_LOGP)]
    return own, other


def torch_rows(own_logp):
    """The framework loss's row arguments in float64 after `own_logp`: (own_logp, own mask, rows, other log-probs
    (a leaf that takes a gradient), other mask)."""
    import torch

    other = torch.tensor(OTHER_LOGP, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor(OWN_MASK, dtype=torch.float64)
    return own_logp, mask, torch.tensor([0, 1, 2]), other, torch.tensor(OTHER_MASK, dtype=torch.float64)


def own_leaf():
    """The own rows' log-probs as a float64 leaf that takes a gradient."""
    import torch

    return torch.tensor(OWN_LOGP, dtype=torch.float64, requires_grad=True)


def assert_torch_by_hand(loss, own, other, expected: float, own_grad, other_grad) -> None:
    """Backward from `loss`; it and both rows' gradients against the hand figures in float64 (a handful of sums,
    logs and exps a row, so 1e-12 relative is the arithmetic's)."""
    loss.backward()
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    assert own.grad.numpy() == pytest.approx(np.array(own_grad), rel=1e-12, abs=1e-15)
    assert other.grad.numpy() == pytest.approx(np.array(other_grad), rel=1e-12, abs=1e-15)


def mlx_loss_and_grads(loss_fn, *rest) -> np.ndarray:
    """`loss_fn(own_logp, own mask, rows, other_logp, *rest)`'s loss at the hand-made pairs and its gradients on
    both rows' log-probs, in mlx (float32), as one vector: the loss first (`hand_vector`'s order)."""
    import mlx.core as mx

    fixed = (mx.array(OWN_MASK), mx.array([0, 1, 2]))
    grad_fn = mx.value_and_grad(lambda own, other: loss_fn(own, *fixed, other, *rest)[0], argnums=(0, 1))
    loss, grads = grad_fn(mx.array(OWN_LOGP), mx.array(OTHER_LOGP))
    return np.concatenate([[loss.item()], *(np.array(g).ravel() for g in grads)])


def hand_vector(loss: float, own_grad, other_grad) -> np.ndarray:
    """The hand figures in `mlx_loss_and_grads`' order."""
    return np.concatenate([[loss], np.ravel(own_grad), np.ravel(other_grad)])


NOTE = (
    "Trade Recommendation: Buy Meta.\nRationale: The headline matters for Meta because demand is strong.\n"
    "Risk Factors: Rates may stay higher.\nTimeframe: 1-2 weeks.\nPosition Size: 1% of the portfolio.\n"
    "Stop Loss: 3% below entry."
)


def long_calls(tiny_model_dir, outcomes) -> list:
    """A price example of the long call `NOTE` per (headline, vs_spy %) of `outcomes`, carrying its side pair
    (c = 10, 4 bps), with no advantage anywhere: only the counterfactual term trains them."""
    from transformers import AutoTokenizer

    from outcome_flywheel.models.prompts import trading_note_messages
    from outcome_flywheel.models.train.gspo_config import GSPOExample

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = tokenizer(NOTE, add_special_tokens=False)["input_ids"]
    examples = []
    for headline, vs_spy in outcomes:
        value = PriceReward().value("matured", vs_spy)
        pair = side_counterfactual(tokenizer, ids, NOTE, headline, value, PriceReward(), 10.0, 4.0)
        assert pair.direction == 1 and (pair.coefficient > 0) == (vs_spy > 0)
        prompt = trading_note_messages(*headline)
        examples.append(GSPOExample(prompt, ids, [0.0] * len(ids), 0.0, [0.0] * len(ids), "price", pair))
    return examples


def term_only(form: str, epochs: int, **settings):
    """A `GSPOConfig` for the counterfactual term alone on `long_calls`: minibatches of 2 single notes, a small LoRA
    at a large learning rate, the term in every one of `epochs` epochs under `form`."""
    from outcome_flywheel.models.interface import LoraSettings
    from outcome_flywheel.models.train.gspo_config import GSPOConfig

    return GSPOConfig(
        **dict(batch_size=2, learning_rate=5e-3, lora=LoraSettings(r=4, alpha=8), share_prompt_prefix=False),
        **dict(epochs=epochs, counterfactual_epochs=epochs, counterfactual_form=form),
        **settings,
    )


def policy_on(framework: str, tiny_model_dir):
    """tiny-local in `framework`'s backend (mlx skips where it is not installed), its generator seeded at 0."""
    import pytest

    if framework == "mlx":
        pytest.importorskip("mlx.core")
        from outcome_flywheel.models.mlx.backend import MLXBackend

        policy = MLXBackend(tiny_model_dir)
    else:
        from outcome_flywheel.models.torch.backend import TorchBackend

        policy = TorchBackend(tiny_model_dir, device="cpu")
    policy.framework.seed(0)
    return policy


def long_margins(policy, examples) -> np.ndarray:
    """log pi(Buy) - log pi(Sell) at each long call's side (its other row is the short one)."""
    out = []
    for e in examples:
        pair = e.counterfactual
        prompt = policy.prompt_ids(e.prompt)
        logp, _ = policy.batch_logprobs([prompt] * 2, [e.response_ids, pair.other_response_ids], 1.0)
        logp = policy.framework.to_numpy(logp)
        own = sum(v for v, m in zip(logp[0], pair.own_mask) if m)
        out.append(own - sum(v for v, m in zip(logp[1], pair.other_mask) if m))
    return np.array(out)
