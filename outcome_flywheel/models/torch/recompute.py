"""Activation recomputation (gradient checkpointing, Chen et al. 2016, "Training Deep Nets with
Sublinear Memory Cost"): within `recomputing`, each decoder layer of a training forward keeps only
its input for the backward pass and runs its forward again when the backward reaches it, so a
token costs each layer's input and one layer's activations at a time instead of every layer's
(`train/memory.py` counts both). One more forward a step, in exchange for a minibatch taken whole
where the budget would otherwise cut it into micro-batches, each of which repeats the step's
launches (on an H200 a LoRA GSPO step is launch-bound: 2 parts took 47 % more host time).

torch's non-reentrant `torch.utils.checkpoint` (keyword arguments, the autocast state and the RNG
restored for the recomputation). Not transformers' `gradient_checkpointing_enable`, which drops the
`past_key_values` of the responses' forward (their shared prompt, `prefix_cache.py`). A layer is
recomputed only where running it again leaves its cache as it was: no cache, the responses'
read-only `PromptPrefixCache`, or the prompt's own `PromptForwardCache`; any other cache would be
grown twice. The recomputation runs in the backward pass, outside the forward's
`precision.forward_precision` and `attention_kernels` contexts, so it enters the same ones for its
layer: the recomputed tensors match the kept ones.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch.utils.checkpoint import checkpoint

from outcome_flywheel.models.torch.precision import (
    adapter_autocast,
    adapter_input_cast_off,
    lean_norms,
    uses_lean_norms,
)
from outcome_flywheel.models.torch.prefix_cache import PromptForwardCache, PromptPrefixCache
from outcome_flywheel.models.torch.static_cache import attention_kernels


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of a transformers causal LM (under a PEFT wrapper or not)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    layers = getattr(getattr(inner, "model", inner), "layers", None)
    if layers is None:
        raise ValueError(f"{type(inner).__name__} has no decoder layers at .model.layers to recompute")
    return list(layers)


@contextlib.contextmanager
def recomputing(backend: Any, on: bool = True) -> Iterator[None]:
    """Within: `backend.model`'s decoder layers recompute their activations in the backward pass
    (module docstring) when autograd records them; their forwards restored after. A no-op when not `on`."""
    if not on:
        yield
        return
    layers = [layer for layer in decoder_layers(backend.model) if "forward" not in vars(layer)]
    for layer in layers:
        layer.forward = _recomputed_forward(layer, backend)
    try:
        yield
    finally:
        for layer in layers:
            del layer.forward


def _recomputed_forward(layer: torch.nn.Module, backend: Any):
    forward = type(layer).forward
    device, lean, cast_off = backend.device, uses_lean_norms(backend), adapter_autocast(backend)

    def recomputable(*args, **kwargs):
        with contextlib.ExitStack() as stack:  # the forward's contexts, for the recomputation in the backward
            stack.enter_context(attention_kernels(device))
            if lean:
                stack.enter_context(lean_norms(layer))
            if cast_off:
                stack.enter_context(adapter_input_cast_off(layer))
            return forward(layer, *args, **kwargs)

    def run(*args, **kwargs):
        if not torch.is_grad_enabled() or not _recomputable(kwargs.get("past_key_values")):
            return forward(layer, *args, **kwargs)
        return checkpoint(recomputable, *args, use_reentrant=False, **kwargs)

    return run


def _recomputable(cache: Any) -> bool:
    return cache is None or isinstance(cache, (PromptPrefixCache, PromptForwardCache))
