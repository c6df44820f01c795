"""The counterfactual name term: a judged call on another company than the headline's trains its name
against the headline's company's (relevance 0 and 1, known for every note), its rows
(`daily_rl/reward/counterfactual.name_counterfactual`), the judged examples that carry it
(`reward/examples.py`) and what it does in the trainer, in both frameworks."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from outcome_flywheel.daily_rl.reward.counterfactual import name_counterfactual
from tests.daily_rl.reward.side_pairs import policy_on
from tests.daily_rl.reward.test_counterfactual import NOTE, ON_APPLE, ON_META, action_probabilities, tokenizer  # noqa: F401


def _ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _rows(tokenizer, note, headline, c=1.0):
    ids = _ids(tokenizer, note)
    pair = name_counterfactual(tokenizer, ids, note, headline, c)
    if pair is None:
        return None
    own = tokenizer.decode([t for t, m in zip(ids, pair.own_mask) if m]).strip()
    other = tokenizer.decode(pair.other_response_ids, skip_special_tokens=True)
    swapped = tokenizer.decode([t for t, m in zip(pair.other_response_ids, pair.other_mask) if m]).strip()
    return own, other, swapped, pair


@pytest.mark.parametrize(
    ("written", "headline", "own", "other"),
    [
        ("Buy Meta.", ON_APPLE, "Meta", "Trade Recommendation: Buy Apple"),  # a name: the headline's name
        ("Buy NVDA shares.", ON_APPLE, "NVDA", "Trade Recommendation: Buy AAPL"),  # a ticker: the headline's ticker
        ("Buy Meta (META).", ON_APPLE, "Meta", "Trade Recommendation: Buy Apple"),  # the first mention decides
        ("Sell $NVDA.", ON_APPLE, "NVDA", "Trade Recommendation: Sell $AAPL"),  # the form is kept
        ("Buy META.", ON_APPLE, "META", "Trade Recommendation: Buy Apple"),  # "META" reads as the name Meta
        ("Buy Meta.", ("Goldman beats estimates", "Fees rose."), "Meta", "Trade Recommendation: Buy Goldman"),
        ("Buy Meta.", ("GS beats estimates", "Fees rose."), "Meta", "Trade Recommendation: Buy Goldman Sachs"),
    ],
)
def test_a_call_on_another_company_gets_the_headlines_company_teacher_forced(tokenizer, written, headline, own, other):
    note = NOTE.replace("Buy Meta.", written)
    got_own, got_other, swapped, pair = _rows(tokenizer, note, headline, c=2.0)
    assert (got_own, got_other) == (own, other)
    assert swapped and other.endswith(swapped) and swapped != own  # the other row's mask: the swapped mention
    first = pair.own_mask.index(True)
    assert pair.other_response_ids[:first] == _ids(tokenizer, note)[:first] and not any(pair.other_mask[:first])
    # relevance 0 for the own name, 1 for the headline's: c (0 - 1/2) on the own row
    assert pair.coefficient == pytest.approx(-1.0)


def test_a_call_on_the_headlines_company_gets_a_decoy_of_the_day_teacher_forced(tokenizer):
    """A call on the headline's company (relevance 1) against a decoy (relevance 0): the day's other headlines'
    companies, the one `pick` points at among those not on this headline; own +c/2, the decoy -c/2."""
    decoys = ["AAPL", "META", "NVDA"]
    for pick, other in ((0, "Trade Recommendation: Buy Apple"), (1, "Trade Recommendation: Buy Nvidia")):
        ids = _ids(tokenizer, NOTE)
        pair = name_counterfactual(tokenizer, ids, NOTE, ON_META, 2.0, decoys, pick)
        assert tokenizer.decode(pair.other_response_ids, skip_special_tokens=True) == other
        assert pair.coefficient == pytest.approx(1.0)
    ticker = NOTE.replace("Buy Meta.", "Buy META (META).")  # "META" reads as the name: the decoy's name
    pair = name_counterfactual(tokenizer, _ids(tokenizer, ticker), ticker, ON_META, 2.0, ["NVDA"], 7)
    assert tokenizer.decode(pair.other_response_ids, skip_special_tokens=True) == "Trade Recommendation: Buy Nvidia"


def test_no_name_term_without_a_decoy_a_company_a_side_a_tokenizer_or_a_weight(tokenizer):
    assert _rows(tokenizer, NOTE, ON_META) is None  # on the headline's company, and no decoy
    assert name_counterfactual(tokenizer, _ids(tokenizer, NOTE), NOTE, ON_META, 1.0, ["META"]) is None
    assert _rows(tokenizer, NOTE, ("Markets drift", "Nothing named.")) is None  # relevance undefined
    assert _rows(tokenizer, NOTE.replace("Buy Meta.", "No trade on Meta."), ON_APPLE) is None  # no side taken
    assert _rows(tokenizer, NOTE, ON_APPLE, c=0.0) is None
    assert name_counterfactual(None, _ids(tokenizer, NOTE), NOTE, ON_APPLE, 1.0) is None


def _judged(tokenizer, texts, headline, advantages, headline_id="h1"):
    ids = [_ids(tokenizer, t) for t in texts]
    rollouts = pd.DataFrame(
        {
            "date": "2025-11-07",
            "headline_id": headline_id,
            "rollout_index": range(len(texts)),
            "prompt": json.dumps([{"role": "user", "content": "x"}]),
            "response": texts,
            "response_ids": ids,
            "behavior_logprobs": [[-1.0] * len(i) for i in ids],
            "title": headline[0],
            "summary": headline[1],
        }
    )
    scores = pd.DataFrame(
        {
            "headline_id": headline_id,
            "rollout_index": range(len(texts)),
            "advantage": advantages,
            "relevance_advantage": advantages,
            "usable": True,
        }
    )
    return rollouts, scores


def test_judged_calls_carry_the_term_even_without_an_advantage(tokenizer):
    """Three notes on an Apple headline: a call on Apple, one on Meta, one on Meta with no advantage at all;
    a Nvidia headline's call on Nvidia. With name_c > 0 the Meta calls carry the term against Apple (the one
    without an advantage trains on it alone), the Apple call against the day's other company (Nvidia) and
    the Nvidia call against Apple; with name_c = 0 the note without an advantage is not an example."""
    from outcome_flywheel.daily_rl.reward.examples import day_companies, training_examples
    from outcome_flywheel.daily_rl.reward.signals import RewardConfig

    texts = [NOTE.replace("Meta", "Apple"), NOTE, NOTE.replace("Buy Meta.", "Sell Meta.")]
    apple = _judged(tokenizer, texts, ON_APPLE, [0.8, -0.8, 0.0])
    nvidia = _judged(tokenizer, [NOTE.replace("Meta", "Nvidia")], ("Nvidia wins a contract", ""), [0.5], "h2")
    rollouts, scores = (pd.concat([a, b], ignore_index=True) for a, b in zip(apple, nvidia))
    assert day_companies(rollouts) == ["AAPL", "NVDA"]
    args = dict(with_keys=True, reward=RewardConfig(), tokenizer=tokenizer)
    examples, keys = training_examples(rollouts, scores, name_c=0.5, **args)
    assert [k[1:] for k in keys] == [("h1", 0), ("h1", 1), ("h1", 2), ("h2", 0)]
    assert [e.counterfactual.coefficient for e in examples] == [0.25, -0.25, -0.25, 0.25]
    decoded = [_tail(tokenizer, e.counterfactual.other_response_ids) for e in examples]
    assert decoded == ["Buy Nvidia", "Buy Apple", "Sell Apple", "Buy Apple"]
    assert all(e.token_part == "relevance" for e in examples)
    plain, plain_keys = training_examples(rollouts, scores, **args)
    assert [k[1:] for k in plain_keys] == [("h1", 0), ("h1", 1), ("h2", 0)]
    assert all(e.counterfactual is None for e in plain)


def _tail(tokenizer, ids) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True).split(": ", 1)[1]


@pytest.mark.parametrize("framework", ["torch", "mlx"])
def test_the_term_moves_the_name_to_the_headlines_company(tiny_model_dir, tokenizer, framework):
    """Only the name term (no advantage anywhere), one epoch of two: the headline's company's name rises in
    the call's place and the sampled other name falls; the step reports the name's probabilities, and no
    side's (NaN: no example carries a side term)."""
    from outcome_flywheel.models.interface import LoraSettings
    from outcome_flywheel.models.prompts import trading_note_messages
    from outcome_flywheel.models.train.gspo import train_gspo
    from outcome_flywheel.models.train.gspo_config import GSPOConfig, GSPOExample

    policy = policy_on(framework, tiny_model_dir)
    prompt = trading_note_messages(*ON_APPLE)
    ids = _ids(tokenizer, NOTE)
    pair = name_counterfactual(tokenizer, ids, NOTE, ON_APPLE, 2.0)
    examples = [GSPOExample(prompt, ids, [0.0] * len(ids), 0.0, [0.0] * len(ids), "relevance", pair)] * 2
    before = action_probabilities(policy, prompt, examples[0])
    config = GSPOConfig(batch_size=2, epochs=2, learning_rate=5e-3, lora=LoraSettings(r=4, alpha=8))
    stats = train_gspo(policy, examples, config)
    after = action_probabilities(policy, prompt, examples[0])
    assert after[0] < before[0] and after[1] > before[1], (before, after)
    assert stats.extra["counterfactual_loss"][0] != 0.0 and stats.extra["counterfactual_loss"][1] == 0.0
    assert stats.extra["name_probability_own"][0] == pytest.approx(before[0], rel=1e-3)
    assert stats.extra["name_probability_other"][0] == pytest.approx(before[1], rel=1e-3)
    assert np.isnan(stats.extra["side_probability_own"][0])
    assert stats.extra["grad_share_counterfactual"] == 1.0


def test_relevance_counterfactual_c_is_checked():
    from outcome_flywheel.daily_rl.reward.credit import CreditConfig

    assert CreditConfig(relevance_counterfactual_c=0.5).relevance_counterfactual_c == 0.5
    for bad in (-1.0, float("nan"), float("inf"), True, "1"):
        with pytest.raises(ValueError, match="relevance_counterfactual_c must be a finite number >= 0"):
            CreditConfig(relevance_counterfactual_c=bad)
