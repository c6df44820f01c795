"""The MLX training loop, mlx-lm style (`train(model, optimizer, loss=..., iterate_batches=...)`:
`nn.value_and_grad`, gradient norm clipped), and `FRAMEWORK`: what mlx lends the shared trainers
(`gspo.py`, `dpo.py`). The mirror of `torch/training.py`."""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten

from outcome_flywheel.models.interface import Framework, TrainStats
from outcome_flywheel.models.mlx.losses import gspo_loss, sft_loss, weighted_dpo_loss

LossFn = Callable[[nn.Module, Any], tuple[mx.array, dict[str, mx.array]]]


def adamw(model: nn.Module, learning_rate: float, weight_decay: float = 0.0) -> optim.AdamW:
    """AdamW for the model's trainable parameters (no weight decay by default), correcting the
    moment bias as torch.optim.AdamW does (mlx's does only when asked)."""
    if not tree_flatten(model.trainable_parameters()):
        raise ValueError("no trainable parameters")
    return optim.AdamW(learning_rate=learning_rate, weight_decay=weight_decay, bias_correction=True)


def train(
    model: nn.Module, optimizer: optim.Optimizer, *, loss: LossFn, iterate_batches: Iterable[Any],
    max_grad_norm: float = 1.0,
) -> TrainStats:
    """One optimiser step per batch on the model's trainable parameters, gradients clipped to
    `max_grad_norm` (norm recorded before clipping), the model in training mode meanwhile.

    `loss(model, batch)` returns the scalar loss and a dict of per-batch metrics; the metrics are
    collected into `TrainStats.extra[name]` as lists.
    """
    loss_and_grad = nn.value_and_grad(model, loss)
    stats = TrainStats()
    started = time.perf_counter()
    was_training = model.training
    model.train()
    try:
        for batch in iterate_batches:
            (value, metrics), grads = loss_and_grad(model, batch)
            grads, grad_norm = optim.clip_grad_norm(grads, max_grad_norm)
            optimizer.update(model, grads)
            mx.eval(model.parameters(), optimizer.state, value, grad_norm, metrics)
            stats.record(value.item(), grad_norm.item(), {name: v.item() for name, v in metrics.items()})
    finally:
        model.train(was_training)
    stats.wall_s = time.perf_counter() - started
    return stats


def inference(backend):
    """Eval mode (no LoRA dropout), the training flag restored afterwards; mlx has no autograd
    tape, so nothing else is needed for a no-grad pass."""
    return backend._eval_mode()


def to_numpy(array: mx.array) -> np.ndarray:
    return np.array(array)


def as_array(backend, array: np.ndarray) -> mx.array:
    return mx.array(array)


def seed(value: int) -> None:
    mx.random.seed(int(value))


FRAMEWORK = Framework(
    name="mlx", seed=seed, inference=inference, to_numpy=to_numpy, as_array=as_array,
    gspo_loss=gspo_loss, weighted_dpo_loss=weighted_dpo_loss, adamw=adamw, train=train, sft_loss=sft_loss,
)
