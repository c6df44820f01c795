"""AdamW's state across days, in one framework-neutral layout (`Framework.optimizer_state` /
`load_optimizer_state` in `torch/training.py` and `mlx/training.py`; on disk beside the checkpoint
as `ModelBackend.OPTIMIZER_STATE_FILE`).

A fresh AdamW's first step is lr * m_hat / sqrt(v_hat) = lr * g / |g| = lr * sign(g): every trainable
weight moves by the full learning rate whatever the size of its gradient. Kept moments make a day's
first step the continuation of the last day's.

Layout, flat NumPy arrays (safetensors):

    <name>.exp_avg      float32, the first moment m (torch `exp_avg`, mlx `m`)
    <name>.exp_avg_sq   float32, the second moment v (torch `exp_avg_sq`, mlx `v`)
    step                int64 [], the steps taken (torch `state["step"]`, mlx `state["step"]`)

`<name>` is the weight's name in the checkpoint's files: the PEFT adapter key
(`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`) for LoRA, the transformers name
(`model.layers.0.mlp.down_proj.weight`) for full weights, and the moment has that tensor's shape
(PEFT's [r, in] for lora_A even where mlx holds [in, r]), so a state saved by one framework resumes
in the other. Both frameworks count `step` the same way: the next step is step + 1 and its bias
corrections are 1 - beta1^(step+1) and 1 - beta2^(step+1) (torch.optim.AdamW; mlx AdamW with
bias_correction=True, as `mlx/training.adamw` makes it).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

MOMENTS = ("exp_avg", "exp_avg_sq")
STEP = "step"


def flat_state(moments: Mapping[str, tuple[np.ndarray, np.ndarray]], step: int) -> dict[str, np.ndarray]:
    """{checkpoint name: (m, v)} and the step count -> the flat layout above."""
    out = {STEP: np.array(int(step), dtype=np.int64)}
    for name, pair in moments.items():
        for key, value in zip(MOMENTS, pair):
            out[f"{name}.{key}"] = np.ascontiguousarray(np.asarray(value, dtype=np.float32))
    return out


def check_state(tensors: Mapping[str, np.ndarray], shapes: Mapping[str, tuple[int, ...]]) -> int:
    """The step count of `tensors` once they hold exactly the moments of the parameters `shapes`
    ({checkpoint name: shape}); a ValueError naming the mismatch otherwise (another LoRA rank,
    other target modules, LoRA against full weights)."""
    if STEP not in tensors:
        raise ValueError(f"optimizer state without a {STEP!r} count")
    step = np.asarray(tensors[STEP])
    if step.size != 1 or not np.issubdtype(step.dtype, np.integer) or int(step.reshape(())) < 0:
        raise ValueError(f"optimizer state {STEP!r} must be one non-negative integer, got {step!r}")
    expected = {f"{name}.{key}": tuple(shape) for name, shape in shapes.items() for key in MOMENTS}
    missing = sorted(set(expected) - set(tensors))
    unknown = sorted(set(tensors) - set(expected) - {STEP})
    if missing or unknown:
        raise ValueError(
            f"optimizer state does not fit the trainable parameters: {len(missing)} missing "
            f"(e.g. {missing[:3]}), {len(unknown)} not trainable here (e.g. {unknown[:3]})"
        )
    wrong = [(k, tuple(np.shape(tensors[k])), s) for k, s in expected.items() if tuple(np.shape(tensors[k])) != s]
    if wrong:
        examples = ", ".join(f"{k}: saved {a} vs {b} here" for k, a, b in wrong[:3])
        raise ValueError(
            f"optimizer state does not fit the trainable parameters: {len(wrong)} shapes differ ({examples})"
        )
    return int(step.reshape(()))
