"""A small PyTorch training loop in the mlx-lm manner: it takes the loss function and the batch
iterator as arguments, so GSPO and weighted DPO share it and differ only in those two."""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable

import torch

from outcome_flywheel.models.interface import TrainStats

LossFn = Callable[[Any], tuple[torch.Tensor, dict[str, float]]]


def train_loop(
    params: list[torch.nn.Parameter],
    loss_fn: LossFn,
    batches: Iterable[Any],
    learning_rate: float,
    max_grad_norm: float = 1.0,
    weight_decay: float = 0.0,
) -> TrainStats:
    """One Adam step per batch, gradients clipped to `max_grad_norm` (norm recorded before clipping).

    `loss_fn(batch)` returns the scalar loss and a dict of per-batch metrics; the metrics are
    collected into `TrainStats.extra[name]` as lists.
    """
    if not params:
        raise ValueError("no trainable parameters")
    optimizer = torch.optim.AdamW(params, lr=learning_rate, weight_decay=weight_decay)
    stats = TrainStats()
    started = time.perf_counter()
    for batch in batches:
        loss, metrics = loss_fn(batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        optimizer.step()
        stats.steps += 1
        stats.losses.append(loss.item())
        stats.grad_norms.append(float(grad_norm))
        for name, value in metrics.items():
            stats.extra.setdefault(name, []).append(float(value))
    stats.wall_s = time.perf_counter() - started
    return stats
