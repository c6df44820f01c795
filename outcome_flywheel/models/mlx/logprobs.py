"""Per-token log-probs and KL at a real vocabulary without `[B, L, V]` arrays: the mirror of
`torch/logprobs.py` (the reasons and the method are written there).

The chosen token's logit minus a logsumexp, from the final hidden states a chunk of tokens at a
time; under `value_and_grad` each chunk goes through `nn.utils.checkpoint`, so the backward pass
recomputes its logits instead of keeping them.
"""

from __future__ import annotations

from typing import Callable

import mlx.core as mx
import mlx.nn as nn

CHUNK_ELEMENTS = 2**25  # as torch: fp32 logits per chunk

Head = Callable[[mx.array], mx.array]


def chunk_rows(vocab_size: int, chunk_elements: int = CHUNK_ELEMENTS) -> int:
    return max(1, int(chunk_elements) // max(1, int(vocab_size)))


def selective_log_softmax(logits: mx.array, index: mx.array, temperature: float = 1.0) -> mx.array:
    """`log_softmax(logits / T)` at `index` along the last axis, as chosen logit minus logsumexp (fp32)."""
    scaled = logits.astype(mx.float32) / temperature
    chosen = mx.take_along_axis(scaled, index[..., None], axis=-1)[..., 0]
    return chosen - mx.logsumexp(scaled, axis=-1)


def token_logprobs(
    hidden: mx.array,
    head: Head,
    targets: mx.array,
    temperature: float = 1.0,
    vocab_size: int | None = None,
    chunk_elements: int = CHUNK_ELEMENTS,
    module: nn.Module | None = None,
) -> mx.array:
    """Log-prob of each target token `[N]` from the hidden states predicting it (`[N, H]`). With
    `module` (the model whose trainable parameters the head uses), each chunk is checkpointed."""
    if hidden.shape[0] == 0:
        return mx.zeros((0,), dtype=mx.float32)
    vocab_size = vocab_size or head(hidden[:1]).shape[-1]
    step = chunk_rows(vocab_size, chunk_elements)

    def chunk_fn(targets_chunk: mx.array):
        # the targets are closed over: a checkpoint differentiates all of its inputs, and
        # integer indices have no gradient
        def chunk(h: mx.array) -> mx.array:
            return selective_log_softmax(head(h), targets_chunk, temperature)

        return nn.utils.checkpoint(module, chunk) if module is not None else chunk

    parts = [chunk_fn(targets[s : s + step])(hidden[s : s + step]) for s in range(0, hidden.shape[0], step)]
    return mx.concatenate(parts)


def token_kl(
    hidden_p: mx.array,
    head_p: Head,
    hidden_q: mx.array,
    head_q: Head,
    temperature: float = 1.0,
    vocab_size: int | None = None,
    chunk_elements: int = CHUNK_ELEMENTS,
) -> mx.array:
    """Exact KL(p || q) at each position `[N]` (both at `temperature`), a chunk of positions at a
    time; each chunk is evaluated before the next is built, so only one chunk's logits live."""
    if hidden_p.shape[0] == 0:
        return mx.zeros((0,), dtype=mx.float32)
    vocab_size = vocab_size or head_p(hidden_p[:1]).shape[-1]
    step = chunk_rows(vocab_size, chunk_elements)
    parts = []
    for s in range(0, hidden_p.shape[0], step):
        lp = head_p(hidden_p[s : s + step]).astype(mx.float32) / temperature
        lq = head_q(hidden_q[s : s + step]).astype(mx.float32) / temperature
        lp = lp - mx.logsumexp(lp, axis=-1, keepdims=True)
        lq = lq - mx.logsumexp(lq, axis=-1, keepdims=True)
        part = (mx.exp(lp) * (lp - lq)).sum(axis=-1)
        mx.eval(part)
        parts.append(part)
    return mx.concatenate(parts)


def plain_token_logprobs(logits: mx.array, targets: mx.array, temperature: float = 1.0) -> mx.array:
    """The textbook computation: a full log-softmax, then gather (reference for tests)."""
    scaled = logits.astype(mx.float32) / temperature
    logp = scaled - mx.logsumexp(scaled, axis=-1, keepdims=True)
    return mx.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]


def plain_token_kl(logits_p: mx.array, logits_q: mx.array, temperature: float = 1.0) -> mx.array:
    lp = logits_p.astype(mx.float32) / temperature
    lq = logits_q.astype(mx.float32) / temperature
    lp = lp - mx.logsumexp(lp, axis=-1, keepdims=True)
    lq = lq - mx.logsumexp(lq, axis=-1, keepdims=True)
    return (mx.exp(lp) * (lp - lq)).sum(axis=-1)
