"""The PyTorch training loop in the mlx-lm manner (`train(model, optimizer, loss=...,
iterate_batches=...)`), and `FRAMEWORK`: what torch lends the shared trainers (`gspo.py`, `dpo.py`).
`mlx/training.py` is its mirror."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from datetime import timedelta
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
import torch
import torch.distributed as dist

from outcome_flywheel.models.interface import Framework, TrainStats, merged_metrics, step_parts
from outcome_flywheel.models.torch.logprobs import CHUNK_ELEMENTS
from outcome_flywheel.models.torch.losses import (
    exact_kl_loss,
    gspo_loss,
    sft_loss,
    side_lean_loss,
    side_pair_loss,
    side_probability_loss,
    weighted_dpo_loss,
)
from outcome_flywheel.models.train.optimizer_state import MOMENTS, check_state, flat_state

LossFn = Callable[[torch.nn.Module, Any], tuple[torch.Tensor, dict[str, float]]]


def adamw(model: torch.nn.Module, learning_rate: float, weight_decay: float = 0.0) -> torch.optim.AdamW:
    """AdamW over the model's trainable parameters (no weight decay by default), fused where torch
    has the kernel: CUDA's default multi-tensor path makes a temporary the size of every trainable
    weight (the second moments' square roots; 2.2 GiB on a full fine-tune of qwen3-0.6b)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("no trainable parameters")
    try:
        return torch.optim.AdamW(params, lr=learning_rate, weight_decay=weight_decay, fused=True)
    except RuntimeError:  # a device or dtype without the kernel
        return torch.optim.AdamW(params, lr=learning_rate, weight_decay=weight_decay)


def train(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    loss: LossFn,
    iterate_batches: Iterable[Any],
    max_grad_norm: float = 1.0,
) -> TrainStats:
    """One optimiser step per batch, gradients clipped to `max_grad_norm` (norm recorded before
    clipping), the model in training mode meanwhile. An `Accumulated` batch is one step over its
    parts: each part's scaled loss is backpropagated in turn, its activations freed before the next.

    `loss(model, batch)` returns the scalar loss and a dict of per-batch metrics; the metrics are
    collected into `TrainStats.extra[name]` as lists.

    Data parallel (below, world size > 1): each rank's batch holds its shard of the
    minibatch as parts scaled by their share of the whole minibatch (`train/shards.py`); the gradients
    are summed across ranks before the clip and the step, and the loss and metrics gathered, so every
    rank records and steps what one process would.
    """
    params = [p for group in optimizer.param_groups for p in group["params"]]
    _, ranks = world()
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
            if ranks > 1:  # this rank's parts were scaled by their share of the whole minibatch: sum the ranks'
                crash_if_asked()
                reduce_gradients(params)
                gathered = gather((total, scaled))
                total, scaled = sum(t for t, _ in gathered), [item for _, s in gathered for item in s]
            grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
            optimizer.step()
            stats.record(total, float(grad_norm), merged_metrics(scaled))
    finally:
        model.train(was_training)
    if ranks > 1:
        check_same_weights(list(model.parameters()))
    stats.wall_s = time.perf_counter() - started
    return stats


def gradient_norm(model: torch.nn.Module, loss: LossFn, batch: Any) -> float:
    """The L2 norm of the gradient of `loss` over `batch` (its parts summed at their scales), in the
    model's current mode; the trainable weights are left without gradients."""
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = None
    for part, scale in zip(*step_parts(batch)):
        value, _ = loss(model, part)
        (value * scale).backward()
    norm = torch.sqrt(sum((p.grad.float() ** 2).sum() for p in params if p.grad is not None) or torch.zeros(()))
    for p in params:
        p.grad = None
    return float(norm)


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
        raise ValueError(
            f"the parameters have taken different numbers of steps {sorted(steps)}: one step count cannot hold them"
        )
    return flat_state(moments, steps.pop() if steps else 0)


def load_optimizer_state(
    optimizer: torch.optim.AdamW, model: torch.nn.Module, tensors: Mapping[str, np.ndarray]
) -> None:
    """`optimizer_state`'s tensors into a fresh `adamw(model, lr)` before its first step (its own
    learning rate and other settings stay). ValueError naming the mismatch when the trainable
    parameters differ; nothing is changed then."""
    params = _optimizer_params(optimizer, model)
    step = check_state(tensors, {name: tuple(p.shape) for name, p in params})
    if any(optimizer.state.get(p) for _, p in params):
        raise ValueError("the optimiser has already stepped: load its state into a fresh one")
    # as torch's AdamW keeps `step`
    scalar = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
    state = {
        index: {
            "step": torch.tensor(float(step), dtype=scalar),
            **{key: torch.tensor(np.asarray(tensors[f"{name}.{key}"])) for key in MOMENTS},
        }
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
    return int(torch.cuda.mem_get_info(device)[0])


def trainable_bytes(backend) -> int:
    """Bytes of the parameters that require gradients."""
    return sum(p.numel() * p.element_size() for p in backend.model.parameters() if p.requires_grad)


# Data-parallel training over `torch.distributed` (torchrun: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR...).
#
# Every rank holds the whole model and the same optimiser state; each takes its shard of every minibatch
# (`train/shards.py`), backpropagates its parts scaled by their share of the whole minibatch, and the
# gradients are summed across ranks (`reduce_gradients`: one all-reduce per optimiser step, in buckets),
# so every rank steps with the one-process minibatch gradient and the weights stay equal on all ranks.
# DDP's reduction without its module wrapper: the trainers call the model through the backend's
# log-prob functions (several forwards a step, a rank may hold no part of a minibatch), so the
# gradients are reduced once after the step's backward passes rather than from DDP's hooks. Not FSDP:
# tiny-local and 0.6B models (weights, grads and AdamW's moments) fit one card; FSDP shards those for
# models that do not.
#
# Only rank 0 writes (`is_writer`; `TorchBackend.save` is a no-op elsewhere). A step's other ranks follow rank 0
# through `followers.py`.
#
# Test hook: `FLYWHEEL_TRAIN_CRASH_RANK=<rank>` makes that rank SIGKILL itself after its first
# data-parallel backward pass, before the all-reduce (a rank lost mid-step: the run must fail).

CRASH_RANK_VARIABLE = "FLYWHEEL_TRAIN_CRASH_RANK"
BUCKET_BYTES = 64 * 2**20  # gradients all-reduced per call (DDP's default bucket is 25 MiB)


def initialised() -> bool:
    return dist.is_available() and dist.is_initialized()


def world() -> tuple[int, int]:
    """(rank, world size) of the initialised process group; (0, 1) without one. RuntimeError when the
    launcher started several processes (WORLD_SIZE > 1) but no group was initialised: each would train
    on the whole data and write the same outputs."""
    if initialised():
        return dist.get_rank(), dist.get_world_size()
    size = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if size > 1:
        raise RuntimeError(
            f"WORLD_SIZE={size} but torch.distributed is not initialised: call "
            "outcome_flywheel.models.torch.training.init_from_env() before training"
        )
    return 0, 1


def is_writer() -> bool:
    """Whether this process may write outputs (checkpoints, adapters, moments, ledgers, reports): rank 0."""
    return world()[0] == 0


def init_from_env(device: str = "auto", timeout_s: float = 6 * 3600) -> tuple[int, int]:
    """Initialise the default process group from torchrun's environment (a no-op when one is, or with
    WORLD_SIZE <= 1): NCCL when the ranks train on CUDA (each on its LOCAL_RANK's card), else gloo."""
    size = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if size > 1 and not initialised():
        cuda = torch.cuda.is_available() and device in ("auto", "cuda")
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=timeout_s))
    return world()


def gather(obj: Any) -> list:
    """Every rank's `obj` (picklable), in rank order; `[obj]` in one process."""
    if not initialised() or dist.get_world_size() == 1:
        return [obj]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def crash_if_asked() -> None:
    """The test hook (module docstring): SIGKILL this rank when it is the one named."""
    value = os.environ.get(CRASH_RANK_VARIABLE, "").strip()
    if value and initialised() and int(value) == dist.get_rank():
        print(
            f"{CRASH_RANK_VARIABLE}={value}: rank {value} killing itself mid-step (SIGKILL)",
            file=sys.stderr,
            flush=True,
        )
        os.kill(os.getpid(), signal.SIGKILL)


def reduce_gradients(params: Sequence[torch.nn.Parameter]) -> None:
    """Sum every parameter's `.grad` across the ranks (in place, the same result on every rank). A
    parameter without a gradient on some rank (it held no part of the minibatch) counts as zeros there;
    one without a gradient on every rank keeps None, as in one process (AdamW skips it)."""
    if not params:
        return
    device = params[0].device
    has = torch.tensor([p.grad is not None for p in params], dtype=torch.int32, device=device)
    dist.all_reduce(has, op=dist.ReduceOp.MAX)
    live = [p for p, h in zip(params, has.tolist()) if h]
    for p in live:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    bucket: list[torch.Tensor] = []
    size = 0
    for p in live:
        if bucket and (
            size + p.grad.numel() * p.grad.element_size() > BUCKET_BYTES
            or p.grad.dtype != bucket[0].dtype
            or p.grad.device != bucket[0].device
        ):
            _all_reduce(bucket)
            bucket, size = [], 0
        bucket.append(p.grad)
        size += p.grad.numel() * p.grad.element_size()
    if bucket:
        _all_reduce(bucket)


def check_same_weights(params: Sequence[torch.nn.Parameter]) -> None:
    """RuntimeError unless every rank holds the same weights after training, frozen ones too (by
    per-parameter sums, exactly): a follower's copy of the policy gone wrong (`follow`) shows here."""
    with torch.no_grad():
        digest = [(float(p.double().sum()), float(p.double().abs().sum())) for p in params]
    every = gather(digest)
    if any(d != every[0] for d in every):
        raise RuntimeError(
            "data parallel: the ranks' weights differ after training (they did not start from the same policy)"
        )


def _all_reduce(grads: list[torch.Tensor]) -> None:
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


FRAMEWORK = Framework(
    gradient_norm=gradient_norm,
    name="torch",
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
    # the log-softmax its cross-entropy keeps, the one-hot gradient it receives and the gradient it returns;
    # counted live by tests/models/train/test_training_peak.py (two fails five of its six cases)
    head_chunk_copies=3,
    world=world,
    gather=gather,
)
