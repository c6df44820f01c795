"""Data-parallel shards of the trainers' minibatches and of rollout sampling's prompts, written once for
both frameworks (torch under torchrun does it, `torch/training.py`; mlx runs one process and refuses several).

Every rank builds the same batching plan (same seed), then takes its shard of each minibatch: whole
groups (a GSPO prompt group is never split across ranks; DPO's pairs and SFT's examples are groups of
one), each group to the rank holding the fewest items so far, ties to the lower rank (for groups of
one: item i to rank i mod world, as torch's DistributedSampler). A rank's shard is then cut to the
memory budget (`memory.py`) and each part's loss scaled by its share of the whole minibatch
(sequences, pairs, or completion tokens), so the parts of all ranks add up to the minibatch's loss and,
summed across ranks, to its gradient: the one-process update.

Sampling (`sample_across_ranks`): prompt i to rank i mod world, each rank sampling its prompts with their
own seeds on its own copy of the policy, every rank's samples gathered back into prompt order. A prompt's
samples depend only on its seed and the weights, so they are one process's: the same tokens, the
behaviour log-probs within fp32 rounding of a batch of another shape (`sampling.logprob_tolerance`).

Test hook: `FLYWHEEL_DEBUG_WRONG_SHARD=<rank>` makes every rank take that rank's shard (a wrong
sharding the equality tests must catch).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable, Hashable, Sequence

from outcome_flywheel.models.train.memory import ForwardCosts, accumulated_steps, memory_plan, part_count

if TYPE_CHECKING:
    from outcome_flywheel.models.interface import Messages, ModelBackend, Sample, SamplingConfig, TrainStats
    from outcome_flywheel.models.train.memory import MemoryPlan

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
    """A trainer (or `sample_across_ranks`) starts: on a step's rank 0, hand its call to the other ranks
    (`torch/followers.follow`), which then run the same call on their shards. Nothing elsewhere (every
    rank makes the call)."""
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
    cost: Callable[[list[int]], float],
    share: Callable[[int], float],
    limit: int | None,
    rank: int,
    world: int,
    key: Callable[[int], Hashable] = lambda i: i,
) -> list:
    """`memory.accumulated_steps` for this rank: each minibatch of item indices reduced to its shard, cut
    within `limit` tokens, each part scaled by its `share` over the whole minibatch's (an empty
    `Accumulated` when the rank holds none of it). One process: `accumulated_steps` itself."""
    if world == 1:
        return accumulated_steps(plan, cost, share, limit)
    return accumulated_steps(plan, cost, share, limit, keep=lambda idx: shard(idx, [key(i) for i in idx], rank, world))


def train_budgeted(
    backend: "ModelBackend",
    plan: Sequence[Sequence[int]],
    loss: Callable,
    cost_at: Callable[[ForwardCosts], Callable[[list[int]], float]],
    share: Callable[[int], float],
    shared: bool,
    learning_rate: float,
    max_grad_norm: float,
) -> "TrainStats":
    """One AdamW step per minibatch of item indices in `plan` (DPO's pairs, SFT's examples), this
    rank's shard of each within the memory budget (`memory.memory_plan`: parts whose `share`-scaled
    losses add up to the minibatch's, or the layers recomputed), `loss(model, idx)` a part's; the
    plan's figures in the stats (micro-batches over every rank, token limit, recomputation)."""
    fw = backend.framework
    rank, world = ranks(fw)
    memory = memory_plan(backend, plan, cost_at, shared)
    steps = sharded_steps(plan, cost_at(memory.costs), share, memory.limit, rank, world)
    optimizer = fw.adamw(backend.model, learning_rate)
    with backend.recomputing(memory.recompute):
        stats = fw.train(backend.model, optimizer, loss=loss, iterate_batches=steps, max_grad_norm=max_grad_norm)
    stats.extra.update(plan_figures(fw, part_count(steps), memory, world))
    return stats


def plan_figures(framework: Any, parts: int, memory: "MemoryPlan", world: int) -> dict:
    """What a trainer records of its memory plan (the daily row, the adapter's and the distillation's
    metadata read them): the micro-batches over every rank (this rank ran `parts`), the token limit,
    whether the layers were recomputed, the processes."""
    return dict(
        micro_batches=sum(gather(framework, parts)),
        token_limit=memory.limit,
        recompute=memory.recompute,
        processes=world,
    )


def sample_across_ranks(
    backend: "ModelBackend", prompts: Sequence["Messages"], n: int, config: "SamplingConfig", seeds: Sequence[int]
) -> list[list["Sample"]]:
    """`backend.sample(prompts, n, config, seeds)` shared out across a step's ranks (module docstring):
    each rank samples its prompts, every rank returns all of them in prompt order. RuntimeError when the
    ranks' shards do not cover the prompts once each."""
    announce("sample", backend, list(prompts), n, config, list(seeds))
    rank, world = ranks(backend.framework)
    if world == 1:
        return backend.sample(prompts, n, config, seeds)
    if len(seeds) != len(prompts):
        raise ValueError("one seed per prompt")
    positions = list(range(len(prompts)))
    mine = shard(positions, positions, rank, world)
    samples = backend.sample([prompts[i] for i in mine], n, config, [seeds[i] for i in mine]) if mine else []
    out: dict[int, list] = {}
    repeated = set()
    for taken, groups in gather(backend.framework, (mine, samples)):
        for i, group in zip(taken, groups):
            if i in out:
                repeated.add(i)
            out[i] = group
    missing = sorted(set(positions) - set(out))
    if missing or repeated:
        raise RuntimeError(
            f"data parallel sampling: prompts {missing} sampled by no rank, {sorted(repeated)} by several "
            f"(world {world}): the ranks' shards must cover the prompts once each"
        )
    return [out[i] for i in positions]
