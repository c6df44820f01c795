"""Credit where it is due: each part of a note's reward trains the tokens it judges (`signals.py`,
"credit"). The judged step's notes carry the `note` part on the whole note (one number, trained through
the sequence ratio: `models/train/gspo_config.py`) and the `relevance` part on the call's ticker (per
token); the matured step's notes carry the `price` part on the call's side.

The call's line is what the call parser reads (`notes.calls.call_spans`); within it the side phrase and
the named ticker (`notes.calls.call_part_spans`), mapped from characters to the response's tokens through
the tokenizer (`models.spans.span_token_mask`). Which span each call part trains is `CreditConfig`'s:
the price moves the side (which way the call bets) and relevance the name (which company it is on), so
neither part's noise lands on the decision the other one judges. A note that takes no side anywhere has
no call line: relevance then judges the whole note (the missing call is the whole note's doing), and the
price, which has no side to credit, trains nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from outcome_flywheel.daily_rl.notes.calls import call_part_spans, call_spans
from outcome_flywheel.daily_rl.reward.signals import RewardConfig, token_advantages
from outcome_flywheel.models.spans import span_token_mask

SPANS = ("side", "ticker", "call")
# What the relevance advantage is measured against (`rollout_scores.relevance_advantages`).
RELEVANCE_BASELINES = ("group", "day")


@dataclass(frozen=True)
class CreditConfig:
    """Which tokens each call part trains, and the baseline of relevance's advantage."""

    price_span: str = field(
        default="side",
        metadata={
            "help": "Tokens the price part trains: `side` (the long / short phrase of the call), `ticker` or `call` (the whole call line)."
        },
    )
    relevance_span: str = field(
        default="ticker",
        metadata={
            "help": "Tokens the relevance part trains: `ticker` (the named symbol), `side` or `call` (the whole call line)."
        },
    )

    relevance_baseline: str = field(
        default="group",
        metadata={
            "help": "The relevance advantage: `group` = (r - the group's mean) / its std, 0 for a group whose notes all call the same name; `day` = (r - the day's mean) / the day's std over every judged group (REINFORCE++'s batch baseline), so a group that calls only other names still learns."
        },
    )

    relevance_counterfactual_c: float = field(
        default=0.0,
        metadata={
            "help": "c of the counterfactual name term -c sum_a pi(a) (R(a) - R_bar) over a judged call's name and another (relevance 0 and 1): a call on another company against the headline's, one on the headline's company against a decoy, another headline's company of the day (reward/counterfactual.py); in the first `counterfactual_epochs` epochs; 0 = off, the default."
        },
    )

    def __post_init__(self):
        c = self.relevance_counterfactual_c
        if isinstance(c, bool) or not (isinstance(c, (int, float)) and 0.0 <= float(c) < float("inf")):
            raise ValueError(f"relevance_counterfactual_c must be a finite number >= 0, got {c!r}")
        for name in ("price_span", "relevance_span"):
            if getattr(self, name) not in SPANS:
                raise ValueError(f"{name} must be one of {', '.join(SPANS)}, got {getattr(self, name)!r}")
        if self.relevance_baseline not in RELEVANCE_BASELINES:
            raise ValueError(
                f"relevance_baseline must be one of {', '.join(RELEVANCE_BASELINES)}, got {self.relevance_baseline!r}"
            )


def call_token_mask(
    tokenizer: Any, response_ids: Sequence[int], response: str, span: str = "call"
) -> list[bool] | None:
    """True on the tokens of the note's call `span` (`side`, `ticker` or `call`, the whole line); None
    when the note has no call line, or when the mask would select no token (text that does not round-trip
    through the tokenizer, a call line with no side phrase)."""
    if span == "call":
        spans = call_spans(response)
    else:
        spans = call_part_spans(response).get(span, [])
    if not spans:
        return None
    mask = span_token_mask(tokenizer, response_ids, spans)
    return mask if any(mask) else None


def judged_token_advantages(
    reward: RewardConfig, n_tokens: int, relevance_advantage: float, call_mask: Sequence[bool] | None
) -> list[float]:
    """The judged step's span-scoped advantages: share(relevance) * A_relevance on its span, the whole note
    when there is no call line (the `note` part is the example's sequence advantage, share(note) * A_note)."""
    return token_advantages(n_tokens, [(reward.share("relevance"), relevance_advantage, call_mask)])


def price_token_advantages(n_tokens: int, price_part: float, span_mask: Sequence[bool] | None) -> list[float]:
    """The matured step's per-token advantages: the price part (share(price) * A_price * replay weight, as the
    ledger records it) on its span, 0 elsewhere; 0 everywhere when the note has no call line (nothing to credit)."""
    if span_mask is None:
        return [0.0] * int(n_tokens)
    return token_advantages(n_tokens, [(1.0, price_part, span_mask)])
