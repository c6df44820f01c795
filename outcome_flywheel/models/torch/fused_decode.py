"""The small per-layer pieces of the static decode step (`static_cache.decode_step`), written as
plain tensor functions so that `torch.compile` can fuse each into one kernel.

Why: at a decode step's shapes (a few hundred rows of one token) every RMS norm, rotation and
gate is a handful of tiny kernels, and on a GPU their launches, not the bytes they move, set the
step's time: counted from the code, a Qwen3 layer ran ~57 kernels, 1,600 a step, and the profile
(`python -m benchmarks.gpu --profile-steps 32`, an H200) showed them, 3 to 5 µs each, as most of
the time besides attention. Fused, a layer runs about 15 (the projections, the cache writes,
attention and one kernel per piece below): 1.29x the day's sampling on that H200. The token
pick's filtering (temperature, think ban, top-k / top-p, softmax) is one more piece.

Each function is the module's own arithmetic, op for op (transformers' `Qwen3RMSNorm` /
`LlamaRMSNorm`, `rotate_half` rotary, `LlamaMLP`'s gate), so unfused (`DecodeKernels(fused=False)`)
they give the modules' results bit for bit; fused, Inductor keeps the same precision casts
(`emulate_precision_casts`), and only the order of the norm's sum can round differently.
The projections stay module calls: PEFT's LoRA layers and in-place weight updates are seen as
they are, and the fused kernels read the norms' weights where they live, so a captured graph
needs no recapture after training.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from outcome_flywheel.models.sampling import uses_nucleus

log = logging.getLogger(__name__)


def inverse_rms(h: torch.Tensor, eps: float) -> torch.Tensor:
    """1 / sqrt(mean(h^2) + eps) over the last axis, as transformers' RMSNorm computes it (`h` float32)."""
    return torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' RMSNorm (Llama, Qwen2, Qwen3, Mistral): in float32, cast back, then scaled."""
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * inverse_rms(h, eps)
    return weight * h.to(dtype)


def add_rms_norm(
    hidden: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual stream after adding `delta`, and its norm: the add and the next block's norm in one pass."""
    hidden = hidden + delta
    return hidden, rms_norm(hidden, weight, eps)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotate_queries_and_keys(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    eps: float,
    kv_heads: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token's queries and keys from their projections (`[rows, heads * head_dim]`): Qwen3's
    per-head RMS norms (when given), then the rotary rotation at each row's position (`cos` / `sin`
    `[rows, 1, head_dim]`). Returns queries `[rows, kv_heads, group, head_dim]` (query head h is
    position h % group of key-value head h // group, transformers' `repeat_kv` order, so attention
    copies no key or value) and keys `[rows, kv_heads, 1, head_dim]`."""
    rows, head_dim = q.shape[0], cos.shape[-1]
    q = q.view(rows, 1, -1, head_dim)
    k = k.view(rows, 1, -1, head_dim)
    if q_weight is not None:
        q, k = rms_norm(q, q_weight, eps), rms_norm(k, k_weight, eps)
    q, k = q.transpose(1, 2), k.transpose(1, 2)  # [rows, heads, 1, head_dim]
    cos, sin = cos[:, None], sin[:, None]
    q = q * cos + _rotate_half(q) * sin
    k = k * cos + _rotate_half(k) * sin
    return q.reshape(rows, kv_heads, -1, head_dim), k


def sdpa_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, key_bias: torch.Tensor, scale: float
) -> torch.Tensor:
    """One token's attention for every row, `[rows, kv_heads, group, head_dim]`: a key-value head's
    query heads as its query positions (no key or value copied), keys `[rows, kv_heads, length,
    head_dim]` under `key_bias` `[rows, length]` (0 or -inf). PyTorch's flash / memory-efficient kernel."""
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=key_bias[:, None, None, :], scale=scale)


def flex_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, key_bias: torch.Tensor, scale: float
) -> torch.Tensor:
    """`sdpa_attention`'s result through FlexAttention (compiled: its decoding kernel splits the keys
    across blocks), the bias added to each score. Unmeasured on a GPU so far: `DecodeKernels`'
    `attention="flex"`, `benchmarks.gpu`'s torch-flex row."""
    from torch.nn.attention.flex_attention import flex_attention as flex

    rows, kv_heads, group, head_dim = q.shape

    def biased(score, batch, head, query, key):
        return score + key_bias[batch, key]

    out = flex(
        q.reshape(rows, kv_heads * group, 1, head_dim), keys, values, score_mod=biased, enable_gqa=True, scale=scale
    )
    return out.reshape(rows, kv_heads, group, head_dim)


def silu_gate(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """`LlamaMLP`'s gate with SiLU, the activation of every supported model type."""
    return F.silu(gate) * up


def device_keep_thresholds(top_values: torch.Tensor, top_p: float) -> torch.Tensor:
    """`models.sampling.keep_thresholds` on the device: the smallest kept logit per row `[B]`, from
    each row's top-k logits in descending order `[B, k]`; float64 as on the host; no host copy."""
    values = top_values.double()
    if not uses_nucleus(top_p):
        return values[:, -1]
    probs = torch.exp(values - values[:, :1])
    probs = probs / probs.sum(-1, keepdim=True)
    before = torch.cat([torch.zeros_like(probs[:, :1]), probs.cumsum(-1)[:, :-1]], dim=-1)
    # a tied token's mass "strictly above" is the mass before the first token of its tie group
    position = torch.arange(values.shape[1], device=values.device).expand_as(values)
    starts_group = torch.cat(
        [torch.ones_like(values[:, :1], dtype=torch.bool), values[:, 1:] != values[:, :-1]], dim=-1
    )
    group_start = torch.where(starts_group, position, 0).cummax(-1).values
    kept = (before.gather(-1, group_start) < top_p).sum(-1)
    return values.gather(-1, (kept.clamp(min=1) - 1)[:, None])[:, 0]


def filtered_probs(logits: torch.Tensor, banned: torch.Tensor, rule) -> tuple[torch.Tensor, torch.Tensor]:
    """The distribution a row's token is drawn from, and the log-normaliser of its pi_old, from
    logits `[rows, vocab]` (float32) under `rule` (a `graph_sampler.SamplingRule`): temperature, the
    think ban (`banned` ids), the top-k / top-p threshold, softmax (the eager sampler's order).
    Greedy: the banned-filtered logits themselves (their argmax is the pick)."""
    scaled = logits / rule.temperature if not rule.greedy else logits
    lse = torch.logsumexp(scaled, dim=-1)
    if rule.banned:
        scaled = scaled.index_fill(-1, banned, float("-inf"))
    if rule.greedy:
        return scaled, lse
    if rule.top_k < scaled.shape[-1] or uses_nucleus(rule.top_p):
        threshold = device_keep_thresholds(torch.topk(scaled, rule.top_k, dim=-1).values, rule.top_p)
        scaled = scaled.masked_fill(scaled < threshold.to(scaled.dtype)[:, None], float("-inf"))
    return scaled.softmax(-1), lse


COMPILE_OPTIONS = {"fullgraph": True, "options": {"emulate_precision_casts": True}}
_COMPILED: dict = {}


def _compiled(name: str):
    """The process's one compiled version of piece `name` (compiled at its first call)."""
    if name not in _COMPILED:
        _COMPILED[name] = torch.compile(globals()[name], **COMPILE_OPTIONS)
    return _COMPILED[name]


class DecodeKernels:
    """The functions above as the step calls them: compiled (one fused kernel each, on the device
    the step runs on) or as written. A piece whose compile fails (no Triton, no C compiler, a shape
    the compiler cannot generate) is logged and runs unfused from then on: the same arithmetic,
    more launches; the others stay fused."""

    NAMES = ("rms_norm", "add_rms_norm", "rotate_queries_and_keys", "silu_gate", "filtered_probs")
    ATTENTION = ("sdpa", "flex")

    def __init__(self, fused: bool, compile=None, attention: str = "sdpa"):
        """`compile`: how a piece is compiled (None: `torch.compile`, once per process for every
        sampler, so a server's hot swaps reuse the kernels instead of compiling again).
        `attention`: "sdpa" (PyTorch's kernel, one launch already) or "flex" (FlexAttention,
        compiled whether or not the other pieces are; on failure, "sdpa")."""
        if attention not in self.ATTENTION:
            raise ValueError(f"decode attention must be one of {self.ATTENTION}, got {attention!r}")
        self.fused, self.attention_kernel = fused, attention
        self.failures: dict[str, str] = {}  # piece -> why it runs unfused
        for name in self.NAMES:
            plain = globals()[name]
            if fused:
                compiled = _compiled(name) if compile is None else compile(plain, **COMPILE_OPTIONS)
                plain = self._or_plain(name, plain, compiled)
            setattr(self, name, plain)
        self.attention = sdpa_attention
        if attention == "flex":
            compiled = _compiled("flex_attention") if compile is None else compile(flex_attention, **COMPILE_OPTIONS)
            self.attention = self._or_plain("flex_attention", sdpa_attention, compiled)

    @property
    def fused_pieces(self) -> list[str]:
        pieces = [name for name in self.NAMES if self.fused]
        return [
            name
            for name in pieces + ["flex_attention"] * (self.attention_kernel == "flex")
            if name not in self.failures
        ]

    def _or_plain(self, name, plain, compiled):
        def call(*args):
            if name not in self.failures:
                try:
                    return compiled(*args)
                except Exception as error:  # the compiler's, not the arithmetic's: plain reproduces a real one
                    self.failures[name] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
                    log.warning("decode step: %s not fused (%s), it runs unfused", name, self.failures[name])
            return plain(*args)

        return call
