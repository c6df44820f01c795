"""The MLX training loop, mlx-lm style (`train(model, optimizer, loss=..., iterate_batches=...)`:
`nn.value_and_grad`, gradient norm clipped), and `FRAMEWORK`: what mlx lends the shared trainers
(`gspo.py`, `dpo.py`). The mirror of `torch/training.py`."""

from __future__ import annotations

import re
import time
from typing import Any, Callable, Iterable, Mapping

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_map

from outcome_flywheel.models.interface import Framework, TrainStats, merged_metrics, step_parts
from outcome_flywheel.models.mlx.logprobs import CHUNK_ELEMENTS
from outcome_flywheel.models.mlx.lora_convert import PEFT_PREFIX
from outcome_flywheel.models.mlx.losses import (
    exact_kl_loss,
    gspo_loss,
    sft_loss,
    side_lean_loss,
    side_pair_loss,
    side_probability_loss,
    weighted_dpo_loss,
)
from outcome_flywheel.models.train.optimizer_state import MOMENTS, check_state, flat_state

LossFn = Callable[[nn.Module, Any], tuple[mx.array, dict[str, mx.array]]]
MLX_MOMENTS = ("m", "v")  # mlx's names for MOMENTS ("exp_avg", "exp_avg_sq")
_LORA = re.compile(r"^(?P<module>.+)\.lora_(?P<which>[ab])$")


def adamw(model: nn.Module, learning_rate: float, weight_decay: float = 0.0) -> optim.AdamW:
    """AdamW for the model's trainable parameters (no weight decay by default), correcting the
    moment bias as torch.optim.AdamW does (mlx's does only when asked)."""
    if not tree_flatten(model.trainable_parameters()):
        raise ValueError("no trainable parameters")
    return optim.AdamW(learning_rate=learning_rate, weight_decay=weight_decay, bias_correction=True)


def train(
    model: nn.Module,
    optimizer: optim.Optimizer,
    *,
    loss: LossFn,
    iterate_batches: Iterable[Any],
    max_grad_norm: float = 1.0,
) -> TrainStats:
    """One optimiser step per batch on the model's trainable parameters, gradients clipped to
    `max_grad_norm` (norm recorded before clipping), the model in training mode meanwhile. An
    `Accumulated` batch is one step over its parts, their scaled gradients summed.

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
            grads, total, scaled = None, 0.0, []
            for part, scale in zip(*step_parts(batch)):
                (value, metrics), part_grads = loss_and_grad(model, part)
                if scale != 1.0:
                    part_grads = tree_map(lambda g: g * scale, part_grads)
                grads = part_grads if grads is None else tree_map(mx.add, grads, part_grads)
                mx.eval(grads, value, metrics)  # this part's graph is done with before the next is built
                total += value.item() * scale
                scaled.append((scale, {name: v.item() for name, v in metrics.items()}))
            grads, grad_norm = optim.clip_grad_norm(grads, max_grad_norm)
            optimizer.update(model, grads)
            mx.eval(model.parameters(), optimizer.state, grad_norm)
            stats.record(total, grad_norm.item(), merged_metrics(scaled))
    finally:
        model.train(was_training)
    stats.wall_s = time.perf_counter() - started
    return stats


def gradient_norm(model: nn.Module, loss: LossFn, batch: Any) -> float:
    """The L2 norm of the gradient of `loss` over `batch` (its parts summed at their scales) w.r.t. the
    trainable parameters; the mirror of torch's."""
    loss_and_grad = nn.value_and_grad(model, loss)
    total = None
    for part, scale in zip(*step_parts(batch)):
        (_, _), grads = loss_and_grad(model, part)
        grads = tree_map(lambda g: g * scale, grads)
        total = grads if total is None else tree_map(mx.add, total, grads)
    if total is None:
        return 0.0
    squares = [mx.sum(g.astype(mx.float32) ** 2) for _, g in tree_flatten(total)]
    return float(mx.sqrt(sum(squares[1:], squares[0])).item()) if squares else 0.0


def _checkpoint_names(model: nn.Module) -> dict[str, tuple[str, bool]]:
    """mlx name of each trainable parameter -> (its name in the checkpoint's files, transposed
    there): LoRA factors as PEFT writes them (`lora_a` [in, r] is `...lora_A.weight` [r, in],
    `lora_convert`), full weights under their transformers names (the same as mlx-lm's)."""
    names = {}
    for name, _ in tree_flatten(model.trainable_parameters()):
        match = _LORA.match(name)
        names[name] = (
            (f"{PEFT_PREFIX}{match['module']}.lora_{match['which'].upper()}.weight", True) if match else (name, False)
        )
    return names


def _state_node(state: dict, name: str) -> dict:
    """The optimiser's per-parameter dict (`m`, `v`) of the parameter `name` (`a.layers.0.b`)."""
    node: Any = state
    for part in name.split("."):
        node = node[int(part)] if isinstance(node, (list, tuple)) else node[part]
    return node


def optimizer_state(optimizer: optim.AdamW, model: nn.Module) -> dict[str, np.ndarray]:
    """AdamW's moments and step count in the framework-neutral layout (`optimizer_state.py`); an
    optimiser that has not stepped gives zero moments at step 0 (the same as a fresh one)."""
    flat = dict(tree_flatten(optimizer.state))
    step = int(optimizer.state["step"].item())
    params = dict(tree_flatten(model.trainable_parameters()))
    moments = {}
    for name, (saved, transposed) in _checkpoint_names(model).items():
        pair = []
        for ours in MLX_MOMENTS:
            value = flat.get(f"{name}.{ours}")
            if value is None and step:
                raise ValueError(f"the optimiser has taken {step} steps but holds no state for {name}")
            array = (
                np.array(value.astype(mx.float32)) if value is not None else np.zeros(params[name].shape, np.float32)
            )
            pair.append(np.ascontiguousarray(array.T) if transposed else array)
        moments[saved] = tuple(pair)
    return flat_state(moments, step)


def load_optimizer_state(optimizer: optim.AdamW, model: nn.Module, tensors: Mapping[str, np.ndarray]) -> None:
    """`optimizer_state`'s tensors into a fresh `adamw(model, lr)` before its first step (its own
    learning rate stays). The state mlx would make lazily at the first update is made now
    (`optimizer.init(model.trainable_parameters())`, as mlx-lm does) and filled; the restored
    `step` makes the next update's bias correction that of step + 1, as torch's. ValueError naming
    the mismatch when the trainable parameters differ; nothing is changed then."""
    names = _checkpoint_names(model)
    params = dict(tree_flatten(model.trainable_parameters()))
    shapes = {
        saved: tuple(params[name].shape[::-1] if transposed else params[name].shape)
        for name, (saved, transposed) in names.items()
    }
    step = check_state(tensors, shapes)
    if int(optimizer.state["step"].item()) != 0:
        raise ValueError("the optimiser has already stepped: load its state into a fresh one")
    optimizer.init(model.trainable_parameters())
    for name, (saved, transposed) in names.items():
        node = _state_node(optimizer.state, name)
        for key, ours in zip(MOMENTS, MLX_MOMENTS):
            value = np.asarray(tensors[f"{saved}.{key}"], dtype=np.float32)
            node[ours] = mx.array(np.ascontiguousarray(value.T) if transposed else value).astype(params[name].dtype)
    optimizer.state["step"] = mx.array(step, dtype=mx.uint64)
    mx.eval(optimizer.state)


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


def free_memory(backend) -> int | None:
    """Bytes of Metal's recommended working set not in use now; None without Metal (the CPU)."""
    if not mx.metal.is_available():
        return None
    info = mx.metal.device_info()
    active = mx.get_active_memory() if hasattr(mx, "get_active_memory") else mx.metal.get_active_memory()
    return max(0, int(info["max_recommended_working_set_size"]) - int(active))


def trainable_bytes(backend) -> int:
    """Bytes of the trainable parameters (a LoRA adapter, or the unfrozen model)."""
    return int(sum(v.nbytes for _, v in tree_flatten(backend.model.trainable_parameters())))


FRAMEWORK = Framework(
    gradient_norm=gradient_norm,
    name="mlx",
    seed=seed,
    inference=inference,
    to_numpy=to_numpy,
    as_array=as_array,
    gspo_loss=gspo_loss,
    weighted_dpo_loss=weighted_dpo_loss,
    adamw=adamw,
    train=train,
    sft_loss=sft_loss,
    side_probability_loss=side_probability_loss,
    side_pair_loss=side_pair_loss,
    side_lean_loss=side_lean_loss,
    exact_kl_loss=exact_kl_loss,
    optimizer_state=optimizer_state,
    load_optimizer_state=load_optimizer_state,
    free_memory=free_memory,
    trainable_bytes=trainable_bytes,
    logit_chunk_elements=CHUNK_ELEMENTS,
    # the chosen logit minus a logsumexp (mlx/logprobs.py): torch's count for that form before it became a
    # cross-entropy (the scaled logits, the exp of the gradient and their product, gather's gradient)
    head_chunk_copies=4,
)
