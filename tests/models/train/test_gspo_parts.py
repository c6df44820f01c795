"""Each reward part's pull on the update, measured (`gradient_shares`), and the span parts' trust region
(`span_epochs`): both in `models/train/gspo.py`, on tiny-local in torch."""

import math

import pytest

from outcome_flywheel.models.interface import LoraSettings, SamplingConfig
from outcome_flywheel.models.prompts import trading_note_messages
from outcome_flywheel.models.train.gspo import train_gspo
from outcome_flywheel.models.train.gspo_config import GSPOConfig, GSPOExample

PROMPTS = [trading_note_messages("Nvidia beats estimates", "Revenue rose.")]


def _examples(policy, note: float, relevance: float, price: float) -> list[GSPOExample]:
    """4 judged notes (note part per sequence, relevance on their first 3 tokens) and the same 4 as matured
    notes (price on their first 3 tokens), with advantages +-1 times the given scales."""
    (group,) = policy.sample(PROMPTS, 4, SamplingConfig(max_new_tokens=24), seeds=[1])
    out = []
    for j, s in enumerate(group):
        sign = 1.0 if j % 2 else -1.0
        n = len(s.token_ids)
        span = [relevance * sign if t < 3 else 0.0 for t in range(n)]
        out.append(GSPOExample(PROMPTS[0], s.token_ids, s.logprobs, note * sign, span, "relevance"))
        span = [price * sign if t < 3 else 0.0 for t in range(n)]
        out.append(GSPOExample(PROMPTS[0], s.token_ids, s.logprobs, 0.0, span, "price"))
    return out


def _config(**kw) -> GSPOConfig:
    return GSPOConfig(batch_size=8, learning_rate=1e-3, lora=LoraSettings(r=4, alpha=8), temperature=0.8, **kw)


def test_gradient_shares_are_each_parts_share_and_zero_for_a_part_without_advantages(tiny_model_dir):
    from outcome_flywheel.models.torch.backend import TorchBackend

    policy = TorchBackend(tiny_model_dir, device="cpu")
    stats = train_gspo(policy, _examples(policy, 1.0, 1.0, 1.0), _config(epochs=1))
    shares = {p: stats.extra[f"grad_share_{p}"] for p in ("note", "relevance", "price")}
    assert sum(shares.values()) == pytest.approx(1.0, rel=1e-9) and all(v > 0 for v in shares.values())
    # the relevance and price parts sit on the same tokens of the same notes with the same advantages: the
    # same gradient, so the same share (up to the float32 sums of two identical computations)
    assert shares["relevance"] == pytest.approx(shares["price"], rel=1e-4)
    policy = TorchBackend(tiny_model_dir, device="cpu")
    stats = train_gspo(policy, _examples(policy, 1.0, 0.0, 0.0), _config(epochs=1))
    assert stats.extra["grad_share_note"] == 1.0 and stats.extra["grad_norm_price"] == 0.0
    policy = TorchBackend(tiny_model_dir, device="cpu")
    stats = train_gspo(policy, _examples(policy, 1.0, 1.0, 1.0), _config(epochs=1, gradient_shares=False))
    assert not any(k.startswith("grad_share") for k in stats.extra)


def test_per_part_normalisers_divide_each_part_by_its_own_tokens(tiny_model_dir):
    """`per_part`: each part's advantages x Z / (its tokens in the minibatch), so a part spanning one token a
    note weighs its share like the note part spanning all of them; the price's share of the gradient rises."""
    from outcome_flywheel.models.torch.backend import TorchBackend
    from outcome_flywheel.models.train.batching import EncodedExample
    from outcome_flywheel.models.train.gspo import part_scales

    judged = EncodedExample([1], [5, 6, 7, 8], [0.0] * 4, 1.0, token_advantages=[0.0, 0.2, 0.0, 0.0])
    matured = EncodedExample([1], [5, 6], [0.0] * 2, 0.0, token_advantages=[0.4, 0.0], token_part="price")
    batch = [judged, matured]
    assert part_scales(batch, 4, "shared") == {"note": 1.0, "relevance": 1.0, "price": 1.0}
    # Z = 2 sequences x 4 = 8; note: the judged note's 4 tokens, relevance 1 token, price 1 token
    assert part_scales(batch, 4, "per_part") == {"note": 2.0, "relevance": 8.0, "price": 8.0}
    shares = {}
    for normaliser in ("shared", "per_part"):
        policy = TorchBackend(tiny_model_dir, device="cpu")
        stats = train_gspo(policy, _examples(policy, 1.0, 1.0, 1.0), _config(epochs=1, part_normaliser=normaliser))
        shares[normaliser] = stats.extra["grad_share_price"]
    assert shares["per_part"] > 2 * shares["shared"], shares
    with pytest.raises(ValueError, match="part_normaliser"):
        GSPOConfig(part_normaliser="none")


def test_span_epochs_train_the_span_parts_in_the_first_epochs_only(tiny_model_dir):
    """Price only, 3 epochs, span_epochs 1: the first epoch's steps move the weights, the later ones have no
    gradient at all (their loss is 0: the span advantages are off and the note part is 0)."""
    from outcome_flywheel.models.torch.backend import TorchBackend

    policy = TorchBackend(tiny_model_dir, device="cpu")
    stats = train_gspo(policy, _examples(policy, 0.0, 0.0, 1.0), _config(epochs=3, span_epochs=1))
    steps = len(stats.grad_norms) // 3
    assert steps >= 1 and all(g > 0 for g in stats.grad_norms[:steps])
    assert all(g == 0.0 for g in stats.grad_norms[steps:])
    assert all(math.isclose(v, 0.0, abs_tol=0.0) for v in stats.losses[steps:])
    with pytest.raises(ValueError, match="span_epochs"):
        GSPOConfig(span_epochs=0)
