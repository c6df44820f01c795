"""A preallocated KV cache and the one-token decode step over it, for the graph-captured sampler
(`graph_sampler.py`).

The step reuses the loaded model's own modules (embeddings, norms, projections, MLP, head, rotary
embedding), so LoRA layers (PEFT) and in-place weight updates are seen as they are; only the
attention over the cache is written here, because it must read a fixed buffer: keys and values
are written at one position given as a device tensor, and attention reads the cache up to a
length bucket (`length`), never the whole allocation. Every shape is fixed for a given
(batch, length), and nothing leaves the device: a CUDA graph can capture the step.

Llama-family decoders only (Llama, Qwen2, Qwen3, Mistral without a sliding window): pre-norm
blocks, rotary positions, grouped-query attention, optional per-head q/k norms (Qwen3). Anything
else keeps the eager sampler (`unsupported_reason`).
"""

from __future__ import annotations

import contextlib

import torch

from outcome_flywheel.models.torch.fused_decode import DecodeKernels

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")


def attention_kernels(device: torch.device):
    """Scaled-dot-product attention without cuDNN's kernel on CUDA: cuDNN builds an execution plan
    for every new key length, ~3 ms of CPU per layer call in a decode loop (measured on an H100,
    benchmarks/gpu.py --profile-steps), which made decoding CPU-bound. Flash / memory-efficient
    attention need no plan. A no-op elsewhere. The static step is captured under it too, so its
    graphs never take cuDNN's attention, whose plan cache keeps a workspace."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def causal_lm(model):
    """The transformers model under a PEFT wrapper, if any (its LoRA layers stay inside)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def unsupported_reason(model) -> str:
    """Why the static decode step cannot run this model ("" when it can)."""
    config = causal_lm(model).config
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        return f"model type {config.model_type!r} is not one of {SUPPORTED_MODEL_TYPES}"
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    if layer_types != {"full_attention"} or (
        getattr(config, "sliding_window", None)
        and getattr(config, "use_sliding_window", True)
        and config.model_type == "mistral"
    ):
        return "sliding-window attention"
    if getattr(config, "rope_scaling", None) and "dynamic" in str((config.rope_scaling or {}).get("rope_type", "")):
        return "dynamic RoPE scaling (its frequencies depend on the sequence length)"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"MLP activation {config.hidden_act!r} (the step's gate is SiLU's)"
    norms = [m for m in causal_lm(model).modules() if type(m).__name__.endswith("Norm")]
    if not all(hasattr(m, "variance_epsilon") and hasattr(m, "weight") for m in norms):
        return "norms other than transformers' RMSNorm"
    return ""


class StaticKVCache:
    """Keys and values of every layer, `[layers, batch, kv_heads, length, head_dim]`, allocated once.
    A step for `b` rows and a length bucket `l` uses the views `[:, :b, :, :l]`: a prefix of the
    same storage, so graphs captured for smaller buckets stay valid."""

    def __init__(
        self,
        layers: int,
        batch: int,
        kv_heads: int,
        length: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ):
        shape = (layers, batch, kv_heads, length, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.batch, self.length = batch, length

    @classmethod
    def for_model(cls, model, batch: int, length: int, dtype: torch.dtype, device: torch.device) -> "StaticKVCache":
        config = causal_lm(model).config
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(config.num_hidden_layers, batch, config.num_key_value_heads, length, head_dim, dtype, device)

    @staticmethod
    def bytes_needed(model, batch: int, length: int, dtype: torch.dtype) -> int:
        config = causal_lm(model).config
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        itemsize = torch.empty((), dtype=dtype).element_size()
        return 2 * config.num_hidden_layers * batch * config.num_key_value_heads * length * head_dim * itemsize

    def fill_prefix(self, prefill_cache, rows: torch.Tensor) -> None:
        """Copy a prefill's cache (transformers' `DynamicCache` over the distinct prompts,
        `[prompts, kv_heads, width, head_dim]` a layer) into rows `0..len(rows)-1`, row r taking
        prompt `rows[r]`."""
        for layer, cached in enumerate(prefill_cache.layers):
            width = cached.keys.shape[2]
            self.keys[layer, : len(rows), :, :width].copy_(cached.keys.index_select(0, rows))
            self.values[layer, : len(rows), :, :width].copy_(cached.values.index_select(0, rows))

    @property
    def nbytes(self) -> int:
        return self.keys.numel() * self.keys.element_size() * 2


def _attend(
    attn,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    length: int,
    write_at: torch.Tensor,
    key_bias: torch.Tensor,
    kernels: DecodeKernels,
) -> torch.Tensor:
    """One token's self-attention for every row: project, (q/k norm), rotate, write this token's key
    and value at `write_at`, attend to the cache's first `length` positions under `key_bias`."""
    rows, kv_heads = x.shape[0], keys.shape[1]
    qk_norms = (
        (attn.q_norm.weight, attn.k_norm.weight, attn.q_norm.variance_epsilon)
        if hasattr(attn, "q_norm")
        else (None, None, 0.0)
    )
    q, k = kernels.rotate_queries_and_keys(attn.q_proj(x), attn.k_proj(x), cos, sin, *qk_norms, kv_heads)
    keys.index_copy_(2, write_at, k)
    values.index_copy_(2, write_at, attn.v_proj(x).view(rows, kv_heads, 1, -1))
    out = kernels.attention(q, keys[:, :, :length], values[:, :, :length], key_bias[:, :length], attn.scaling)
    return attn.o_proj(out.reshape(rows, -1))


def decode_step(
    model,
    cache: StaticKVCache,
    rows: int,
    length: int,
    tokens: torch.Tensor,
    positions: torch.Tensor,
    write_at: torch.Tensor,
    key_bias: torch.Tensor,
    kernels: DecodeKernels,
) -> torch.Tensor:
    """Logits `[rows, vocab]` (in the model's dtype) of the next token after `tokens` `[rows]`, each at its
    rotary `positions` `[rows]`; writes every layer's key/value at cache position `write_at` `[1]`;
    attends to cache positions `< length` where `key_bias` `[rows, >= length]` is 0 (-inf: padding,
    positions not written yet). The norms, rotations and gates run through `kernels` (fused or not);
    the residual add is fused with the norm after it."""
    lm = causal_lm(model)
    inner = lm.model
    hidden = inner.embed_tokens(tokens)  # [rows, hidden]: one token a row
    cos, sin = inner.rotary_emb(hidden[:, None], positions[:, None])
    first = inner.layers[0].input_layernorm
    normed = kernels.rms_norm(hidden, first.weight, first.variance_epsilon)
    for index, layer in enumerate(inner.layers):
        attended = _attend(
            layer.self_attn,
            normed,
            cos,
            sin,
            cache.keys[index, :rows],
            cache.values[index, :rows],
            length,
            write_at,
            key_bias,
            kernels,
        )
        post = layer.post_attention_layernorm
        hidden, normed = kernels.add_rms_norm(hidden, attended, post.weight, post.variance_epsilon)
        mlp = layer.mlp
        delta = mlp.down_proj(kernels.silu_gate(mlp.gate_proj(normed), mlp.up_proj(normed)))
        after = inner.layers[index + 1].input_layernorm if index + 1 < len(inner.layers) else inner.norm
        hidden, normed = kernels.add_rms_norm(hidden, delta, after.weight, after.variance_epsilon)
    return lm.lm_head(normed)
