"""The judge prompt's token budget (docs/daily_rl.md, "The judge's prompt budget").

Eight notes of up to 512 tokens are 4,096 tokens before the headlines and the instructions: near
the whole context of small models, and past what a small judge reads well. One judge prompt gets
`budget = min(prompt_tokens, context - max_new_tokens)` tokens. What the template, headlines,
labels and instructions take comes first; the rest is shared among the notes max-min fairly
(water-filling): a note shorter than an equal share keeps every token, and what it leaves over is
shared equally by the longer ones, which are cut to the same length (a token prefix, marked
" ..."). Each note is cut once per group, for the first (largest) round, and shown the same way
in every round. The cut is recorded per note (`NoteCut`) and lands in `rollout_scores`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

CUT_MARK = " ..."
# BPE can merge across the seams between a note and its label; keep a token of slack per note.
SEAM_TOKENS = 1
MIN_NOTE_TOKENS = 8


@dataclass(frozen=True)
class NoteCut:
    """One note as the judge saw it."""

    text: str  # what the prompt shows
    tokens: int  # the note's length in tokens (whitespace collapsed)
    shown_tokens: int

    @property
    def truncated(self) -> bool:
        return self.shown_tokens < self.tokens


def fair_shares(lengths: Sequence[int], budget: int) -> list[int]:
    """Tokens each note may keep so that the total fits `budget`, max-min fairly: notes of at most
    the cap keep all their tokens, the rest are cut to the cap; the cap is the largest that fits."""
    lengths = [max(0, int(n)) for n in lengths]
    if sum(lengths) <= budget:
        return lengths
    budget = max(0, int(budget))
    remaining, left = budget, len(lengths)
    cap = 0
    for n in sorted(lengths):
        share = remaining // left
        if n <= share:
            remaining -= n
            left -= 1
            continue
        cap = share
        break
    return [min(n, cap) for n in lengths]


def prompt_budget(prompt_tokens: int, context_tokens: int | None, max_new_tokens: int) -> int:
    """Tokens one judge prompt may take: the configured budget, never past the model's context
    less the answer's room."""
    budget = int(prompt_tokens)
    if context_tokens:
        budget = min(budget, int(context_tokens) - int(max_new_tokens))
    return budget


def cut_notes(
    notes: Sequence[str],
    budget_for_notes: int,
    encode: Callable[[str], list[int]],
    decode: Callable[[Sequence[int]], str],
) -> list[NoteCut]:
    """Each note with whitespace collapsed, cut to its fair share of `budget_for_notes` tokens."""
    bodies = [" ".join(n.split()) for n in notes]
    ids = [encode(b) for b in bodies]
    room = budget_for_notes - len(notes) * SEAM_TOKENS
    if room < MIN_NOTE_TOKENS * len(notes):
        raise ValueError(
            f"the judge prompt budget leaves {budget_for_notes} tokens for {len(notes)} notes "
            f"(< {MIN_NOTE_TOKENS + SEAM_TOKENS} each): raise the judge's prompt_tokens or use a model with a longer context"
        )
    mark = len(encode(CUT_MARK))
    shares = fair_shares([len(i) for i in ids], room)
    out = []
    for body, tokens, share in zip(bodies, ids, shares):
        if share >= len(tokens):
            out.append(NoteCut(body, len(tokens), len(tokens)))
        else:
            keep = max(1, share - mark)  # the mark is part of the share
            out.append(NoteCut(decode(tokens[:keep]).rstrip() + CUT_MARK, len(tokens), keep))
    return out
