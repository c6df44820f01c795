"""Training within a memory budget: a minibatch whose activations would not fit is taken in
micro-batches whose gradients add up to the minibatch's (gradient accumulation). The effective
batch and the update stay what they were; only the peak falls. Each trainer scales a part's loss
by its share of the minibatch's (`interface.Accumulated`), so the sum is the minibatch's loss.

The budget: `FLYWHEEL_TRAIN_MEMORY_GIB` when set (also on the CPU), else what the accelerator has
free when the training starts (`Framework.free_memory`: CUDA's free memory, or Metal's recommended
working set less what is in use) times `FREE_SHARE`; none on the CPU, whose memory the operating
system shares out (set the variable there).

The cost of a token: the activations autograd keeps for the backward pass. Korthikanti et al. 2022
("Reducing Activation Recomputation in Large Transformer Models") count 34 h bytes per token and
layer at 16 bits for a GPT block with a 4h MLP, i.e. ~17 values of width h. For a Qwen-style block
(q/k/v/o, RMSNorms, a SwiGLU MLP of width i) the tensors kept are ~10 h + 4 i values per token and
layer (the norms' inputs, q, k, v, the attention output and its projection's input, the MLP's
input, gate, up, their activation and product); the head's log-softmax runs in chunks and is left
out. An estimate, not a measurement: the peak a GPU shows is the place to check it (benchmarks.gpu).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Sequence

MEMORY_VARIABLE = "FLYWHEEL_TRAIN_MEMORY_GIB"
FREE_SHARE = 0.8  # of the free memory: the allocator's fragmentation and the optimiser's first step need room


def budget_bytes(backend: Any) -> int | None:
    """The activation budget of one optimiser step in bytes, or None (no limit: whole minibatches)."""
    value = os.environ.get(MEMORY_VARIABLE, "").strip()
    if value:
        try:
            gib = float(value)
        except ValueError as err:
            raise ValueError(f"{MEMORY_VARIABLE}={value!r}: a number of GiB") from err
        if not 0 < gib < float("inf"):
            raise ValueError(f"{MEMORY_VARIABLE}={value!r}: a number of GiB above 0")
        return int(gib * 2**30)
    free = backend.framework.free_memory(backend) if backend.framework.free_memory is not None else None
    return int(free * FREE_SHARE) if free else None


def bytes_per_token(backend: Any) -> int:
    """Activation bytes one token of a training forward keeps for the backward (module docstring)."""
    config = json.loads((Path(backend.model_path) / "config.json").read_text())
    config = config.get("text_config", config)  # multimodal configs nest the language model's
    hidden = int(config["hidden_size"])
    width = int(config.get("intermediate_size") or 4 * hidden)
    element = 4 if "float32" in str(backend.dtype) else 2
    return int(config["num_hidden_layers"]) * (10 * hidden + 4 * width) * element


def token_limit(backend: Any) -> int | None:
    """Tokens (sequences x padded length) one forward may hold within the budget; None = no limit."""
    budget = budget_bytes(backend)
    return None if budget is None else max(1, budget // bytes_per_token(backend))


def split_by_tokens(items: Sequence[Any], lengths: Sequence[int], limit: int | None) -> list[list[Any]]:
    """`items` in order, cut into consecutive parts whose padded size (count x longest length) is at
    most `limit` tokens; a part holds one item at least (a sequence longer than the limit alone)."""
    if limit is None:
        return [list(items)]
    parts: list[list[Any]] = []
    part: list[Any] = []
    longest = 0
    for item, length in zip(items, lengths):
        if part and (len(part) + 1) * max(longest, length) > limit:
            parts.append(part)
            part, longest = [], 0
        part.append(item)
        longest = max(longest, int(length))
    if part:
        parts.append(part)
    return parts


def accumulated_steps(
    plan: Sequence[Sequence[int]],
    cost: Callable[[int], int],
    share: Callable[[int], float],
    limit: int | None,
    keep: Callable[[Sequence[int]], list[int]] | None = None,
) -> list:
    """One optimiser step per minibatch of item indices: the minibatch whole, or its parts within
    `limit` tokens (`cost(i)`: item i's padded tokens) as an `Accumulated` step, each part scaled by
    its items' `share` over the minibatch's (pairs for DPO, completion tokens for SFT). `keep(idx)`:
    the items of the minibatch this process trains on (a data-parallel rank's shard, `shards.py`);
    their parts are still scaled over the whole minibatch, and a rank holding none gets an empty step."""
    from outcome_flywheel.models.interface import Accumulated

    steps = []
    for idx in plan:
        mine = list(idx) if keep is None else keep(idx)
        parts = split_by_tokens(mine, [cost(i) for i in mine], limit) if mine else []
        total = sum(share(i) for i in idx)
        scaled = Accumulated(tuple(parts), tuple(sum(share(i) for i in p) / total for p in parts))
        steps.append(idx if keep is None and len(parts) == 1 else scaled)
    return steps


def part_count(steps: Sequence[Any]) -> int:
    """Forward passes the steps take (an `Accumulated` step: one per part)."""
    return sum(len(s.parts) if hasattr(s, "parts") else 1 for s in steps)
