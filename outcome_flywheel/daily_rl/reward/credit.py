"""Credit where it is due: each part of a note's reward trains the tokens it judges (`signals.py`,
"credit"). The judged step's notes carry the `note` part on the whole note (one number, trained through
the sequence ratio: `models/train/gspo_config.py`) and the `relevance` part on the trade call's line (per token);
the matured step's notes carry the `price` part on the call's line.

The call's line is what the call parser reads (`notes.calls.call_spans`), mapped from characters to the
response's tokens through the tokenizer (`models.spans.span_token_mask`). A note that takes no side
anywhere has no call line: a part about the call then judges the whole note (the missing call is the
whole note's doing).
"""

from __future__ import annotations

from typing import Any, Sequence

from outcome_flywheel.daily_rl.notes.calls import call_spans
from outcome_flywheel.daily_rl.reward.signals import RewardConfig, token_advantages
from outcome_flywheel.models.spans import span_token_mask


def call_token_mask(tokenizer: Any, response_ids: Sequence[int], response: str) -> list[bool] | None:
    """True on the tokens of the note's call line; None (the whole note) when it has none, or when
    the mask would select no token (text that does not round-trip through the tokenizer)."""
    spans = call_spans(response)
    if not spans:
        return None
    mask = span_token_mask(tokenizer, response_ids, spans)
    return mask if any(mask) else None


def judged_token_advantages(
    reward: RewardConfig, n_tokens: int, relevance_advantage: float, call_mask: Sequence[bool] | None
) -> list[float]:
    """The judged step's span-scoped advantages: share(relevance) * A_relevance on the call's line
    (the `note` part is the example's sequence advantage, share(note) * A_note)."""
    return token_advantages(n_tokens, [(reward.share("relevance"), relevance_advantage, call_mask)])


def price_token_advantages(n_tokens: int, price_part: float, call_mask: Sequence[bool] | None) -> list[float]:
    """The matured step's per-token advantages: the price part (share(price) * A_price, as the ledger
    records it) on the call's line, 0 elsewhere; on every token when the note has no call line."""
    return token_advantages(n_tokens, [(1.0, price_part, call_mask)])
