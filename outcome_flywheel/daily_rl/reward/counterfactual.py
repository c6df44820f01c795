"""Counterfactual credit for a matured call's side. Once a call has matured, what the opposite call would
have earned is known without sampling it (vs_spy(other) = -vs_spy - 2 cost: `PriceReward.other_side`), so
the side decision can train on both actions' rewards, whichever was sampled (the term's formula and papers:
`models/train/gspo_config.py`):

    -c sum_{a in {own, other}} pi(a | x, prefix) (R(a) - R_bar),   R_bar = (R(own) + R(other)) / 2

The other side's row is the note's own tokens up to its side phrase, then the opposite phrase's tokens
(teacher-forced: the trainer reads its probability, nothing samples it). Only calls on the headline's
company take the term: on another name the side's outcome says nothing about the headline (issue 46's
probe: over every call, the term pulled calls off the company). A row is built only where the swap is
exact: the opposite phrase flips what the call parser reads, and the tokens decode to the swapped text.
"""

from __future__ import annotations

from typing import Any, Sequence

from outcome_flywheel.daily_rl.notes.calls import call_part_spans, parse_call
from outcome_flywheel.daily_rl.notes.relevance import call_relevance
from outcome_flywheel.daily_rl.reward.signals import PriceReward
from outcome_flywheel.models.spans import chars_in_spans, token_char_ends
from outcome_flywheel.models.train.gspo_config import SideCounterfactual

# Each side phrase the parser reads (`notes.calls._LONG` / `_SHORT`) and a phrase that reads as the other side.
OPPOSITE = {
    "buy": "sell",
    "buying": "selling",
    "long": "short",
    "overweight": "underweight",
    "accumulate": "sell",
    "accumulating": "selling",
    "bullish": "bearish",
    "sell": "buy",
    "selling": "buying",
    "short": "long",
    "shorting": "buying",
    "underweight": "overweight",
    "bearish": "bullish",
}
FLIP = {"long": "short", "short": "long"}


def opposite_phrase(phrase: str) -> str | None:
    """The other side's phrase in the same case (`Buy` -> `Sell`, `LONG` -> `SHORT`); None if unknown."""
    other = OPPOSITE.get(phrase.lower())
    if other is None:
        return None
    if phrase.isupper() and len(phrase) > 1:
        return other.upper()
    return other.capitalize() if phrase[:1].isupper() else other


def side_counterfactual(
    tokenizer: Any,
    response_ids: Sequence[int],
    response: str,
    headline: tuple[Any, Any],
    value: float,
    price: PriceReward,
    cost_bps: float,
    c: float,
) -> SideCounterfactual | None:
    """The two rows of a matured call's side term, or None where it has none: c = 0, no side phrase, a call
    on another company than the headline's (`headline` = its title and summary), a swap that does not flip
    the parsed side, or tokens that do not decode to the swapped text. `value`: the call's price signal (the
    replay weight already in `c`)."""
    if not c or tokenizer is None:
        return None
    call = parse_call(response)
    if (
        call.parse_status != "ok"
        or call.side not in FLIP
        or call_relevance(headline[0], headline[1], call.symbol, call.parse_status) != 1.0
    ):
        return None
    spans = call_part_spans(response).get("side") or []
    if not spans:
        return None
    a, b = spans[0]
    other_phrase = opposite_phrase(response[a:b])
    if other_phrase is None or parse_call(response[:a] + other_phrase + response[b:]).side != FLIP[call.side]:
        return None
    ids = [int(t) for t in response_ids]
    chars = token_char_ends(tokenizer, ids)
    own = chars_in_spans(chars, [(a, b)])
    if not any(own):
        return None
    first, last = own.index(True), len(own) - own[::-1].index(True)  # the phrase's tokens, [first, last)
    start, end = chars[first][0], chars[last - 1][1]
    text = tokenizer.decode(ids, skip_special_tokens=True)
    if text != response or not start <= a < b <= end:  # offsets into another text than the parser read
        return None
    swapped = text[start:a] + other_phrase + text[b:end]
    tail = [int(t) for t in tokenizer.encode(swapped, add_special_tokens=False)]
    other_ids = ids[:first] + tail
    if tokenizer.decode(other_ids, skip_special_tokens=True) != text[:start] + swapped:
        return None
    r_own, r_other = float(value), price.other_side(value, cost_bps)
    return SideCounterfactual(
        own_mask=[first <= t < last for t in range(len(ids))],
        other_response_ids=other_ids,
        other_mask=[t >= first for t in range(len(other_ids))],
        coefficient=float(c) * (r_own - r_other) / 2.0,
    )
