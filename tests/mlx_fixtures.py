"""Helpers shared by the MLX tests: skip cleanly where mlx is absent, and make LoRA adapters
whose B matrices are non-zero (a fresh adapter is exactly the base model, so parity on it
would prove nothing)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from outcome_flywheel.models.interface import LoraSettings
from outcome_flywheel.models.prompts import trading_note_messages

MLX_REASON = "mlx is not importable here (install the `mlx` extra: pip install -e '.[mlx]')"

# Log-probs across backends are compared per token within their fp32 rounding bound
# (tests/tolerances.py: `logprob_tolerances`), which grows with the model's depth and the logits'
# size; the flat TOL = 1e-4 that stood here held only on the machines it was tuned on.

PROMPTS = [
    trading_note_messages("Nvidia beats quarterly estimates on strong data center demand", "Revenue rose 12%."),
    trading_note_messages("Exxon Mobil cuts outlook, shares slide after hours"),
    trading_note_messages("Apple announces $40 billion share buyback", "The board approved it."),
]

RESPONSES = [
    "Trade Recommendation: Buy NVDA.\nRationale: data center demand keeps beating.\nStop Loss: 6% below entry.",
    "Trade Recommendation: Sell XOM.\nRisk Factors: oil could rebound.",
    "Timeframe: 2-4 weeks.",
]

SMALL_LORA = LoraSettings(r=4, alpha=8)


def require_mlx():
    return pytest.importorskip("mlx.core", reason=MLX_REASON)


def perturb_mlx_lora(backend, seed: int = 7, std: float = 0.05) -> None:
    """Give every mlx LoRA B matrix (and A, for good measure) random non-zero values."""
    import mlx.core as mx

    key = mx.random.key(seed)
    for _, module in backend.lora_modules():
        key, ka, kb = mx.random.split(key, 3)
        module.lora_a = module.lora_a + mx.random.normal(module.lora_a.shape, key=ka) * std
        module.lora_b = mx.random.normal(module.lora_b.shape, key=kb) * std
    mx.eval(backend.model.parameters())


def perturb_torch_lora(backend, seed: int = 11, std: float = 0.05) -> None:
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in backend.model.named_parameters():
            if "lora_B" in name or "lora_A" in name:
                param.add_(torch.randn(param.shape, generator=gen) * std)


def max_abs_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    assert [len(x) for x in a] == [len(y) for y in b]
    return max(float(np.abs(np.asarray(x) - np.asarray(y)).max()) for x, y in zip(a, b))


def mlx_adapter_dir(tiny_model_dir: Path, out: Path, seed: int = 7) -> Path:
    """An adapter trained by nobody: mlx LoRA with random non-zero factors, saved (PEFT layout)."""
    from outcome_flywheel.models.mlx.backend import MLXBackend

    backend = MLXBackend(tiny_model_dir)
    backend.add_lora(SMALL_LORA)
    perturb_mlx_lora(backend, seed)
    backend.save(out)
    return out
