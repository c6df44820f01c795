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

import torch
import torch.nn.functional as F

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")


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


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


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
) -> torch.Tensor:
    """One token's self-attention for every row: project, (q/k norm), rotate, write this token's key
    and value at `write_at`, attend to the cache's first `length` positions under `key_bias`."""
    rows, head_dim = x.shape[0], attn.head_dim
    q = attn.q_proj(x).view(rows, 1, -1, head_dim)
    k = attn.k_proj(x).view(rows, 1, -1, head_dim)
    v = attn.v_proj(x).view(rows, 1, -1, head_dim)
    if hasattr(attn, "q_norm"):  # Qwen3: RMS norm per head before the rotation
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [rows, heads, 1, head_dim]
    cos, sin = cos[:, None], sin[:, None]
    q = q * cos + _rotate_half(q) * sin
    k = k * cos + _rotate_half(k) * sin
    keys.index_copy_(2, write_at, k)
    values.index_copy_(2, write_at, v)
    kv_heads = keys.shape[1]
    # Query head h reads key-value head h // group (transformers' repeat_kv order): the group's
    # query heads become query positions of one key-value head, so no key or value is copied.
    q = q.reshape(rows, kv_heads, -1, head_dim)
    out = F.scaled_dot_product_attention(
        q, keys[:, :, :length], values[:, :, :length], attn_mask=key_bias[:, None, None, :length], scale=attn.scaling
    )
    return attn.o_proj(out.reshape(rows, 1, -1))


def decode_step(
    model,
    cache: StaticKVCache,
    rows: int,
    length: int,
    tokens: torch.Tensor,
    positions: torch.Tensor,
    write_at: torch.Tensor,
    key_bias: torch.Tensor,
) -> torch.Tensor:
    """Logits `[rows, vocab]` (float32) of the next token after `tokens` `[rows]`, each at its
    rotary `positions` `[rows]`; writes every layer's key/value at cache position `write_at` `[1]`;
    attends to cache positions `< length` where `key_bias` `[rows, >= length]` is 0 (-inf: padding,
    positions not written yet)."""
    lm = causal_lm(model)
    inner = lm.model
    hidden = inner.embed_tokens(tokens[:, None])
    cos, sin = inner.rotary_emb(hidden, positions[:, None])
    for index, layer in enumerate(inner.layers):
        attended = _attend(
            layer.self_attn,
            layer.input_layernorm(hidden),
            cos,
            sin,
            cache.keys[index, :rows],
            cache.values[index, :rows],
            length,
            write_at,
            key_bias,
        )
        hidden = hidden + attended
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
    return lm.lm_head(inner.norm(hidden))[:, 0].float()
