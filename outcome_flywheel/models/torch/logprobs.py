"""Per-token log-probs and KL at a real vocabulary without `[B, L, V]` tensors (PyTorch;
`mlx/logprobs.py` is the mirror).

At Qwen3's vocabulary (151,936), 16 responses of 512 tokens make fp32 logits of ~5 GB, and the
textbook `log_softmax(logits).gather(...)` keeps a second tensor of that size for autograd. Here
the log-prob of the chosen token is its logit minus a logsumexp (TRL's `selective_log_softmax`),
taken as a per-token cross-entropy, and the logits themselves are made from the final hidden
states a chunk of tokens at a time (`chunk_rows`); during training each chunk is recomputed in
the backward pass (activation checkpointing), so autograd keeps only the hidden states, `[N, H]`,
never `[N, V]`.

`plain_token_logprobs` is the textbook computation, kept as the reference the tests compare with
(tests/models/test_selective_logprobs.py) and the "before" of `benchmarks/logprob_memory.py`.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

# fp32 logits per chunk: 2**25 elements = 128 MiB (220 tokens at a 151,936 vocabulary; a whole
# batch at once at tiny-local's 2,048).
CHUNK_ELEMENTS = 2**25

Head = Callable[[torch.Tensor], torch.Tensor]  # final hidden states [n, H] -> logits [n, V]


def chunk_rows(vocab_size: int, chunk_elements: int = CHUNK_ELEMENTS) -> int:
    """Token rows per chunk so that one chunk's fp32 logits hold at most `chunk_elements`."""
    return max(1, int(chunk_elements) // max(1, int(vocab_size)))


def selective_log_softmax(logits: torch.Tensor, index: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """`log_softmax(logits / T)` at `index` along the last axis, the chosen logit minus a logsumexp (in
    fp32), as a per-token cross-entropy, whose log-softmax autograd keeps for the backward: called on
    a chunk under `token_logprobs`' checkpoint, that is recomputed there, and a chunk's backward holds
    three float32 copies of its logits at most (`FRAMEWORK.head_chunk_copies`). `logits [..., V]`, `index [...]`."""
    # As cross-entropy, whose backward is one fused softmax-minus-one-hot pass (a third faster on a
    # CPU than logsumexp's sub, exp and mul); the division runs in place on a fresh float32 copy.
    scaled = logits / temperature if logits.dtype == torch.float32 else logits.float().div_(temperature)
    vocab = scaled.shape[-1]
    nll = F.cross_entropy(scaled.reshape(-1, vocab), index.reshape(-1), reduction="none", ignore_index=-(2**62))
    return -nll.reshape(index.shape)


def _chunk_logprobs(head: Head, hidden: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    return selective_log_softmax(head(hidden), targets, temperature)


def token_logprobs(
    hidden: torch.Tensor,
    head: Head,
    targets: torch.Tensor,
    temperature: float = 1.0,
    vocab_size: int | None = None,
    chunk_elements: int = CHUNK_ELEMENTS,
    module: torch.nn.Module | None = None,
) -> torch.Tensor:
    """Log-prob of each target token `[N]` from the hidden states that predict it (`hidden [N, H]`,
    `targets [N]`), at `temperature`. Differentiable; under autograd each chunk's logits are
    recomputed in the backward pass instead of being kept. (`module` is for the mlx mirror's
    checkpoint, which needs the parameters named; torch's autograd finds them itself.)"""
    if hidden.shape[0] == 0:
        return hidden.new_zeros(0, dtype=torch.float32)
    vocab_size = vocab_size or head(hidden[:1]).shape[-1]
    step = chunk_rows(vocab_size, chunk_elements)
    keep_graph = torch.is_grad_enabled() and hidden.requires_grad
    parts = []
    for start in range(0, hidden.shape[0], step):
        h, t = hidden[start : start + step], targets[start : start + step]
        if keep_graph:
            parts.append(checkpoint(_chunk_logprobs, head, h, t, temperature, use_reentrant=False))
        else:
            parts.append(_chunk_logprobs(head, h, t, temperature))
    return torch.cat(parts)


def token_kl(
    hidden_p: torch.Tensor,
    head_p: Head,
    hidden_q: torch.Tensor,
    head_q: Head,
    temperature: float = 1.0,
    vocab_size: int | None = None,
    chunk_elements: int = CHUNK_ELEMENTS,
) -> torch.Tensor:
    """Exact KL(p || q) = sum_v p(v) (log p(v) - log q(v)) at each position `[N]`, both
    distributions at `temperature`, from each model's final hidden states `[N, H]`. The full
    distributions are needed here, so they are made one chunk of positions at a time."""
    if hidden_p.shape[0] == 0:
        return hidden_p.new_zeros(0, dtype=torch.float32)
    vocab_size = vocab_size or head_p(hidden_p[:1]).shape[-1]
    step = chunk_rows(vocab_size, chunk_elements)
    parts = []
    for start in range(0, hidden_p.shape[0], step):
        lp = F.log_softmax(head_p(hidden_p[start : start + step]).float() / temperature, dim=-1)
        lq = F.log_softmax(head_q(hidden_q[start : start + step]).float().to(lp.device) / temperature, dim=-1)
        parts.append(torch.sum(lp.exp() * (lp - lq), dim=-1))
    return torch.cat(parts)


def _at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.promote_types(x.dtype, torch.float32))


def plain_token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """The textbook computation, `log_softmax(logits / T)` then gather: a full `[..., V]` log-prob
    tensor (the reference for tests, in float64 there, and the memory benchmark's "before")."""
    return F.log_softmax(_at_least_fp32(logits) / temperature, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def plain_token_kl(logits_p: torch.Tensor, logits_q: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Textbook exact KL(p || q) from full logits `[..., V]` (reference for tests)."""
    lp = F.log_softmax(_at_least_fp32(logits_p) / temperature, dim=-1)
    lq = F.log_softmax(_at_least_fp32(logits_q) / temperature, dim=-1)
    return (lp.exp() * (lp - lq)).sum(-1)
