"""What a preference completion's log-probability is taken over: the whole text, or line by line.

A rebalance plan is a header and a set of orders, one a line (`weighting.render_plan`). Read as
one response, an order's tokens are conditioned on the orders above it, and the few tokens that
set two baskets apart (a ticker, a size) share the sum with everything the model predicts from
the layout. Read line by line (`unit="line"`), every line is its own response to the same prompt
and a plan's log-probability is the sum over its lines: log pi(plan | x) = sum_l log pi(line_l | x).
A basket is then scored as its orders, each once, whatever else it holds; the same rule for DPO's
sequence log-probs (training) and for the style score (reading), so the score reads exactly the
contrast the pairs trained. `unit="sequence"` is plain DPO over the whole completion (what TRL's
DPOTrainer does with the exported pairs).

Plain Python: the torch and mlx trainers both lay their rows out with `flatten_segments`.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

COMPLETION_UNITS = ("line", "sequence")


def completion_segments(text: str, unit: str) -> list[str]:
    """The pieces of `text` scored as separate responses: its non-blank lines, or the text itself."""
    if unit not in COMPLETION_UNITS:
        raise ValueError(f"completion unit must be one of {COMPLETION_UNITS}, got {unit!r}")
    if unit == "sequence":
        return [text]
    lines = [line for line in text.split("\n") if line.strip()]
    return lines or [text]


def encode_segments(encode: Callable[[str], list[int]], text: str, unit: str) -> list[list[int]]:
    """Token ids of each segment, each encoded as a whole response (end-of-turn appended)."""
    return [encode(segment) for segment in completion_segments(text, unit)]


def flatten_segments(
    prompt_ids: Sequence[Sequence[Any]], segment_ids: Sequence[Sequence[Sequence[int]]]
) -> tuple[list[list[Any]], list[list[int]], list[int]]:
    """(prompts, responses, owner): one row per segment, each with its item's prompt (token ids, or
    chat messages for the scorer); `owner[row]` is the item the row's log-prob is summed into."""
    if len(prompt_ids) != len(segment_ids):
        raise ValueError("one prompt per item")
    prompts, responses, owner = [], [], []
    for item, (prompt, segments) in enumerate(zip(prompt_ids, segment_ids)):
        if not segments:
            raise ValueError(f"item {item} has no segments")
        for segment in segments:
            prompts.append(list(prompt))
            responses.append(list(segment))
            owner.append(item)
    return prompts, responses, owner
