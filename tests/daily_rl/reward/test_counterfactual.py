"""The counterfactual side term (issue 46): the other side's known outcome, the teacher-forced other row of
a call on the headline's company (`daily_rl/reward/counterfactual.py`), the loss by hand in both frameworks,
and what it does in the trainer (`models/train/counterfactual.py`) and the delayed step (`matured.py`)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from outcome_flywheel.daily_rl.notes.calls import parse_call
from outcome_flywheel.daily_rl.reward.counterfactual import opposite_phrase, side_counterfactual
from outcome_flywheel.daily_rl.reward.matured import MaturedConfig, matured_batch
from outcome_flywheel.daily_rl.reward.signals import PriceReward

NOTE = (
    "Trade Recommendation: Buy Meta.\nRationale: The headline matters for Meta because demand is strong.\n"
    "Risk Factors: Rates may stay higher.\nTimeframe: 1-2 weeks.\nPosition Size: 1% of the portfolio.\n"
    "Stop Loss: 3% below entry."
)
ON_META = ("Meta beats estimates", "Revenue rose.")
ON_APPLE = ("Apple beats estimates", "iPhone sales rose.")


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_the_other_sides_signal_is_the_opposite_excess_return_less_the_second_cost():
    price = PriceReward(scale_pct=1.5)
    for vs_spy in (-3.0, -0.2, 0.0, 0.7, 4.0):
        value = price.value("matured", vs_spy)
        # vs_spy(other) = -vs_spy - 2 cost: 10 bps round trip = 0.1 percentage points each side
        assert price.other_side(value, 10.0) == pytest.approx(price.value("matured", -vs_spy - 0.2), rel=1e-9)
    assert price.other_side(price.value("matured", 0.0), 0.0) == pytest.approx(0.5)  # no cost, no move: a tie
    assert price.other_side(1.0, 10.0) == 0.0 and price.other_side(0.0, 10.0) == 1.0


def test_opposite_phrases_flip_the_side_and_keep_the_case():
    assert [opposite_phrase(w) for w in ("Buy", "SELL", "long", "Accumulate", "bearish")] == [
        "Sell",
        "BUY",
        "short",
        "Sell",
        "bullish",
    ]
    assert opposite_phrase("hold") is None


def test_a_company_call_gets_its_other_side_row_teacher_forced(tokenizer):
    ids = tokenizer(NOTE, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    value = PriceReward().value("matured", 1.2)
    pair = side_counterfactual(tokenizer, ids, NOTE, ON_META, value, PriceReward(), 10.0, 2.0)
    assert pair is not None
    assert tokenizer.decode([t for t, m in zip(ids, pair.own_mask) if m]).strip() == "Buy"
    other = tokenizer.decode(pair.other_response_ids, skip_special_tokens=True)
    assert other == "Trade Recommendation: Sell"  # the prefix, then the opposite phrase: nothing after it
    assert tokenizer.decode([t for t, m in zip(pair.other_response_ids, pair.other_mask) if m]).strip() == "Sell"
    first = pair.own_mask.index(True)
    assert pair.other_response_ids[:first] == ids[:first] and not any(pair.other_mask[:first])
    r_other = PriceReward().value("matured", -1.2 - 0.2)
    assert pair.coefficient == pytest.approx(2.0 * (value - r_other) / 2.0, rel=1e-9)
    assert pair.coefficient > 0 and pair.direction == 1  # the sampled long won: the term pushes its side up
    short = NOTE.replace("Buy", "Sell")
    short_ids = tokenizer(short, add_special_tokens=False)["input_ids"]
    flipped = side_counterfactual(tokenizer, short_ids, short, ON_META, 1 - value, PriceReward(), 10.0, 2.0)
    assert tokenizer.decode(flipped.other_response_ids) == "Trade Recommendation: Buy" and flipped.coefficient < 0
    assert flipped.direction == -1  # the sampled side is short: its margin toward long is l_other - l_own


def test_no_row_for_another_company_no_side_no_tokenizer_or_no_weight(tokenizer):
    ids = tokenizer(NOTE, add_special_tokens=False)["input_ids"]
    args = (0.7, PriceReward(), 10.0, 1.0)
    assert side_counterfactual(tokenizer, ids, NOTE, ON_APPLE, *args) is None  # a call on another name
    assert side_counterfactual(tokenizer, ids, NOTE, ("Markets drift", "Nothing named."), *args) is None
    assert side_counterfactual(None, ids, NOTE, ON_META, *args) is None
    assert side_counterfactual(tokenizer, ids, NOTE, ON_META, 0.7, PriceReward(), 10.0, 0.0) is None
    hold = "Trade Recommendation: Hold Meta.\nRationale: wait."
    hold_ids = tokenizer(hold, add_special_tokens=False)["input_ids"]
    assert side_counterfactual(tokenizer, hold_ids, hold, ON_META, *args) is None
    assert parse_call(hold).side == "none"


# -- the loss ---------------------------------------------------------------------------------
LOGP = [[-0.5, -1.0, -0.25, 0.0], [-2.0, -0.1, -0.3, -0.7]]
SIDE = [[0, 1, 1, 0], [1, 0, 0, 0]]
COEF = [0.8, -0.3]
Z = 8.0


def hand_side_loss():
    """-sum_i c_i exp(sum_t m_it logp_it) / Z and its gradient c_i p_i m_it / -Z."""
    p = [math.exp(sum(m * lp for m, lp in zip(mask, row))) for mask, row in zip(SIDE, LOGP)]
    loss = -sum(c * q for c, q in zip(COEF, p)) / Z
    grad = [[-c * q * m / Z for m in mask] for c, q, mask in zip(COEF, p, SIDE)]
    return loss, grad, p


def test_side_probability_loss_by_hand_torch():
    import torch

    from outcome_flywheel.models.torch.losses import side_probability_loss

    logp = torch.tensor(LOGP, dtype=torch.float64, requires_grad=True)
    loss, metrics = side_probability_loss(
        logp, torch.tensor(SIDE, dtype=torch.float64), torch.tensor(COEF, dtype=torch.float64), Z
    )
    loss.backward()
    expected, grad, p = hand_side_loss()
    # float64: two exps and a few sums, so 1e-12 relative is the arithmetic's
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    assert logp.grad.numpy() == pytest.approx(np.array(grad), rel=1e-12, abs=1e-15)
    assert metrics["side_probability"] == pytest.approx(np.mean(p), rel=1e-12)
    assert metrics["side_loss"] == pytest.approx(expected, rel=1e-12)


def test_side_probability_loss_by_hand_mlx():
    mx = pytest.importorskip("mlx.core")
    from outcome_flywheel.models.mlx.losses import side_probability_loss

    def f(logp):
        return side_probability_loss(logp, mx.array(SIDE), mx.array(COEF), Z)[0]

    logp = mx.array(LOGP)  # float32: mlx on the CPU has no float64 autograd here
    loss, grad = mx.value_and_grad(f)(logp)
    expected, hand_grad, p = hand_side_loss()
    # float32: each value within a few ulps (2^-23 relative) of the float64 figure
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert np.array(grad) == pytest.approx(np.array(hand_grad), rel=1e-6, abs=1e-8)
    _, metrics = side_probability_loss(logp, mx.array(SIDE), mx.array(COEF), Z)
    assert metrics["side_probability"].item() == pytest.approx(np.mean(p), rel=1e-6)


OTHER_LOGP = [[-1.5, -3.0, -0.2], [-0.4, -0.9, -2.5]]
OTHER_SIDE = [[0, 1, 0], [0, 1, 1]]


def hand_pair_loss():
    """-sum_i |c_i| log sigmoid(x_i) / Z, x_i = sign(c_i) (l_own,i - l_other,i), and its gradients: on the own
    row's side tokens -|c_i| sigmoid(-x_i) sign(c_i) / Z, on the other row's the opposite."""
    own = [sum(m * lp for m, lp in zip(mask, row)) for mask, row in zip(SIDE, LOGP)]
    other = [sum(m * lp for m, lp in zip(mask, row)) for mask, row in zip(OTHER_SIDE, OTHER_LOGP)]
    x = [math.copysign(1.0, c) * (a - b) for c, a, b in zip(COEF, own, other)]
    loss = -sum(abs(c) * -math.log1p(math.exp(-v)) for c, v in zip(COEF, x)) / Z
    pull = [-c * (1 / (1 + math.exp(v))) / Z for c, v in zip(COEF, x)]  # |c| sign(c) = c
    own_grad = [[g * m for m in mask] for g, mask in zip(pull, SIDE)]
    other_grad = [[-g * m for m in mask] for g, mask in zip(pull, OTHER_SIDE)]
    return loss, own_grad, other_grad


def test_side_pair_loss_by_hand_torch():
    import torch

    from outcome_flywheel.models.torch.losses import side_pair_loss

    own = torch.tensor(LOGP, dtype=torch.float64, requires_grad=True)
    other = torch.tensor(OTHER_LOGP, dtype=torch.float64, requires_grad=True)
    loss, metrics = side_pair_loss(
        own,
        torch.tensor(SIDE, dtype=torch.float64),
        torch.tensor([0, 1]),
        other,
        torch.tensor(OTHER_SIDE, dtype=torch.float64),
        torch.tensor(COEF, dtype=torch.float64),
        Z,
    )
    loss.backward()
    expected, own_grad, other_grad = hand_pair_loss()
    # float64: a log1p and an exp per row and a few sums, so 1e-12 relative is the arithmetic's
    assert loss.item() == pytest.approx(expected, rel=1e-12) and metrics["side_loss"] == pytest.approx(expected)
    assert own.grad.numpy() == pytest.approx(np.array(own_grad), rel=1e-12, abs=1e-15)
    assert other.grad.numpy() == pytest.approx(np.array(other_grad), rel=1e-12, abs=1e-15)


def test_side_pair_loss_by_hand_mlx():
    mx = pytest.importorskip("mlx.core")
    from outcome_flywheel.models.mlx.losses import side_pair_loss

    def f(own, other):
        args = (mx.array(SIDE), mx.array([0, 1]), other, mx.array(OTHER_SIDE), mx.array(COEF), Z)
        return side_pair_loss(own, *args)[0]

    loss, (own_grad, other_grad) = mx.value_and_grad(f, argnums=(0, 1))(mx.array(LOGP), mx.array(OTHER_LOGP))
    expected, hand_own, hand_other = hand_pair_loss()
    # float32: each value within a few ulps (2^-23 relative) of the float64 figure
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert np.array(own_grad) == pytest.approx(np.array(hand_own), rel=1e-6, abs=1e-8)
    assert np.array(other_grad) == pytest.approx(np.array(hand_other), rel=1e-6, abs=1e-8)


# -- the trainer ------------------------------------------------------------------------------
def _counterfactual_examples(tokenizer, coefficient: float):
    from outcome_flywheel.models.prompts import trading_note_messages
    from outcome_flywheel.models.train.gspo_config import GSPOExample

    prompt = trading_note_messages(*ON_META)
    ids = tokenizer(NOTE, add_special_tokens=False)["input_ids"]
    pair = side_counterfactual(tokenizer, ids, NOTE, ON_META, 0.75, PriceReward(), 10.0, 1.0)
    pair = type(pair)(pair.own_mask, pair.other_response_ids, pair.other_mask, coefficient)
    # no advantage at all: whatever moves the side is the counterfactual term
    return prompt, [GSPOExample(prompt, ids, [0.0] * len(ids), 0.0, [0.0] * len(ids), "price", pair)] * 2


def action_probabilities(policy, prompt, example) -> tuple[float, float]:
    """The probabilities of the example's own action and of the other one (its counterfactual rows)."""
    ids, pair = example.response_ids, example.counterfactual
    prompt_ids = policy.prompt_ids(prompt)
    logp, _ = policy.batch_logprobs([prompt_ids] * 2, [ids, pair.other_response_ids], 1.0)
    logp = policy.framework.to_numpy(logp)
    own = math.exp(sum(v for v, m in zip(logp[0], pair.own_mask) if m))
    other = math.exp(sum(v for v, m in zip(logp[1], pair.other_mask) if m))
    return own, other


@pytest.mark.parametrize("form", ["probability", "pair"])
@pytest.mark.parametrize("framework", ["torch", "mlx"])
def test_the_term_moves_the_side_the_known_outcomes_favour(tiny_model_dir, tokenizer, framework, form):
    """Only the counterfactual term, one epoch of three (counterfactual_epochs 1), in either form: a positive
    coefficient (the sampled side won) raises the sampled side's probability and lowers the other's; a negative
    one does the opposite; the later epochs' steps carry a zero term."""
    from outcome_flywheel.models.interface import LoraSettings
    from outcome_flywheel.models.train.gspo import train_gspo
    from outcome_flywheel.models.train.gspo_config import GSPOConfig

    if framework == "mlx":
        pytest.importorskip("mlx.core")
        from outcome_flywheel.models.mlx.backend import MLXBackend as Backend
    else:
        from outcome_flywheel.models.torch.backend import TorchBackend as Backend
    config = GSPOConfig(
        batch_size=2, epochs=3, learning_rate=5e-3, lora=LoraSettings(r=4, alpha=8), counterfactual_form=form
    )
    for coefficient in (1.0, -1.0):
        policy = Backend(tiny_model_dir) if framework == "mlx" else Backend(tiny_model_dir, device="cpu")
        policy.framework.seed(0)
        prompt, examples = _counterfactual_examples(tokenizer, coefficient)
        before = action_probabilities(policy, prompt, examples[0])
        stats = train_gspo(policy, examples, config)
        after = action_probabilities(policy, prompt, examples[0])
        direction = 1 if coefficient > 0 else -1
        assert direction * (after[0] - before[0]) > 0 and direction * (after[1] - before[1]) < 0, (before, after)
        terms = stats.extra["counterfactual_loss"]
        assert len(terms) == 3 and terms[0] != 0.0 and terms[1:] == [0.0, 0.0]
        # no advantage anywhere: the side term is the whole gradient (the others' are exactly 0)
        assert stats.extra["grad_share_counterfactual"] == 1.0 and stats.extra["grad_norm_price"] == 0.0
        assert stats.extra["side_probability_own"][0] == pytest.approx(before[0], rel=1e-3)
        assert stats.extra["side_probability_other"][0] == pytest.approx(before[1], rel=1e-3)


def test_sequence_objectives_refuse_the_term(tiny_model_dir, tokenizer):
    from outcome_flywheel.models.torch.backend import TorchBackend
    from outcome_flywheel.models.train.gspo import train_gspo
    from outcome_flywheel.models.train.gspo_config import GSPOConfig

    _, examples = _counterfactual_examples(tokenizer, 1.0)
    examples = [
        type(e)(e.prompt, e.response_ids, e.behavior_logprobs, 0.5, None, "price", e.counterfactual) for e in examples
    ]
    with pytest.raises(ValueError, match="counterfactual term trains with objective 'token'"):
        train_gspo(TorchBackend(tiny_model_dir, device="cpu"), examples, GSPOConfig(objective="gspo"))
    with pytest.raises(ValueError, match="counterfactual_epochs"):
        GSPOConfig(counterfactual_epochs=0)
    with pytest.raises(ValueError, match="counterfactual_form must be one of probability, pair, centered_pair"):
        GSPOConfig(counterfactual_form="logprob")
    with pytest.raises(ValueError, match="price_counterfactual_c"):
        MaturedConfig(counterfactual_c=-1.0)


# -- the delayed step -------------------------------------------------------------------------
def _company_group(tokenizer):
    """Four notes of one group on Meta's headline (long and short on Meta, long on Apple, no call) and their
    outcomes: Meta rose, so the long won and the short lost."""
    texts = [NOTE, NOTE.replace("Buy", "Sell"), NOTE.replace("Meta", "Apple"), "No view at all on this."]
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    notes = pd.DataFrame(
        {
            "date": "2025-11-07",
            "headline_id": "h1",
            "rollout_index": range(4),
            "prompt": '[{"role": "user", "content": "x"}]',
            "response": texts,
            "response_ids": ids,
            "behavior_logprobs": [[-1.0] * len(i) for i in ids],
            "temperature": 0.8,
            "policy_version": "2025-11-07@aaa",
            "title": ON_META[0],
            "summary": ON_META[1],
        }
    )
    vs = [1.5, -1.7, 0.4, np.nan]  # Meta rose: the long won, the short lost
    outcomes = pd.DataFrame(
        {
            "status": ["matured", "matured", "matured", "no_call"],
            "vs_spy_pct": vs,
            "parse_status": ["ok", "ok", "ok", "no_side"],
            "reason": [None, None, None, "no side"],
        }
    )
    return notes, outcomes, vs


def test_matured_company_calls_carry_the_term_and_others_do_not(tokenizer):
    """With c > 0 the two company calls carry the term (coefficient c (R - R_other) / 2, signs by their side's
    outcome), the others none; with c = 0 (off) no example carries it."""
    notes, outcomes, vs = _company_group(tokenizer)
    checkpoints = {"2025-11-07": "2025-11-07@aaa"}
    args = ("2025-11-10", "2025-11-07@aaa", checkpoints)
    config = MaturedConfig(counterfactual_c=0.5)
    batch = matured_batch(notes, outcomes, *args, config, 0.5, 0.8, tokenizer)
    by_index = {k[2]: e for k, e in zip(batch.example_keys, batch.examples)}
    price = config.price
    for i in (0, 1):
        value = price.value("matured", vs[i])
        expected = 0.5 * (value - price.other_side(value, config.cost_bps)) / 2
        assert by_index[i].counterfactual.coefficient == pytest.approx(expected, rel=1e-9)
    assert by_index[0].counterfactual.coefficient > 0 and by_index[1].counterfactual.coefficient < 0
    assert all(by_index[i].counterfactual is None for i in by_index if i >= 2)
    plain = matured_batch(notes, outcomes, *args, MaturedConfig(counterfactual_c=0.0), 0.5, 0.8, tokenizer)
    assert plain.example_keys == batch.example_keys and all(e.counterfactual is None for e in plain.examples)


def test_the_other_side_baseline_judges_a_company_calls_side_against_its_own_other_side(tokenizer):
    """`price_baseline: other_side`: a call on the headline's company gets p - p(other side) on its side
    tokens, whatever the rest of the group did; a call on another company and a note without a call get 0 and
    no example. The same holds for a replayed group (its stored signals, x the replay weight)."""
    from outcome_flywheel.daily_rl.reward.matured import MaturedBatch, replay_batch

    notes, outcomes, vs = _company_group(tokenizer)
    checkpoints = {"2025-11-07": "2025-11-07@aaa"}
    config = MaturedConfig(baseline="other_side", counterfactual_c=0.0)
    price = config.price
    values = [price.value("matured", v) for v in vs[:3]]
    expected = [v - price.other_side(v, config.cost_bps) for v in values[:2]] + [0.0, 0.0]
    assert expected[0] > 0 > expected[1]
    batch = matured_batch(notes, outcomes, "2025-11-10", "2025-11-07@aaa", checkpoints, config, 0.5, 0.8, tokenizer)
    assert [r["advantage"] for r in batch.ledger] == pytest.approx([0.5 * a for a in expected], rel=1e-9)
    assert [k[2] for k in batch.example_keys] == [0, 1]  # only the company calls carry a gradient
    for example, a in zip(batch.examples, expected):  # on the side's tokens ("Buy" / "Sell"), nowhere else
        on = [t for t, x in enumerate(example.token_advantages) if x]
        assert tokenizer.decode([example.response_ids[t] for t in on]).strip() in ("Buy", "Sell")
        assert [example.token_advantages[t] for t in on] == pytest.approx([0.5 * a] * len(on), rel=1e-6)
    stored = [*values, price.value("no_call", np.nan, "no_side")]
    replays = notes.assign(trained_on="2025-11-10", signal_value=stored)
    again = MaturedBatch()
    replay_batch(again, replays, "2025-11-11", "2025-11-10@bbb", checkpoints, config, 0.5, 0.8, tokenizer)
    weight = config.replay_decay
    assert [r["advantage"] for r in again.ledger] == pytest.approx([0.5 * weight * a for a in expected], rel=1e-9)


def test_the_memory_plan_counts_the_other_rows(tokenizer):
    """A part's cost holds the other-side rows its loss forwards beside its own (both alive until the backward)."""
    from dataclasses import replace

    from outcome_flywheel.models.train.batching import EncodedExample
    from outcome_flywheel.models.train.gspo import part_tokens
    from outcome_flywheel.models.train.memory import ForwardCosts

    _, examples = _counterfactual_examples(tokenizer, 1.0)
    e = examples[0]
    carrier = EncodedExample([1, 2, 3], e.response_ids, e.behavior_logprobs, 0.0, counterfactual=e.counterfactual)
    cost = part_tokens(ForwardCosts(None))  # every row runs its prompt: rows x the longest row
    assert cost([carrier]) == 2 * cost([replace(carrier, counterfactual=None)])
