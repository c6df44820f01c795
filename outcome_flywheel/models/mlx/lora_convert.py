"""LoRA adapters between PEFT (PyTorch) and mlx-lm layouts, both ways.

The two frameworks hold the same low-rank update with transposed factors and a different
way of writing its scale:

    PEFT     y = x W^T + (alpha / r) * x A^T B^T     A = lora_A.weight [r, in], B = lora_B.weight [out, r]
    mlx-lm   y = x W^T + scale * (x a) b             a = lora_a [in, r],        b = lora_b [r, out]

so a = A^T, b = B^T and scale = alpha / r (alpha / sqrt(r) for rsLoRA). On disk:

    PEFT     adapter_config.json (peft_type LORA, r, lora_alpha, target_modules, ...)
             adapter_model.safetensors  base_model.model.<module>.lora_A.weight
    mlx-lm   adapter_config.json (fine_tune_type lora, num_layers, lora_parameters{rank, scale, dropout, keys})
             adapters.safetensors       <module>.lora_a

`<module>` (e.g. `model.layers.3.self_attn.q_proj`) is the same in transformers and mlx-lm
for the Qwen/Llama families. The functions below work on plain dicts of NumPy arrays, so
they need neither torch nor mlx; `convert_dir` and the CLI do the file handling:

    python -m outcome_flywheel.models.mlx.lora_convert peft-to-mlx  adapters/preference/latest  /tmp/mlx-adapter
    python -m outcome_flywheel.models.mlx.lora_convert mlx-to-peft  ~/mlx-adapter               /tmp/peft-adapter
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np

PEFT_WEIGHTS = "adapter_model.safetensors"
MLX_WEIGHTS = "adapters.safetensors"
CONFIG = "adapter_config.json"
PEFT_PREFIX = "base_model.model."

_PEFT_KEY = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<which>[AB])(?:\.[^.]+)?\.weight$")
_MLX_KEY = re.compile(r"^(?P<module>.+)\.lora_(?P<which>[ab])$")
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.(.+)$")


class AdapterFormatError(ValueError):
    """The adapter is not a plain LoRA adapter this converter understands."""


def peft_scale(peft_config: dict[str, Any]) -> float:
    """The factor PEFT multiplies B A by: alpha / r, or alpha / sqrt(r) with rsLoRA."""
    r, alpha = peft_config["r"], peft_config["lora_alpha"]
    return float(alpha) / (math.sqrt(r) if peft_config.get("use_rslora") else float(r))


def _check_peft_config(peft_config: dict[str, Any]) -> None:
    if str(peft_config.get("peft_type", "LORA")).upper() != "LORA":
        raise AdapterFormatError(f"not a LoRA adapter: peft_type={peft_config.get('peft_type')!r}")
    for unsupported in ("rank_pattern", "alpha_pattern"):
        if peft_config.get(unsupported):
            raise AdapterFormatError(f"per-module {unsupported} is not supported by mlx-lm's single LoRA scale")
    if peft_config.get("use_dora"):
        raise AdapterFormatError("DoRA adapters are not converted")
    if peft_config.get("fan_in_fan_out"):
        raise AdapterFormatError("fan_in_fan_out (Conv1D) adapters are not converted")
    if peft_config.get("bias", "none") != "none":
        raise AdapterFormatError("adapters that train biases are not converted")


def _layer_split(module: str) -> tuple[int, str]:
    """`model.layers.3.self_attn.q_proj` -> (3, `self_attn.q_proj`)."""
    match = _LAYER.search(module)
    if not match:
        raise AdapterFormatError(f"LoRA on {module!r} is outside the transformer blocks; mlx-lm keys are per block")
    return int(match.group(1)), match.group(2)


def peft_to_mlx(
    tensors: dict[str, np.ndarray], peft_config: dict[str, Any]
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """PEFT state dict + config -> mlx-lm adapter tensors + mlx-lm adapter_config."""
    _check_peft_config(peft_config)
    out: dict[str, np.ndarray] = {}
    keys: set[str] = set()
    layers: set[int] = set()
    for name, value in tensors.items():
        match = _PEFT_KEY.match(name)
        if not match:
            raise AdapterFormatError(f"unexpected tensor in a PEFT LoRA adapter: {name!r}")
        module, which = match.group("module"), match.group("which")
        layer, key = _layer_split(module)
        layers.add(layer)
        keys.add(key)
        # PEFT stores A as [r, in] and B as [out, r]; mlx-lm multiplies x @ a @ b.
        out[f"{module}.lora_{which.lower()}"] = np.ascontiguousarray(np.asarray(value).T)
    if not out:
        raise AdapterFormatError("the PEFT adapter holds no LoRA tensors")
    # mlx-lm puts LoRA on the last `num_layers` blocks; a full-model PEFT adapter covers them all.
    num_layers = max(layers) - min(layers) + 1
    mlx_config = {
        "fine_tune_type": "lora",
        "num_layers": num_layers,
        "lora_parameters": {
            "rank": int(peft_config["r"]),
            "scale": peft_scale(peft_config),
            "dropout": float(peft_config.get("lora_dropout", 0.0) or 0.0),
            "keys": sorted(keys),
        },
    }
    if peft_config.get("base_model_name_or_path"):
        mlx_config["model"] = peft_config["base_model_name_or_path"]
    return out, mlx_config


def mlx_to_peft(
    tensors: dict[str, np.ndarray], mlx_config: dict[str, Any], base_model_name_or_path: str | None = None
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """mlx-lm adapter tensors + adapter_config -> PEFT state dict + adapter_config (alpha = scale * r)."""
    fine_tune_type = mlx_config.get("fine_tune_type", "lora")
    if fine_tune_type != "lora":
        raise AdapterFormatError(f"only LoRA adapters convert to PEFT, not {fine_tune_type!r}")
    params = mlx_config["lora_parameters"]
    rank, scale = int(params["rank"]), float(params["scale"])
    out: dict[str, np.ndarray] = {}
    targets: set[str] = set()
    layers: set[int] = set()
    for name, value in tensors.items():
        match = _MLX_KEY.match(name)
        if not match:
            raise AdapterFormatError(f"unexpected tensor in an mlx-lm LoRA adapter: {name!r}")
        module, which = match.group("module"), match.group("which")
        layer, key = _layer_split(module)
        layers.add(layer)
        targets.add(key.rsplit(".", 1)[-1])
        out[f"{PEFT_PREFIX}{module}.lora_{which.upper()}.weight"] = np.ascontiguousarray(np.asarray(value).T)
    if not out:
        raise AdapterFormatError("the mlx-lm adapter holds no LoRA tensors")
    alpha = scale * rank
    peft_config: dict[str, Any] = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model_name_or_path or mlx_config.get("model"),
        "r": rank,
        "lora_alpha": int(alpha) if float(alpha).is_integer() else alpha,
        "lora_dropout": float(params.get("dropout", 0.0)),
        "target_modules": sorted(targets),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "inference_mode": True,
        "init_lora_weights": True,
    }
    if min(layers) > 0:  # mlx-lm adapted only the last blocks
        peft_config["layers_to_transform"] = sorted(layers)
    return out, peft_config


# -- files ---------------------------------------------------------------------------------
def load_tensors(path: Path) -> dict[str, np.ndarray]:
    """Safetensors as NumPy float arrays (bf16 is widened to fp32, which is lossless)."""
    from safetensors.numpy import load_file

    try:
        return load_file(str(path))
    except (TypeError, ValueError):  # NumPy has no bfloat16: read through a framework that does
        try:
            import torch
            from safetensors.torch import load_file as load_torch

            return {k: v.to(torch.float32).numpy() for k, v in load_torch(str(path)).items()}
        except ImportError:
            import mlx.core as mx

            return {k: np.array(v.astype(mx.float32)) for k, v in mx.load(str(path)).items()}


def save_tensors(tensors: dict[str, np.ndarray], path: Path) -> None:
    from safetensors.numpy import save_file

    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(path), metadata={"format": "pt"})


def detect_layout(path: Path) -> str:
    """'peft' or 'mlx', from the weight file an adapter folder holds."""
    path = Path(path)
    if (path / PEFT_WEIGHTS).exists():
        return "peft"
    if (path / MLX_WEIGHTS).exists():
        return "mlx"
    raise FileNotFoundError(f"{path} holds neither {PEFT_WEIGHTS} (PEFT) nor {MLX_WEIGHTS} (mlx-lm)")


def read_adapter(path: Path) -> tuple[str, dict[str, np.ndarray], dict[str, Any]]:
    """(layout, tensors, config) of an adapter folder in either layout."""
    path = Path(path)
    layout = detect_layout(path)
    config = json.loads((path / CONFIG).read_text())
    tensors = load_tensors(path / (PEFT_WEIGHTS if layout == "peft" else MLX_WEIGHTS))
    return layout, tensors, config


def write_adapter(path: Path, layout: str, tensors: dict[str, np.ndarray], config: dict[str, Any]) -> Path:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_tensors(tensors, path / (PEFT_WEIGHTS if layout == "peft" else MLX_WEIGHTS))
    (path / CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return path


def convert_dir(src: Path, dst: Path, direction: str, base_model_name_or_path: str | None = None) -> Path:
    """Convert the adapter folder `src` into `dst`; `direction` is 'peft-to-mlx' or 'mlx-to-peft'."""
    layout, tensors, config = read_adapter(Path(src))
    if direction == "peft-to-mlx":
        if layout != "peft":
            raise AdapterFormatError(f"{src} is an mlx-lm adapter, not PEFT")
        out, out_config = peft_to_mlx(tensors, config)
        return write_adapter(dst, "mlx", out, out_config)
    if direction == "mlx-to-peft":
        if layout != "mlx":
            raise AdapterFormatError(f"{src} is a PEFT adapter, not mlx-lm")
        out, out_config = mlx_to_peft(tensors, config, base_model_name_or_path)
        return write_adapter(dst, "peft", out, out_config)
    raise ValueError(f"direction must be 'peft-to-mlx' or 'mlx-to-peft', got {direction!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m outcome_flywheel.models.mlx.lora_convert", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("direction", choices=["peft-to-mlx", "mlx-to-peft"])
    parser.add_argument("src", type=Path, help="adapter folder to read")
    parser.add_argument("dst", type=Path, help="adapter folder to write (created)")
    parser.add_argument("--base-model", default=None, help="base_model_name_or_path to record in a PEFT config")
    args = parser.parse_args(argv)
    out = convert_dir(args.src, args.dst, args.direction, args.base_model)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
