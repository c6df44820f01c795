"""How a teacher-forced (training) forward computes on a half-precision model, and the memory that
saves (`train/memory.py` counts what is kept):

- Over float32 master weights (full fine-tuning), autocast in the compute dtype.
- Over a float32 LoRA adapter (PEFT's default on a bf16 model), autocast too, with PEFT's cast of
  each adapter's input to float32 turned off: autocast casts the adapter's weights instead, so an
  adapter keeps for its backward the bf16 input its base layer already holds, not a float32 copy
  (31 KB of a LoRA token's 92 a layer on qwen3-0.6b), as a bf16 autocast run of PEFT computes anyway.
  The weights, their gradients and AdamW's moments stay float32.
- RMSNorm keeps its input as it came for the backward pass instead of the float32 copy
  transformers' RMSNorm makes (10 KB more): `RMSNormFunction`, whose forward is transformers'
  arithmetic op for op (`LlamaRMSNorm`, `Qwen2RMSNorm`, `Qwen3RMSNorm`, `MistralRMSNorm` are one
  formula), so the values are the same bit for bit, and whose backward recomputes the float32
  normalisation from the kept input and the row's reciprocal root (the standard RMSNorm gradient,
  as fused training kernels such as Liger's do), equal to autograd's to float32 rounding.
The sampler keeps the modules as they are (PEFT's float32 adapter arithmetic, transformers' norms).
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from typing import Iterator

import torch

from outcome_flywheel.models.torch.fused_decode import inverse_rms

NORMS = ("LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "MistralRMSNorm")


class RMSNormFunction(torch.autograd.Function):
    """`weight * (x32 * rsqrt(mean(x32^2) + eps)).to(x.dtype)` with x32 = x in float32."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        x32 = x.to(torch.float32)
        rstd = inverse_rms(x32, eps)
        ctx.save_for_backward(x, weight, rstd)
        return weight * (x32 * rstd).to(x.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight, rstd = ctx.saved_tensors
        normed = x.to(torch.float32) * rstd
        grad_weight = None
        if ctx.needs_input_grad[1]:  # autograd's mul: the product in the weight's dtype, summed over the rows
            grad_weight = (grad * normed.to(x.dtype)).to(weight.dtype)
            grad_weight = grad_weight.reshape(-1, grad_weight.shape[-1]).sum(0)
        # back through the cast to x's dtype, then d/dx of x32 * rsqrt(mean(x32^2) + eps)
        grad_normed = (grad * weight).to(x.dtype).to(torch.float32)
        grad_x = rstd * (grad_normed - normed * (grad_normed * normed).mean(-1, keepdim=True))
        return grad_x.to(x.dtype), grad_weight, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return RMSNormFunction.apply(x, weight, eps)


def _forward(module: torch.nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    return rms_norm(hidden_states, module.weight, module.variance_epsilon)


# A model's norms of `NORMS` and its PEFT tuner layers, found once per model object: its module tree
# does not change (a new adapter is a new PeftModel), and walking ~2,400 modules of a LoRA qwen3-0.6b
# on every forward cost ~10 ms of Python (PEFT's `disable_input_dtype_casting` walks them twice).
_LAYERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _layers(model: torch.nn.Module) -> tuple[list[torch.nn.Module], list[torch.nn.Module]]:
    if model not in _LAYERS:
        from peft.tuners.tuners_utils import BaseTunerLayer

        modules = list(model.modules())
        _LAYERS[model] = (
            [m for m in modules if type(m).__name__ in NORMS],
            [m for m in modules if isinstance(m, BaseTunerLayer)],
        )
    return _LAYERS[model]


@contextlib.contextmanager
def lean_norms(model: torch.nn.Module) -> Iterator[None]:
    """Within: every RMSNorm of `NORMS` in `model` runs through `rms_norm` (an instance `forward`
    shadows the class's; removed after, whatever happens inside)."""
    patched = [m for m in _layers(model)[0] if "forward" not in vars(m)]
    for module in patched:
        module.forward = functools.partial(_forward, module)
    try:
        yield
    finally:
        for module in patched:
            del module.forward


@contextlib.contextmanager
def adapter_input_cast_off(model: torch.nn.Module) -> Iterator[None]:
    """Within: PEFT's layers leave their input in its dtype (their `cast_input_dtype_enabled` switch,
    what `peft.helpers.disable_input_dtype_casting` sets, over the layers found once); restored after."""
    layers = _layers(model)[1]
    before = [getattr(layer, "cast_input_dtype_enabled", True) for layer in layers]
    for layer in layers:
        layer.cast_input_dtype_enabled = False
    try:
        yield
    finally:
        for layer, enabled in zip(layers, before):
            layer.cast_input_dtype_enabled = enabled


def adapter_autocast(backend) -> bool:
    """Whether a float32 LoRA adapter sits on a half-precision model (not over master weights)."""
    if backend.master_weights or backend.dtype == torch.float32 or not backend.has_adapter:
        return False
    return any(p.dtype == torch.float32 for n, p in backend.model.named_parameters() if "lora_A" in n)


@contextlib.contextmanager
def forward_precision(backend) -> Iterator[None]:
    """The context of a teacher-forced forward of `backend` (a `TorchBackend`): the module docstring."""
    with contextlib.ExitStack() as stack:
        if adapter_autocast(backend):
            stack.enter_context(torch.autocast(device_type=backend.device.type, dtype=backend.dtype))
            stack.enter_context(adapter_input_cast_off(backend.model))
        else:
            stack.enter_context(backend.autocast())
        if uses_lean_norms(backend):
            stack.enter_context(lean_norms(backend.model))
        yield


def uses_lean_norms(backend) -> bool:
    """Whether the forward's RMSNorms keep their inputs (a half-precision model of `NORMS`)."""
    return backend.dtype != torch.float32 and bool(_layers(backend.model)[0])
