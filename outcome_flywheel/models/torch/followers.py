"""A data-parallel step's ranks together (`steps/entry.py`), over the process group of
`training.init_from_env`: rank 0 leads its training and rollout sampling (`lead`, `finish`), the other
ranks follow it (`follow`), and every rank ends its process once the step has succeeded (`end_process`).
Torch only: mlx trains in one process.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, Callable, Mapping, NoReturn

import numpy as np
import torch
import torch.distributed as dist

from outcome_flywheel.models.torch.training import initialised

# A step (the daily update, the preference adapter, distillation) runs its whole body on rank 0: judging,
# the gate, the warehouse and checkpoint writes. Each trainer it calls, and the day's rollout sampling,
# is announced (`train/shards.py`): rank 0 hands the other ranks the call (trainer or sampling, its
# arguments), the policy as it stands (base, adapter layout, every weight, AdamW's saved moments, the
# torch generator's state for a fresh adapter's init, the sampler) and they make the same call on their
# shards; they write nothing and keep nothing.

SHARED_CALLS = {
    "gspo": ("outcome_flywheel.models.train.gspo", "train_gspo"),
    "dpo": ("outcome_flywheel.models.train.dpo", "train_weighted_dpo"),
    "sft": ("outcome_flywheel.models.train.sft", "train_sft"),
    "sample": ("outcome_flywheel.models.train.shards", "sample_across_ranks"),
}


def _control(obj: Any = None) -> Any:
    """Rank 0's `obj`, on every rank."""
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _sync_weights(model: torch.nn.Module) -> None:
    for tensor in [*model.parameters(), *model.buffers()]:
        dist.broadcast(tensor.data, src=0)


def _layout(arrays: Mapping[str, np.ndarray] | None) -> list[tuple[str, tuple[int, ...], str]] | None:
    """(name, shape, dtype) of each array: what the other ranks allocate before `_broadcast_arrays`."""
    if arrays is None:
        return None
    return [(name, tuple(np.shape(a)), np.asarray(a).dtype.str) for name, a in arrays.items()]


def _broadcast_arrays(
    arrays: Mapping[str, np.ndarray] | None, layout: list | None, device: torch.device
) -> dict[str, np.ndarray] | None:
    """Rank 0's `arrays` on every rank, one tensor broadcast each over `device` (the process group's:
    CUDA under NCCL). Not pickled with the control message: AdamW's moments of a full fine-tune are
    twice the weights (4.8 GB at 0.6B), which a pickle would copy whole into host and device memory."""
    if layout is None:
        return None
    out = {}
    for name, shape, dtype in layout:
        # np.array keeps a 0-d array (the step count) 0-d, where np.ascontiguousarray would make it 1-d
        array = np.array(arrays[name], order="C") if arrays is not None else np.empty(shape, dtype=np.dtype(dtype))
        tensor = torch.from_numpy(array).to(device)
        dist.broadcast(tensor, src=0)
        out[name] = arrays[name] if arrays is not None else tensor.cpu().numpy()
    return out


def lead(trainer: str, backend: Any, args: tuple) -> None:
    """Rank 0, as a trainer (or the sampling) starts: the call and the policy to the other ranks (`follow`)."""
    peft = getattr(backend.model, "peft_config", None)
    spec = {
        "model_path": str(backend.model_path),
        "device": backend.device.type,
        "dtype": str(backend.dtype).rsplit(".", 1)[-1],
        "master_weights": bool(getattr(backend, "master_weights", False)),
        "lora": peft[backend.model.active_adapter].to_dict() if peft else None,
        # the layout of AdamW's saved moments, sent as tensors after the weights: GSPO resumes them
        # (DPO and SFT start fresh)
        "moments": _layout(backend.optimizer_tensors if trainer == "gspo" else None),
        "rng": torch.get_rng_state(),
        "sampler": getattr(backend, "sampler", "torch"),
        "static_decode": bool(getattr(backend, "static_decode", False)),
        "training": bool(backend.model.training),
    }
    _control(("train", trainer, spec, args))
    _sync_weights(backend.model)
    _broadcast_arrays(backend.optimizer_tensors if spec["moments"] else None, spec["moments"], _wire(backend))


def _wire(backend: Any) -> torch.device:
    """Where the process group's tensors travel: the backend's CUDA card under NCCL, else the CPU (gloo)."""
    return backend.device if dist.get_backend() == "nccl" else torch.device("cpu")


def finish() -> None:
    """Rank 0, its step done: the other ranks' `follow` returns."""
    _control(("done",))


def end_process() -> NoReturn:
    """Every rank, once the step has succeeded: wait for the others, flush this process's output and
    end it at once (`os._exit(0)`), without the interpreter's teardown. In that teardown gloo's worker
    threads can abort a process whose work is done (SIGABRT, "terminate called without an active
    exception"; pytorch/pytorch#190489), which fails a step whose outputs are written. On the CPU box:
    6 of 25 torchrun runs of two gloo ranks that gathered and broadcast objects, then exited, 0 of 25
    after a barrier and `destroy_process_group`; but a real two-process step still aborted after
    those (1 of 4 full test runs), so the teardown is skipped altogether. Not after a failure, where
    another rank may be inside a collective and would never reach the barrier (the launcher stops
    the ranks instead)."""
    if initialised():
        dist.barrier()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def follow(policy: Callable[[Mapping], Any]) -> int:
    """Ranks > 0 of a step: make each call rank 0 announces (a trainer, the sampling) on a copy of its
    policy (`policy(spec)`: a `TorchBackend` of rank 0's base, device type, dtype and sampler), until it
    is done; the number of calls joined. Each copy is dropped, its sampler's memory released, after its call."""
    import importlib

    joined = 0
    while True:
        message = _control()
        if message[0] == "done":
            return joined
        _, trainer, spec, args = message
        backend = policy(spec)
        if spec["lora"] is not None:
            from peft import get_peft_config, get_peft_model

            config = dict(spec["lora"], inference_mode=False)
            backend.model = get_peft_model(backend.model, get_peft_config(config))
        _sync_weights(backend.model)
        backend.model.train(spec["training"])
        backend.optimizer_tensors = _broadcast_arrays(None, spec["moments"], _wire(backend))
        torch.set_rng_state(spec["rng"])
        module, name = SHARED_CALLS[trainer]
        getattr(importlib.import_module(module), name)(backend, *args)
        backend.release_inference_state()
        del backend
        joined += 1
