"""Training within a memory budget: a minibatch whose activations would not fit is taken in
micro-batches whose gradients add up to the minibatch's (gradient accumulation). The effective
batch and the update stay what they were; only the peak falls. Each trainer scales a part's loss
by its share of the minibatch's (`interface.Accumulated`), so the sum is the minibatch's loss.

The budget: `FLYWHEEL_TRAIN_MEMORY_GIB` when set (also on the CPU), else what the accelerator has
free when the training starts (`Framework.free_memory`: CUDA's free memory, or Metal's recommended
working set less what is in use) times `FREE_SHARE`; none on the CPU, whose memory the operating
system shares out (set the variable there). It is what a step may add to the loaded model: the
gradients and AdamW's moments of the weights that train come out of it first, the activations get
the rest, so a step's peak is about the model plus the budget.

The cost of a token: the activations autograd keeps for the backward pass of a Llama / Qwen block,
counted tensor by tensor (`tests/models/train/test_micro_batches.py` checks the count against what
`torch.autograd.graph.saved_tensors_hooks` sees), per token and layer, with h the width, q and k
the query and key-value widths (heads x head dim), i the MLP's width and e the compute dtype's bytes:
- the two RMSNorms' float32 copies, 2 x 4h, and Qwen3's per-head q/k norms', 4(q + k);
- the rotated queries and the attention's output, 2 x q e; the rotated keys and the values, 2 x k e;
- the MLP's gate, up and activation, 3 x i e;
- what the weights' gradients need. Full fine-tuning: each projection's input, e(2h + i) besides
  the attention's output, and each norm's output, e(2h + q + k).
  LoRA: each adapter's input, which PEFT casts to the adapter's float32 one layer at a time
  (5h + q + i values in float32 with all seven projections adapted, the project's default), or in
  the compute dtype when the adapter is kept in it (e(2h + i): the inputs are shared), and each
  adapter's rank-r output, 7r (no LoRA dropout, the project's default).
For qwen3-0.6b in bf16 with LoRA this is 92 KB per token and layer. The count it replaced,
Korthikanti et al. 2022's ~(10h + 4i) e for a GPT block, gave 45 KB, while the GSPO and DPO peaks
measured on an H200 came to ~85-91 KB: a budget's minibatches peaked at twice what it allowed. The head's log-softmax runs in checkpointed chunks and is
left out. MLX keeps another set (its LoRA does not cast the input); the count is torch's.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Sequence

MEMORY_VARIABLE = "FLYWHEEL_TRAIN_MEMORY_GIB"
FREE_SHARE = 0.8  # of the free memory: the allocator's fragmentation and the optimiser's first step need room


def budget_bytes(backend: Any) -> int | None:
    """The activation budget of one optimiser step in bytes, or None (no limit: whole minibatches):
    the step's memory (the setting, or a share of what is free) less the gradients and AdamW
    moments of the weights that train (`training_state_bytes`)."""
    value = os.environ.get(MEMORY_VARIABLE, "").strip()
    if value:
        try:
            gib = float(value)
        except ValueError as err:
            raise ValueError(f"{MEMORY_VARIABLE}={value!r}: a number of GiB") from err
        if not 0 < gib < float("inf"):
            raise ValueError(f"{MEMORY_VARIABLE}={value!r}: a number of GiB above 0")
        return max(1, int(gib * 2**30) - training_state_bytes(backend))
    free = backend.framework.free_memory(backend) if backend.framework.free_memory is not None else None
    return max(1, int(free * FREE_SHARE) - training_state_bytes(backend)) if free else None


def training_state_bytes(backend: Any) -> int:
    """What a step holds besides activations: a gradient and AdamW's two moments for each weight
    that trains, in its dtype (float32 for a LoRA adapter or master weights), and under autocast
    over float32 master weights the compute-dtype copy autocast keeps of each through the forward
    and backward (measured on an H200 before it was counted: full fine-tuning of qwen3-0.6b under a
    14 GiB setting peaked 2.2 GiB above the model plus the setting)."""
    trainable = backend.framework.trainable_bytes(backend)
    state = 3 * trainable
    if getattr(backend, "master_weights", False):  # float32 weights, 4 bytes a value
        state += trainable // 4 * element_bytes(backend.dtype)
    return state


def element_bytes(dtype: Any) -> int:
    return 4 if "float32" in str(dtype) else 2


def bytes_per_token(backend: Any) -> int:
    """Activation bytes one token of a training forward keeps for the backward (module docstring)."""
    config = json.loads((Path(backend.model_path) / "config.json").read_text())
    config = config.get("text_config", config)  # multimodal configs nest the language model's
    h = int(config["hidden_size"])
    i = int(config.get("intermediate_size") or 4 * h)
    heads = int(config.get("num_attention_heads") or 1)
    head_dim = int(config.get("head_dim") or h // heads)
    q, k = heads * head_dim, int(config.get("num_key_value_heads") or heads) * head_dim
    e = element_bytes(backend.dtype)
    per_layer = 2 * 4 * h + 2 * q * e + 2 * k * e + 3 * i * e
    if config.get("model_type") == "qwen3":
        per_layer += 4 * (q + k)
    adapter = adapter_layout(backend)
    if adapter is None:  # the projections' inputs (the attention's output is one, counted), the norms' outputs
        per_layer += e * (2 * h + i) + e * (2 * h + (q + k if config.get("model_type") == "qwen3" else 0))
    else:
        element, rank = adapter
        per_layer += element * (5 * h + q + i) if element > e else e * (2 * h + i)
        per_layer += 7 * rank * element  # each adapter's A output
    return int(config["num_hidden_layers"]) * per_layer


def adapter_layout(backend: Any) -> tuple[int, int] | None:
    """`(bytes per value, rank)` of the LoRA adapter (PEFT keeps it in float32 under a bf16 model),
    or None when every weight trains."""
    if not backend.has_adapter:
        return None
    model = getattr(backend, "model", None)
    for name, parameter in getattr(model, "named_parameters", lambda: [])():
        if "lora_A" in name:
            return parameter.element_size(), int(parameter.shape[0])
    return element_bytes(backend.dtype), 0  # MLX: its adapter in the model's dtype


def token_limit(backend: Any) -> int | None:
    """Tokens (sequences x padded length) one forward may hold within the budget; None = no limit."""
    budget = budget_bytes(backend)
    return None if budget is None else max(1, budget // bytes_per_token(backend))


def split_by_tokens(items: Sequence[Any], lengths: Sequence[int], limit: int | None) -> list[list[Any]]:
    """`items` in order, cut into consecutive parts whose padded size (count x longest length) is at
    most `limit` tokens; a part holds one item at least (a sequence longer than the limit alone)."""
    if limit is None:
        return [list(items)]
    parts: list[list[Any]] = []
    part: list[Any] = []
    longest = 0
    for item, length in zip(items, lengths):
        if part and (len(part) + 1) * max(longest, length) > limit:
            parts.append(part)
            part, longest = [], 0
        part.append(item)
        longest = max(longest, int(length))
    if part:
        parts.append(part)
    return parts


def accumulated_steps(
    plan: Sequence[Sequence[int]],
    cost: Callable[[int], int],
    share: Callable[[int], float],
    limit: int | None,
    keep: Callable[[Sequence[int]], list[int]] | None = None,
) -> list:
    """One optimiser step per minibatch of item indices: the minibatch whole, or its parts within
    `limit` tokens (`cost(i)`: item i's padded tokens) as an `Accumulated` step, each part scaled by
    its items' `share` over the minibatch's (pairs for DPO, completion tokens for SFT). `keep(idx)`:
    the items of the minibatch this process trains on (a data-parallel rank's shard, `shards.py`);
    their parts are still scaled over the whole minibatch, and a rank holding none gets an empty step."""
    from outcome_flywheel.models.interface import Accumulated

    steps = []
    for idx in plan:
        mine = list(idx) if keep is None else keep(idx)
        parts = split_by_tokens(mine, [cost(i) for i in mine], limit) if mine else []
        total = sum(share(i) for i in idx)
        scaled = Accumulated(tuple(parts), tuple(sum(share(i) for i in p) / total for p in parts))
        steps.append(idx if keep is None and len(parts) == 1 else scaled)
    return steps


def part_count(steps: Sequence[Any]) -> int:
    """Forward passes the steps take (an `Accumulated` step: one per part)."""
    return sum(len(s.parts) if hasattr(s, "parts") else 1 for s in steps)
