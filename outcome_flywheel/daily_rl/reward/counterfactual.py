"""Counterfactual credit where the other action's reward is known without sampling it, so a decision trains
on both actions whichever was sampled (the term's formula and papers: `models/train/gspo_config.py`):

    -c sum_{a in {own, other}} pi(a | x, prefix) (R(a) - R_bar),   R_bar = (R(own) + R(other)) / 2

- the side of a matured call (`side_counterfactual`): vs_spy(other) = -vs_spy - 2 cost
  (`PriceReward.other_side`). Only calls on the headline's company take it: on another name the side's
  outcome says nothing about the headline (issue 46's probe: over every call, the term pulled calls off the
  company).
- the name of a judged call on another company than the headline's (`name_counterfactual`): relevance is 0
  for the written name and 1 for the headline's company, known for every note without a judge.

The other action's row is the note's own tokens up to the decision, then the other action's tokens
(teacher-forced: the trainer reads its probability, nothing samples it). A row is built only where the swap
is exact: the other action changes what the call parser reads as it should, and the tokens decode to the
swapped text.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from outcome_flywheel.daily_rl.notes.calls import call_part_spans, call_spans, parse_call
from outcome_flywheel.daily_rl.notes.companies import display_name, mentions
from outcome_flywheel.daily_rl.notes.relevance import call_relevance, headline_symbols
from outcome_flywheel.daily_rl.reward.signals import PriceReward
from outcome_flywheel.models.spans import chars_in_spans, token_char_ends
from outcome_flywheel.models.train.gspo_config import Counterfactual

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


def company_side_call(response: str, headline: tuple[Any, Any]):
    """The note's parsed call where it takes a side on the headline's company (`headline` = its title and
    summary), else None: only there does the side's outcome say something about the headline."""
    call = parse_call(response)
    on = call_relevance(headline[0], headline[1], call.symbol, call.parse_status) == 1.0
    return call if call.parse_status == "ok" and call.side in FLIP and on else None


def side_counterfactual(
    tokenizer: Any,
    response_ids: Sequence[int],
    response: str,
    headline: tuple[Any, Any],
    value: float,
    price: PriceReward,
    cost_bps: float,
    c: float,
) -> Counterfactual | None:
    """The two rows of a matured call's side term, or None where it has none: c = 0, no side phrase, a call
    on another company than the headline's (`headline` = its title and summary), a swap that does not flip
    the parsed side, or tokens that do not decode to the swapped text. `value`: the call's price signal (the
    replay weight already in `c`)."""
    if not c or tokenizer is None:
        return None
    call = company_side_call(response, headline)
    if call is None:
        return None
    spans = call_part_spans(response).get("side") or []
    if not spans:
        return None
    a, b = spans[0]
    other_phrase = opposite_phrase(response[a:b])
    if other_phrase is None or parse_call(response[:a] + other_phrase + response[b:]).side != FLIP[call.side]:
        return None
    rows = swapped_rows(tokenizer, response_ids, response, a, b, other_phrase)
    if rows is None:
        return None
    r_own, r_other = float(value), price.other_side(value, cost_bps)
    direction = 1 if call.side == "long" else -1
    return Counterfactual(*rows, coefficient=float(c) * (r_own - r_other) / 2.0, direction=direction)


def other_side_advantages(rows: Any, values: Sequence[float], price: PriceReward, cost_bps: float) -> np.ndarray:
    """The `other_side` price advantage of a group's notes (`rows`: rollout rows with `response`, `title`,
    `summary`; `values`: their price signals): A_i = p_i - p_i(other side) = 2 (p_i - R_bar_i), the sampled
    side against its own other side, whose outcome is known, for a call on the headline's company; 0 for the
    rest (no side, another company: what a side earns there says nothing about the headline). The group's
    baseline (`loo`) also credits the side with making a call at all, which relevance judges: beside notes
    without a company call every company call gets a positive advantage, and the side written more often
    gains the most (SmolLM2's notes drifted to Buy in both worlds, docs/models.md)."""
    out = np.zeros(len(values))
    for i, (r, value) in enumerate(zip(rows.itertuples(), values)):
        if company_side_call(r.response, (getattr(r, "title", None), getattr(r, "summary", None))) is not None:
            out[i] = float(value) - price.other_side(value, cost_bps)
    return out


def swapped_rows(
    tokenizer: Any, response_ids: Sequence[int], response: str, a: int, b: int, replacement: str
) -> tuple[list[bool], list[int], list[bool]] | None:
    """(own mask, other row, other mask) for the action written at `response[a:b]` and the one `replacement`
    would write there: the own mask covers the tokens that write [a, b); the other row is the note's tokens
    before them, then the tokens of the same text with `replacement` in its place, up to the end of those
    tokens (nothing after them). None where the tokens do not decode to `response` or the swap does not
    re-tokenise to the swapped text."""
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
    swapped = text[start:a] + replacement + text[b:end]
    other_ids = ids[:first] + [int(t) for t in tokenizer.encode(swapped, add_special_tokens=False)]
    if tokenizer.decode(other_ids, skip_special_tokens=True) != text[:start] + swapped:
        return None
    return [first <= t < last for t in range(len(ids))], other_ids, [t >= first for t in range(len(other_ids))]


def name_counterfactual(
    tokenizer: Any,
    response_ids: Sequence[int],
    response: str,
    headline: tuple[Any, Any],
    c: float,
    decoys: Sequence[str] = (),
    pick: int = 0,
) -> Counterfactual | None:
    """The two rows of a judged call's name term, or None where it has none: c = 0, a headline that names no
    known company, a note without a side, or a swap that is not exact. The name decision is the call line's
    first mention of the called symbol; the other action writes another company there in the same form (a
    name as the headline spells it, else the alias map's first name; a ticker form with the ticker), and
    must make the parser read a call on that company:
    - a call on another company (relevance 0) against the headline's first company (relevance 1): the own
      row's coefficient c (0 - 1/2), the other's +c/2;
    - a call on the headline's company (relevance 1) against a decoy (relevance 0): of `decoys` (the day's
      headlines' companies) those not on this headline, the one at `pick` mod their count; own +c/2, other
      -c/2; none without a decoy. The aim: a company pushed up on its own headlines is pushed down on others',
      so the pull is toward the headline's name, not toward a frequent headline's name everywhere (on tiny-local
      it did not stop that drift: docs/daily_rl.md, the ablation)."""
    if not c or tokenizer is None:
        return None
    call = parse_call(response)
    relevance = call_relevance(*headline, call.symbol, call.parse_status)  # None: the headline names no company
    if relevance is None or call.parse_status != "ok":
        return None
    companies = headline_symbols(*headline)
    others = [d for d in decoys if d not in companies]
    if relevance == 1.0 and not others:
        return None
    target = companies[0] if relevance == 0.0 else others[pick % len(others)]
    own = next(
        (
            (a + m0, a + m1, form)
            for a, b in call_spans(response)
            for m0, m1, sym, form in mentions(response[a:b])
            if sym == call.symbol
        ),
        None,
    )
    if own is None:
        return None
    a, b, form = own
    if form == "name":  # the headline's own spelling of its company, else the alias map's
        written = [
            t[m0:m1]
            for t in headline
            if isinstance(t, str)
            for m0, m1, sym, f in mentions(t)
            if sym == target and f == "name"
        ]
        replacement = written[0] if written else display_name(target)
    else:
        replacement = target
    swapped = parse_call(response[:a] + replacement + response[b:]) if replacement else None
    if swapped is None or swapped.parse_status != "ok" or swapped.symbol != target:
        return None
    rows = swapped_rows(tokenizer, response_ids, response, a, b, replacement)
    return None if rows is None else Counterfactual(*rows, coefficient=float(c) * (relevance - 0.5))
