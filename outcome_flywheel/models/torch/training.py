"""The PyTorch training loop in the mlx-lm manner (`train(model, optimizer, loss=...,
iterate_batches=...)`), and `FRAMEWORK`: what torch lends the shared trainers (`gspo.py`, `dpo.py`).
`mlx/training.py` is its mirror."""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import torch

from outcome_flywheel.models.interface import Framework, TrainStats
from outcome_flywheel.models.torch.losses import gspo_loss, sft_loss, weighted_dpo_loss

LossFn = Callable[[torch.nn.Module, Any], tuple[torch.Tensor, dict[str, float]]]


def adamw(model: torch.nn.Module, learning_rate: float, weight_decay: float = 0.0) -> torch.optim.AdamW:
    """AdamW over the model's trainable parameters (no weight decay by default)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("no trainable parameters")
    return torch.optim.AdamW(params, lr=learning_rate, weight_decay=weight_decay)


def train(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, loss: LossFn, iterate_batches: Iterable[Any],
    max_grad_norm: float = 1.0,
) -> TrainStats:
    """One optimiser step per batch, gradients clipped to `max_grad_norm` (norm recorded before
    clipping), the model in training mode meanwhile.

    `loss(model, batch)` returns the scalar loss and a dict of per-batch metrics; the metrics are
    collected into `TrainStats.extra[name]` as lists.
    """
    params = [p for group in optimizer.param_groups for p in group["params"]]
    stats = TrainStats()
    started = time.perf_counter()
    was_training = model.training
    model.train()
    try:
        for batch in iterate_batches:
            value, metrics = loss(model, batch)
            optimizer.zero_grad(set_to_none=True)
            value.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
            optimizer.step()
            stats.record(value.item(), float(grad_norm), metrics)
    finally:
        model.train(was_training)
    stats.wall_s = time.perf_counter() - started
    return stats


@contextlib.contextmanager
def inference(backend) -> Iterator[None]:
    """No autograd and eval mode (no LoRA dropout), the training flag restored afterwards."""
    was_training = backend.model.training
    backend.model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        backend.model.train(was_training)


def to_numpy(array: torch.Tensor) -> np.ndarray:
    return array.detach().cpu().numpy()


def as_array(backend, array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array)).to(backend.device)


def seed(value: int) -> None:
    torch.manual_seed(int(value))


FRAMEWORK = Framework(
    name="torch", seed=seed, inference=inference, to_numpy=to_numpy, as_array=as_array,
    gspo_loss=gspo_loss, weighted_dpo_loss=weighted_dpo_loss, adamw=adamw, train=train, sft_loss=sft_loss,
)
