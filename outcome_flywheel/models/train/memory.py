"""Training within a memory budget: a minibatch whose activations would not fit is taken in
micro-batches whose gradients add up to the minibatch's (gradient accumulation). The effective
batch and the update stay what they were; only the peak falls. Each trainer scales a part's loss
by its share of the minibatch's (`interface.Accumulated`), so the sum is the minibatch's loss.

The budget: `FLYWHEEL_TRAIN_MEMORY_GIB` when set (also on the CPU), else what the accelerator has
free when the training starts (`Framework.free_memory`: CUDA's free memory, or Metal's recommended
working set less what is in use) times `FREE_SHARE`; none on the CPU, whose memory the operating
system shares out (set the variable there). It is what a step may add to the loaded model: what
the step holds whatever its batch comes out of it first (the gradients and AdamW's moments of the
weights that train), then the head's log-softmax chunk, and the activations get the rest, so a
step's peak is the model plus the budget at most. `tests/models/train/test_training_peak.py`
counts the live tensors of whole GSPO, DPO and SFT steps on the CPU and holds them to it.

The cost of a token: the activations autograd keeps for the backward pass of a Llama / Qwen block,
counted tensor by tensor (`tests/models/train/test_micro_batches.py` checks the count against what
`torch.autograd.graph.saved_tensors_hooks` sees), per token and layer, with h the width, q and k
the query and key-value widths (heads x head dim), i the MLP's width and e the compute dtype's bytes:
- the two RMSNorms' float32 copies, 2 x 4h, and Qwen3's per-head q/k norms', 4(q + k); their inputs
  as they came where torch's training forward keeps those instead (`torch/precision.py`, half
  precision: 2eh, or 2 x 4h over float32 master weights, whose residual stream is float32, and e(q + k));
- the rotated queries and the attention's output, 2 x q e; the keys and values as attention keeps
  them, 2 x q e: with a mask (padding, a shared prompt) transformers' SDPA path repeats each
  key-value head for its query heads (`repeat_kv`) and the kernel keeps those copies (2 x k e
  without a mask, which the count then overstates);
- the MLP's gate, up and activation, 3 x i e;
- what the weights' gradients need. Full fine-tuning: each projection's input, e(2h + i) besides
  the attention's output, and each norm's output, e(2h + q + k) (not kept by torch's lean norms).
  LoRA: each adapter's input, which PEFT casts to the adapter's float32 one layer at a time
  (5h + q + i values in float32 with all seven projections adapted, the project's default), or in
  the compute dtype when the adapter is kept in it or its products run under autocast with that
  cast off, as torch's training forward runs a float32 adapter on a bf16 model
  (`TorchBackend.forward_precision`; e(2h + i): the inputs are shared), and each adapter's rank-r
  output, 7r (no LoRA dropout, the project's default).
For qwen3-0.6b in bf16 with LoRA this is 55 KB per token and layer (92 KB with PEFT's float32
copies and transformers' norms, before `torch/precision.py`; 51 KB with keys and values at their
own width, which with the masks below left an H200's GSPO peak ~1.5 GiB over the budget at 16 x 717
tokens of 28 layers, the rest of it transformers' cache grown by the responses' forward, which
`torch/prefix_cache.py` no longer keeps). With all of it, a budgeted LoRA GSPO step's peak on an
H200 (8 rows of 712 positions, 28 layers) came to 7.25 GiB by CUDA's allocator history, 7.26
counted (`benchmarks.training_profile --memory`). The count it replaced, Korthikanti et al. 2022's
~(10h + 4i) e for a GPT block, gave 45 KB, while the GSPO and DPO peaks measured on an H200 came to
~85-91 KB: a budget's minibatches peaked at twice what it allowed.
With the prompt shared (GSPO's prompt groups), a prompt token costs a whole token once per distinct
prompt and its keys and values per row (`prompt_row_share`). The head's log-softmax runs in
checkpointed chunks: up to a chunk, its cost grows with the tokens (`head_bytes`). The attention
mask's additive copy, one a layer, is quadratic in the length and counted by the rows' lengths
(`mask_share`). MLX keeps another set (its LoRA does not cast the input); the count is torch's.

Recomputation (`FLYWHEEL_TRAIN_RECOMPUTE`, `memory_plan`; `torch/recompute.py`, `mlx/recompute.py`):
each layer keeps its input only and runs its forward again when the backward pass reaches it, so a
token costs the layers' inputs (the residual stream's bytes x h each) and one layer's activations
(`bytes_per_token(recompute=True)`: 113 KB on qwen3-0.6b with LoRA in bf16, against 1.4 MB). The
count adds the head's chunk and one layer's activations although they are never alive together, so
it overstates. `auto` takes it where it needs fewer parts than keeping everything: a part repeats the
step's launches, recomputation one forward. On an H200 at a 13.5 GiB setting (16 rows of ~712
positions) a LoRA GSPO step took 2.37 s recomputed, 2.42 s whole and 3.80 s in 2 parts, and the full
fine-tune 3.12 s recomputed, 4.17 s whole and 4.75 s in 4 parts (`benchmarks.training_profile`); a
GPU whose kernels, not its launches, set the time would pay up to a third more for it.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Callable, NamedTuple, Sequence

from outcome_flywheel.settings import RULES, env

log = logging.getLogger(__name__)

MEMORY_VARIABLE = "FLYWHEEL_TRAIN_MEMORY_GIB"
FREE_SHARE = 0.8  # of the free memory: the allocator's fragmentation and the optimiser's first step need room


def budget_bytes(backend: Any) -> int | None:
    """What one optimiser step may add to the loaded model, less the gradients and AdamW moments of
    the weights that train (`training_state_bytes`): the bytes left for activations and the head's
    chunk, or None (no limit: whole minibatches)."""
    value = os.environ.get(MEMORY_VARIABLE, "").strip()
    if value:
        try:
            gib = float(value)
        except ValueError as err:
            raise ValueError(f"{MEMORY_VARIABLE}={value!r}: a number of GiB") from err
        if not 0 < gib < float("inf"):
            raise ValueError(f"{MEMORY_VARIABLE}={value!r}: a number of GiB above 0")
        return int(gib * 2**30) - training_state_bytes(backend)
    free = backend.framework.free_memory(backend) if backend.framework.free_memory is not None else None
    return int(free * FREE_SHARE) - training_state_bytes(backend) if free else None


def token_limit(backend: Any, recompute: bool = False) -> int | None:
    """Tokens (sequences x padded length) one forward may hold within the budget; None = no limit.
    A part of n tokens takes n x `bytes_per_token` (at `recompute`) of activations and the head's
    chunk at n tokens (`head_bytes`). When the budget leaves less than one token, each sequence goes alone, the least
    memory the trainer can take, and a warning says what the step holds whatever its batch."""
    budget = budget_bytes(backend)
    if budget is None:
        return None
    per_token, head_per_token, chunk = bytes_per_token(backend, recompute), head_bytes(backend, 1), head_rows(backend)
    if budget >= (per_token + head_per_token) * chunk:  # past a whole chunk the head costs no more
        return int((budget - head_per_token * chunk) // per_token)
    tokens = budget // (per_token + head_per_token)
    if tokens < 1:
        value = os.environ.get(MEMORY_VARIABLE, "").strip()
        log.warning(
            "%s leaves nothing for activations: a training step of this model holds %.2f GiB of gradients "
            "and AdamW moments of the trainable weights and up to %.2f GiB for the head's log-softmax "
            "whatever its batch; training one sequence at a time",
            f"{MEMORY_VARIABLE}={value}" if value else f"{FREE_SHARE:.0%} of the free memory",
            training_state_bytes(backend) / 2**30,
            head_bytes(backend) / 2**30,
        )
    return max(1, int(tokens))


def head_rows(backend: Any) -> int:
    """Tokens in one chunk of the head's log-softmax (at most the framework's `logit_chunk_elements`
    float32 logits); 0 when the framework does not say."""
    elements = backend.framework.logit_chunk_elements
    if not elements:
        return 0
    return max(1, elements // max(1, int(model_config(backend).get("vocab_size") or 1)))


def head_bytes(backend: Any, tokens: int | None = None) -> int:
    """The head's share of a step at `tokens` tokens (None: any number): its log-softmax runs a
    chunk at a time, recomputed in the backward pass, so one chunk's copies are alive at any moment
    however long the batch."""
    rows = head_rows(backend) if tokens is None else min(head_rows(backend), int(tokens))
    copies = backend.framework.head_chunk_copies
    return copies * 4 * rows * int(model_config(backend).get("vocab_size") or 0)


def training_state_bytes(backend: Any) -> int:
    """What a step holds besides activations: a gradient and AdamW's two moments for each weight
    that trains, in its dtype (float32 for a LoRA adapter or master weights), and where autocast
    runs float32 weights in the compute dtype (master weights; torch's float32 adapter on a bf16
    model) the compute-dtype copy it keeps of each through the forward and backward."""
    trainable = backend.framework.trainable_bytes(backend)
    state = 3 * trainable
    if getattr(backend, "master_weights", False) or getattr(backend, "adapter_autocast", False):
        state += trainable // 4 * element_bytes(backend.dtype)  # float32 weights, 4 bytes a value
    return state


def element_bytes(dtype: Any) -> int:
    return 4 if "float32" in str(dtype) else 2


def model_config(backend: Any) -> dict:
    """The language model's config.json (multimodal configs nest it as `text_config`)."""
    config = json.loads((Path(backend.model_path) / "config.json").read_text())
    return config.get("text_config", config)


def bytes_per_token(backend: Any, recompute: bool = False) -> int:
    """Activation bytes one token of a training forward keeps for the backward (module docstring).
    `recompute` (`torch/recompute.py`): each layer keeps only its input, one layer's activations
    are alive at a time (recomputed for its backward), and what the layers share counts once: the
    last layer's output, the final norm's output and the head's gathered rows, the rotary cos and sin."""
    config = model_config(backend)
    layers = int(config["num_hidden_layers"])
    if not recompute:
        return layers * layer_bytes(backend)
    h, e = int(config["hidden_size"]), element_bytes(backend.dtype)
    residual = 4 if getattr(backend, "master_weights", False) else e
    head_dim = int(config.get("head_dim") or h // int(config.get("num_attention_heads") or 1))
    return (layers + 1) * residual * h + 2 * e * h + 2 * head_dim * e + layer_bytes(backend)


def layer_bytes(backend: Any) -> int:
    """What one layer keeps per token for its backward (module docstring)."""
    config = model_config(backend)
    h = int(config["hidden_size"])
    i = int(config.get("intermediate_size") or 4 * h)
    q, k = attention_widths(config)
    e = element_bytes(backend.dtype)
    qk = q + k if config.get("model_type") == "qwen3" else 0  # Qwen3's per-head q/k norms
    lean = getattr(backend, "lean_norms", False)  # torch/precision.py: a norm keeps its input as it came
    residual = 4 if getattr(backend, "master_weights", False) else e  # the residual stream's bytes
    per_layer = 2 * (residual if lean else 4) * h + (e if lean else 4) * qk
    per_layer += 2 * q * e + 2 * q * e + 3 * i * e  # queries and output; keys and values repeated to q
    adapter = adapter_layout(backend)
    if adapter is None:  # the projections' inputs (the attention's output is one, counted), the norms' outputs
        per_layer += e * (2 * h + i) + (0 if lean else e * (2 * h + qk))
    else:
        element, rank = adapter
        if getattr(backend, "adapter_autocast", False):  # its products in the compute dtype (torch's forward_precision)
            element = e
        per_layer += element * (5 * h + q + i) if element > e else e * (2 * h + i)
        per_layer += 7 * rank * element  # each adapter's A output
    return per_layer


def attention_widths(config: dict) -> tuple[int, int]:
    """(query width, key-value width): heads x head dim."""
    heads = int(config.get("num_attention_heads") or 1)
    head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    return heads * head_dim, int(config.get("num_key_value_heads") or heads) * head_dim


def prompt_row_share(backend: Any) -> float | None:
    """A shared prompt's token, per response row, as a share of a whole token's cost: with the prompt
    run once (`batch_logprobs`' shared_prefix), each row keeps only its keys and values (the cache the
    responses attend to, repeated to the query heads under the mask: 2 x q e a layer); the prompt's
    own activations are counted once per distinct prompt. None where the backend runs every row's
    prompt (`ModelBackend.runs_shared_prefix`)."""
    if not getattr(backend, "runs_shared_prefix", False):
        return None
    config = model_config(backend)
    q, _ = attention_widths(config)
    return int(config["num_hidden_layers"]) * 2 * q * element_bytes(backend.dtype) / bytes_per_token(backend)


def mask_share(backend: Any) -> float:
    """One element of a forward's attention mask, as a share of a whole token's cost: PyTorch's SDPA
    turns the boolean mask into an additive one in the compute dtype at every layer's call and keeps
    it for the backward (queries x keys a row, `layers` copies). Quadratic in the length, so it
    counts by the rows' query and key lengths (`forward_tokens`), not per token."""
    config = model_config(backend)
    return int(config["num_hidden_layers"]) * element_bytes(backend.dtype) / bytes_per_token(backend)


class ForwardCosts(NamedTuple):
    """A training forward's memory in whole tokens (`bytes_per_token` at the plan's `recompute`):
    `row_share` a shared prompt's position per response row (None: every row runs its prompt),
    `mask` an attention-mask element, `prompt` a position of a shared prompt's own forward."""

    row_share: float | None
    mask: float = 0.0
    prompt: float = 1.0


def forward_costs(backend: Any, shared: bool, recompute: bool = False) -> ForwardCosts:
    """The costs of `forward_tokens` for `backend`'s training forward, its prompts run once per
    distinct prompt when `shared` and the backend does (`prompt_row_share`), its layers recomputed
    when `recompute`: then one layer's copy of each row's prompt keys and values and of the mask
    (SDPA's additive copy; transformers' boolean mask, a byte an element, is kept for the
    recomputation) is alive at a time, and a shared prompt's position costs a token and its cache,
    every layer's keys and values, which the responses read."""
    row_share = prompt_row_share(backend) if shared else None
    if not recompute:
        return ForwardCosts(row_share, mask_share(backend))
    config = model_config(backend)
    plain, token = bytes_per_token(backend), bytes_per_token(backend, recompute=True)
    layers, e = int(config["num_hidden_layers"]), element_bytes(backend.dtype)
    cache = layers * 2 * attention_widths(config)[1] * e
    return ForwardCosts(
        None if row_share is None else row_share * plain / layers / token, (e + 1) / token, (token + cache) / token
    )


def forward_tokens(
    prompts: Sequence[Sequence[int]],
    response_lengths: Sequence[int],
    row_share: float | None,
    mask: float = 0.0,
    prompt_cost: float = 1.0,
) -> float:
    """A forward's padded size in whole tokens, one row per prompt and response: each row prompt plus
    response at the longest row, or with the prompt shared (`row_share`, `prompt_row_share`) each
    distinct prompt once at the longest prompt (a position at `prompt_cost`, `ForwardCosts`), every
    response at the longest response, and each row's copy of its prompt's keys and values. `mask`
    (`mask_share`): the attention masks' elements, queries x keys for each row of each pass, in the
    same units."""
    if row_share is None:
        width = max(len(p) + int(r) for p, r in zip(prompts, response_lengths))
        return len(prompts) * width * (1 + mask * width)
    prompt = max(len(p) for p in prompts)
    response = max(response_lengths)
    distinct = len({tuple(p) for p in prompts})
    masks = distinct * prompt * prompt + len(prompts) * response * (prompt + response)
    return distinct * prompt * prompt_cost + len(prompts) * (response + row_share * prompt) + mask * masks


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


RECOMPUTE_VARIABLE = "FLYWHEEL_TRAIN_RECOMPUTE"


class MemoryPlan(NamedTuple):
    """How a trainer's minibatches meet the budget: the tokens a part may hold (None: whole), the
    costs its parts are measured by, and whether the layers recompute their activations."""

    limit: int | None
    costs: ForwardCosts
    recompute: bool


def recompute_setting() -> str:
    """`FLYWHEEL_TRAIN_RECOMPUTE`: `auto` (the default), `always` or `never`."""
    value, rule = env(RECOMPUTE_VARIABLE).strip().lower(), RULES[RECOMPUTE_VARIABLE]
    if rule.problem(value):
        raise ValueError(f"{RECOMPUTE_VARIABLE}={value!r}: {rule.allowed}")
    return value


def memory_plan(
    backend: Any,
    minibatches: Sequence[Sequence[Any]],
    cost_of: Callable[[ForwardCosts], Callable[[list[Any]], float]],
    shared: bool,
) -> MemoryPlan:
    """The plan for `minibatches` (items `cost_of(costs)` measures) under the budget. `auto`: the
    layers recompute (`torch/recompute.py`) when that takes the minibatches in fewer parts than
    keeping every activation would, one more forward a step against the launches of each part
    beyond the first; `always` / `never` as they say (`always` on a backend without recomputation:
    ValueError). `shared`: a part's prompts run once per distinct prompt (`forward_costs`)."""
    setting = recompute_setting()
    plain = MemoryPlan(token_limit(backend), forward_costs(backend, shared), False)
    if not getattr(backend, "recomputes_layers", False):
        if setting == "always":
            raise ValueError(f"{RECOMPUTE_VARIABLE}=always: the {backend.name} backend does not recompute its layers")
        return plain
    if setting == "never" or (setting == "auto" and plain.limit is None):
        return plain
    recompute = MemoryPlan(token_limit(backend, recompute=True), forward_costs(backend, shared, True), True)
    if setting == "always":
        return recompute

    def parts(plan: MemoryPlan) -> int:
        cost = cost_of(plan.costs)
        return sum(len(split_by_cost(list(batch), cost, plan.limit)) for batch in minibatches)

    return recompute if parts(recompute) < parts(plain) else plain


def split_by_cost(items: Sequence[Any], cost: Callable[[list[Any]], float], limit: int | None) -> list[list[Any]]:
    """`items` in order, cut into the fewest consecutive parts whose `cost(part)` (tokens; it must
    grow as a part grows) is at most `limit`, as even in size as that count allows: equal parts
    pad less and peak lower than a full part and a remainder. A part holds one item at least."""
    if limit is None or not items:
        return [list(items)] if items else []
    greedy: list[list[Any]] = []
    part: list[Any] = []
    for item in items:
        if part and cost(part + [item]) > limit:
            greedy.append(part)
            part = []
        part.append(item)
    greedy.append(part)
    count = len(greedy)
    if count > 1:
        size, extra = divmod(len(items), count)
        bounds = [k * size + min(k, extra) for k in range(count + 1)]
        even = [list(items[a:b]) for a, b in zip(bounds, bounds[1:])]
        if all(len(p) == 1 or cost(p) <= limit for p in even):
            return even
    return greedy


def accumulated_steps(
    plan: Sequence[Sequence[int]],
    cost: Callable[[list[int]], float],
    share: Callable[[int], float],
    limit: int | None,
    keep: Callable[[Sequence[int]], list[int]] | None = None,
) -> list:
    """One optimiser step per minibatch of item indices: the minibatch whole, or its parts within
    `limit` tokens (`cost(part)`: the padded tokens of a forward over those items, `forward_tokens`)
    as an `Accumulated` step, each part scaled by its items' `share` over the minibatch's (pairs for
    DPO, completion tokens for SFT). `keep(idx)`: the items of the minibatch this process trains on
    (a data-parallel rank's shard, `shards.py`); their parts are still scaled over the whole
    minibatch, and a rank holding none gets an empty step."""
    from outcome_flywheel.models.interface import Accumulated

    steps = []
    for idx in plan:
        mine = list(idx) if keep is None else keep(idx)
        parts = split_by_cost(mine, cost, limit)
        total = sum(share(i) for i in idx)
        scaled = Accumulated(tuple(parts), tuple(sum(share(i) for i in p) / total for p in parts))
        steps.append(idx if keep is None and len(parts) == 1 else scaled)
    return steps


def part_count(steps: Sequence[Any]) -> int:
    """Forward passes the steps take (an `Accumulated` step: one per part)."""
    return sum(len(s.parts) if hasattr(s, "parts") else 1 for s in steps)
