"""Data-parallel shards of the trainers' minibatches, written once for both frameworks (torch under
torchrun does it, `torch/training.py`; mlx trains in one process and refuses several).

Every rank builds the same batching plan (same seed), then takes its shard of each minibatch: whole
groups (a GSPO prompt group is never split across ranks; DPO's pairs and SFT's examples are groups of
one), each group to the rank holding the fewest items so far, ties to the lower rank (for groups of
one: item i to rank i mod world, as torch's DistributedSampler). A rank's shard is then cut to the
memory budget (`memory.py`) and each part's loss scaled by its share of the whole minibatch
(sequences, pairs, or completion tokens), so the parts of all ranks add up to the minibatch's loss and,
summed across ranks, to its gradient: the one-process update.

Test hook: `FLYWHEEL_DEBUG_WRONG_SHARD=<rank>` makes every rank take that rank's shard (a wrong
sharding the equality tests must catch).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Hashable, Sequence

from outcome_flywheel.models.train.memory import accumulated_steps

WRONG_SHARD_VARIABLE = "FLYWHEEL_DEBUG_WRONG_SHARD"


def ranks(framework: Any) -> tuple[int, int]:
    """(rank, world size) the trainer runs in. A framework without data parallelism (mlx) refuses a
    launcher's WORLD_SIZE > 1: each process would train on the whole data and write the same outputs."""
    if framework.world is not None:
        return framework.world()
    size = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if size > 1:
        raise RuntimeError(
            f"WORLD_SIZE={size}: {framework.name} trains in one process (it has no torchrun or "
            "data-parallel training); launch one process (FLYWHEEL_STEP_PROCESSES=1)"
        )
    return 0, 1


LEADERS: list[Callable[[str, Any, tuple], None]] = []  # set on a step's rank 0 (steps/entry.py)


def announce(trainer: str, backend: Any, *args: Any) -> None:
    """A trainer starts: on a step's rank 0, hand its call to the other ranks (`torch/training.follow`),
    which then run the same trainer on their shards. Nothing elsewhere (every rank calls the trainer)."""
    for lead in LEADERS:
        lead(trainer, backend, args)


def gather(framework: Any, obj: Any) -> list:
    """Every rank's `obj` in rank order (`[obj]` in one process)."""
    return framework.gather(obj) if framework.gather is not None else [obj]


def shard(items: Sequence[Any], keys: Sequence[Hashable], rank: int, world: int) -> list[Any]:
    """This rank's items of one minibatch, in minibatch order: whole groups of equal keys (module docstring)."""
    if world == 1:
        return list(items)
    wrong = os.environ.get(WRONG_SHARD_VARIABLE, "").strip()
    if wrong:
        rank = int(wrong)
    groups: dict[Hashable, list[int]] = {}
    for position, key in enumerate(keys):
        groups.setdefault(key, []).append(position)
    load = [0] * world
    mine: list[int] = []
    for positions in groups.values():
        owner = min(range(world), key=lambda r: (load[r], r))
        load[owner] += len(positions)
        if owner == rank:
            mine += positions
    return [items[p] for p in sorted(mine)]


def sharded_steps(
    plan: Sequence[Sequence[int]],
    cost: Callable[[int], int],
    share: Callable[[int], float],
    limit: int | None,
    rank: int,
    world: int,
    key: Callable[[int], Hashable] = lambda i: i,
) -> list:
    """`memory.accumulated_steps` for this rank: each minibatch of item indices reduced to its shard, cut
    within `limit` tokens, each part scaled by its `share` over the whole minibatch's (an empty
    `Accumulated` when the rank holds none of it)."""
    return accumulated_steps(plan, cost, share, limit, keep=lambda idx: shard(idx, [key(i) for i in idx], rank, world))
