"""The trainers' batching plans, written once for both frameworks: which examples go in which
minibatch, epoch after epoch, in which seeded order. Plain Python and NumPy.

One `random.Random(seed)` shuffles, epoch after epoch, either whole prompt groups (GSPO: a
headline's rollouts stay together, so a minibatch holds few distinct prompts and the shared
prompt prefix is run once) or single items (weighted DPO's pairs; GSPO with
`share_prompt_prefix=False`), then the order is cut into minibatches.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Any, Callable, Hashable, Sequence

import numpy as np


def batch_plan(
    keys: Sequence[Hashable], batch_size: int, epochs: int, seed: int, group_by_prompt: bool = True
) -> list[list[int]]:
    """Minibatches of item indices for `epochs` passes over `len(keys)` items.

    With `group_by_prompt`, items with equal keys form a group and whole groups are shuffled (in
    order of first appearance before the shuffle); else single items are. Distinct keys without
    grouping and with it give the same plan."""
    rng = random.Random(seed)
    size = max(1, int(batch_size))
    plan: list[list[int]] = []
    for _ in range(int(epochs)):
        if group_by_prompt:
            groups: dict[Hashable, list[int]] = {}
            for i, key in enumerate(keys):
                groups.setdefault(key, []).append(i)
            group_list = list(groups.values())
            rng.shuffle(group_list)
            order = [i for g in group_list for i in g]
        else:
            order = list(range(len(keys)))
            rng.shuffle(order)
        plan += [order[s : s + size] for s in range(0, len(order), size)]
    return plan


@dataclass
class EncodedExample:
    """One GSPO example as token ids: what the trainer feeds the forward passes."""

    prompt_ids: list[int]
    response_ids: list[int]
    behavior_logprobs: list[float]
    advantage: float
    index: int = -1  # position in the trainer's example list (per-example statistics)
    token_advantages: list[float] | None = None  # the span-scoped parts, per response token; None = none
    token_part: str = "relevance"  # which reward part the span-scoped advantages are (gradient shares)
    counterfactual: Any = None  # gspo_config.Counterfactual: the counterfactual term's rows (side or name); None = none
    name_mask: list[bool] | None = None  # the call's ticker tokens (the `ticker` KL span); None = no name
    sampled_length: int | None = None  # the response's length before `trim_unread_tail` cut it; None = not cut

    @property
    def length(self) -> int:
        """The sampled response's length: what Dr. GRPO's normaliser and the note part's tokens count."""
        return len(self.response_ids) if self.sampled_length is None else self.sampled_length

    def advantages_row(self) -> list[float]:
        """The span-scoped advantage of each response token (zeros when there is none)."""
        return list(self.token_advantages) if self.token_advantages is not None else [0.0] * len(self.response_ids)


def gspo_minibatches(
    examples: Sequence[Any], config: Any, prompt_ids: Callable[[Any], list[int]]
) -> list[list[EncodedExample]]:
    """The minibatches GSPO takes its steps on: the examples with a response, checked (one
    behaviour log-prob per token), tokenised (each distinct prompt once) and laid out by
    `batch_plan` from `config` (a `gspo_config.GSPOConfig`)."""
    cache: dict[str, list[int]] = {}
    encoded = []
    for position, ex in enumerate(examples):
        if not ex.response_ids:
            continue
        if len(ex.behavior_logprobs) != len(ex.response_ids):
            raise ValueError("behavior_logprobs must have one value per response token")
        token_advantages = getattr(ex, "token_advantages", None)
        if token_advantages is not None and len(token_advantages) != len(ex.response_ids):
            raise ValueError("token_advantages must have one value per response token")
        counterfactual = getattr(ex, "counterfactual", None)
        if counterfactual is not None and (
            len(counterfactual.own_mask) != len(ex.response_ids)
            or len(counterfactual.other_mask) != len(counterfactual.other_response_ids)
        ):
            raise ValueError("a counterfactual's masks must have one value per token of their rows")
        name_mask = getattr(ex, "name_mask", None)
        if name_mask is not None and len(name_mask) != len(ex.response_ids):
            raise ValueError("name_mask must have one value per response token")
        key = repr(ex.prompt)
        if key not in cache:
            cache[key] = prompt_ids(ex.prompt)
        encoded.append(
            trimmed(
                EncodedExample(
                    cache[key],
                    list(ex.response_ids),
                    list(ex.behavior_logprobs),
                    float(ex.advantage),
                    position,
                    None if token_advantages is None else [float(a) for a in token_advantages],
                    str(getattr(ex, "token_part", "relevance")),
                    counterfactual,
                    None if name_mask is None else [bool(m) for m in name_mask],
                ),
                reads_span_only(config),
            )
        )
    batch_size = 1 if config.one_at_a_time else max(1, config.batch_size)
    plan = batch_plan(
        [tuple(e.prompt_ids) for e in encoded],
        batch_size,
        config.epochs,
        config.seed,
        group_by_prompt=shares_prefix(config),
    )
    return [[encoded[i] for i in index] for index in plan]


def reads_span_only(config: Any) -> bool:
    """Whether `trim_unread_tail` is on and no term of the update reads a note's every token but the whole-note
    part: the token objective (`gspo` / `reward_weighted` average every token's log-ratio) and no k3 KL over the
    note (`kl_span` note)."""
    return bool(
        config.trim_unread_tail
        and config.objective == "token"
        and not (config.kl_beta > 0 and config.kl_span == "note")
    )


def trimmed(example: EncodedExample, span_only: bool) -> EncodedExample:
    """`example` cut after the last response token a loss term reads (a span advantage, the counterfactual's own
    action, the call's name for the KL anchor), when `span_only` and its whole-note advantage is 0, so nothing
    reads the rest. The model is causal: the kept tokens' log-probs are the uncut forward's, and the cut tail's
    terms were zero, so the loss and its gradient stay the same while the forward runs over fewer tokens (under
    `call_first` the call line opens the note). `sampled_length` keeps the sampled length for the normaliser."""
    if not span_only or example.advantage != 0.0:
        return example
    read = [i for i, a in enumerate(example.advantages_row()) if a != 0.0]
    read += [i for i, m in enumerate(example.name_mask or []) if m]
    if example.counterfactual is not None:
        read += [i for i, m in enumerate(example.counterfactual.own_mask) if m]
    cut = max(read, default=0) + 1  # a note nothing reads keeps its first token: it stays a row of its minibatch
    if cut >= len(example.response_ids):
        return example
    counterfactual = example.counterfactual
    if counterfactual is not None:
        counterfactual = replace(counterfactual, own_mask=list(counterfactual.own_mask[:cut]))
    return replace(
        example,
        response_ids=example.response_ids[:cut],
        behavior_logprobs=example.behavior_logprobs[:cut],
        token_advantages=None if example.token_advantages is None else example.token_advantages[:cut],
        counterfactual=counterfactual,
        name_mask=None if example.name_mask is None else example.name_mask[:cut],
        sampled_length=example.length,
    )


def shares_prefix(config: Any) -> bool:
    """Whether a GSPO config keeps prompt groups together and runs each prompt once."""
    return bool(config.share_prompt_prefix and not config.one_at_a_time)


def padded(rows: Sequence[Sequence[float]], width: int) -> np.ndarray:
    """`[len(rows), width]` float32, each row left-aligned and zero-padded."""
    out = np.zeros((len(rows), width), dtype=np.float32)
    for b, row in enumerate(rows):
        out[b, : len(row)] = row
    return out


def epoch_sizes(batches: Sequence[Sequence[EncodedExample]], epochs: int) -> dict[str, int]:
    """Examples, sampled response tokens and the ones forwarded (`trim_unread_tail`) of one epoch (the plan repeats
    every example once an epoch)."""
    rows = [b for batch in batches for b in batch]
    per_epoch = max(1, int(epochs))
    return {
        "examples": len(rows) // per_epoch,
        "response_tokens": sum(b.length for b in rows) // per_epoch,
        "response_tokens_forwarded": sum(len(b.response_ids) for b in rows) // per_epoch,
    }
