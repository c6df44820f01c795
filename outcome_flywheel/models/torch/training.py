"""The PyTorch training loop in the mlx-lm manner (`train(model, optimizer, loss=...,
iterate_batches=...)`), and `FRAMEWORK`: what torch lends the shared trainers (`gspo.py`, `dpo.py`).
`mlx/training.py` is its mirror."""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np
import torch

from outcome_flywheel.models.interface import Framework, TrainStats, merged_metrics, step_parts
from outcome_flywheel.models.train.optimizer_state import MOMENTS, check_state, flat_state
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
    clipping), the model in training mode meanwhile. An `Accumulated` batch is one step over its
    parts: each part's scaled loss is backpropagated in turn, its activations freed before the next.

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
            optimizer.zero_grad(set_to_none=True)
            total, scaled = 0.0, []
            for part, scale in zip(*step_parts(batch)):
                value, metrics = loss(model, part)
                (value if scale == 1.0 else value * scale).backward()  # gradients add up in .grad
                total += value.item() * scale
                scaled.append((scale, metrics))
            grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
            optimizer.step()
            stats.record(total, float(grad_norm), merged_metrics(scaled))
    finally:
        model.train(was_training)
    stats.wall_s = time.perf_counter() - started
    return stats


def _checkpoint_names(model: torch.nn.Module) -> dict[int, str]:
    """id(parameter) -> its name in the checkpoint's files: the PEFT adapter key (the adapter's
    name dropped, `...lora_A.default.weight` -> `...lora_A.weight`, as `save_pretrained` writes it)
    or the transformers name of a full model."""
    adapter = getattr(model, "active_adapter", None) if hasattr(model, "peft_config") else None
    names = {}
    for name, param in model.named_parameters():
        names[id(param)] = name.replace(f".{adapter}.", ".", 1) if isinstance(adapter, str) else name
    return names


def _optimizer_params(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """(checkpoint name, parameter) in the optimiser's order (that of its `state_dict`)."""
    names = _checkpoint_names(model)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if any(id(p) not in names for p in params):
        raise ValueError("the optimiser holds parameters that are not the model's")
    return [(names[id(p)], p) for p in params]


def optimizer_state(optimizer: torch.optim.AdamW, model: torch.nn.Module) -> dict[str, np.ndarray]:
    """AdamW's moments and step count in the framework-neutral layout (`optimizer_state.py`); an
    optimiser that has not stepped gives zero moments at step 0 (the same as a fresh one)."""
    moments, steps = {}, set()
    for name, param in _optimizer_params(optimizer, model):
        state = optimizer.state.get(param) or {}
        steps.add(int(state["step"]) if state else 0)
        moments[name] = tuple(
            state[key].detach().to(torch.float32).cpu().numpy() if state else np.zeros(tuple(param.shape), np.float32)
            for key in MOMENTS
        )
    if len(steps) > 1:
        raise ValueError(f"the parameters have taken different numbers of steps {sorted(steps)}: one step count cannot hold them")
    return flat_state(moments, steps.pop() if steps else 0)


def load_optimizer_state(optimizer: torch.optim.AdamW, model: torch.nn.Module, tensors: Mapping[str, np.ndarray]) -> None:
    """`optimizer_state`'s tensors into a fresh `adamw(model, lr)` before its first step (its own
    learning rate and other settings stay). ValueError naming the mismatch when the trainable
    parameters differ; nothing is changed then."""
    params = _optimizer_params(optimizer, model)
    step = check_state(tensors, {name: tuple(p.shape) for name, p in params})
    if any(optimizer.state.get(p) for _, p in params):
        raise ValueError("the optimiser has already stepped: load its state into a fresh one")
    scalar = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32  # as torch's AdamW keeps `step`
    state = {
        index: {"step": torch.tensor(float(step), dtype=scalar),
                **{key: torch.tensor(np.asarray(tensors[f"{name}.{key}"])) for key in MOMENTS}}
        for index, (name, _) in enumerate(params)
    }
    # load_state_dict puts the moments on each parameter's device and dtype (and `step` where
    # capturable / fused AdamW wants it); the param_groups are the fresh optimiser's own.
    optimizer.load_state_dict({"state": state, "param_groups": optimizer.state_dict()["param_groups"]})


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


def free_memory(backend) -> int | None:
    """Bytes free on the backend's CUDA device (the driver's figure), None off CUDA."""
    device = torch.device(backend.device)
    if device.type != "cuda":
        return None
    free, _total = torch.cuda.mem_get_info(device)
    return int(free)


FRAMEWORK = Framework(
    name="torch", seed=seed, inference=inference, to_numpy=to_numpy, as_array=as_array,
    gspo_loss=gspo_loss, weighted_dpo_loss=weighted_dpo_loss, adamw=adamw, train=train, sft_loss=sft_loss,
    optimizer_state=optimizer_state, load_optimizer_state=load_optimizer_state, free_memory=free_memory,
)
