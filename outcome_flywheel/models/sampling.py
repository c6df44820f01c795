"""What the torch and mlx samplers share, written once in NumPy so both agree by construction:
the seed of each sample row and the top-k / nucleus (top-p) rule (the trainers' batching plans are
in `train/batching.py`).

The filter rule. On temperature-scaled logits, a token is kept when
  - top-k: its logit is at least the k-th largest logit (ties at the k-th value are all kept), and
  - top-p: the probability mass of the tokens whose logit is *strictly greater* than its own is
    below `top_p` (so the best token is always kept, and tied tokens share one fate: no order
    among equal logits, hence no framework's sort order, can decide).
Both conditions are thresholds on the logit, so the whole filter is one number per row: the
smallest logit kept. `keep_thresholds` computes it in float64 from the top-k candidates, which
each backend copies to the host (B x k values, k = 50 by default), and the backend masks every
logit below it. Summation order is NumPy's, the same for both backends.
"""

from __future__ import annotations

import numpy as np

# How far teacher forcing may land from the sampler's recorded log-probs, as a per-response mean
# |gap|: fp32 kernels agree to ~1e-6; bf16 logits carry ~1e-2 of rounding per token. The bf16 and
# fp16 rows hold for the tests' models of a few layers; the rounding grows with depth, so the
# loop's checkpoint check measures it against float32 on each model instead (policy/verify.py).
LOGPROB_TOLERANCE = {"float32": 1e-3, "bfloat16": 5e-2, "float16": 5e-2}
# With the same weights, the sampler's reduced-precision log-probs and teacher forcing's are two
# roundings of one function: their mean distances to float32 agree (ratio 0.95-0.99 over 768-1536
# tokens of SmolLM2-135M in bf16, CPU box), each response's within 0.6-1.3x. Twice, as two
# implementations are allowed against each other in tests/tolerances.py; weights 5% off in one
# matrix per layer give 2.8x, 10% 4.5x.
REPRODUCTION_FACTOR = 2.0


def dtype_name(dtype) -> str:
    """The name of a torch or mlx dtype ("float32", "bfloat16", ...); a name is returned as it is."""
    return str(dtype).rsplit(".", 1)[-1]


def logprob_tolerance(dtype) -> float:
    """The tolerance for a compute dtype (a torch/mlx dtype or its name)."""
    return LOGPROB_TOLERANCE.get(dtype_name(dtype), LOGPROB_TOLERANCE["bfloat16"])


def row_seed(seed: int, sample_index: int) -> int:
    """Seed of one sample's random stream, from the prompt's seed and the sample's index."""
    return (int(seed) * 1_000_003 + sample_index * 7919 + 1) % (2**63 - 1)


def ended_by_stop(token_ids, stop_ids, ignore_eos: bool) -> bool:
    """`Sample.finished`: the row's last token is a stop id, unless `ignore_eos` (vLLM's), under which nothing
    stops a row, so a stop id it drew as its last token is not an end of turn (the reply was cut by length)."""
    return not ignore_eos and bool(token_ids) and token_ids[-1] in stop_ids


def candidate_count(top_k: int, vocab_size: int) -> int:
    """How many of the largest logits can survive top-k: k, or the whole vocabulary."""
    return int(top_k) if top_k and 0 < top_k < vocab_size else int(vocab_size)


def uses_nucleus(top_p: float) -> bool:
    return 0.0 < top_p < 1.0


def keep_thresholds(top_logits: np.ndarray, top_p: float) -> np.ndarray:
    """Smallest kept logit per row, `[B]`, given each row's top-k candidate logits `[B, k]` (any
    order; the tokens outside them are already out) and the nucleus mass `top_p`.

    Without a nucleus (`top_p` >= 1 or <= 0) that is the k-th largest logit. With one, the
    candidates' softmax is taken in float64 and a candidate is kept while the mass strictly above
    its logit is < top_p.
    """
    values = -np.sort(-np.asarray(top_logits, dtype=np.float64), axis=-1)  # descending
    rows = np.arange(values.shape[0])
    if not uses_nucleus(top_p):
        return values[:, -1]
    probs = np.exp(values - values[:, :1])
    probs /= probs.sum(axis=-1, keepdims=True)
    before = np.concatenate([np.zeros_like(probs[:, :1]), np.cumsum(probs, axis=-1)[:, :-1]], axis=-1)
    # A tied token's mass "strictly above" is the mass before the first token of its tie group.
    position = np.arange(values.shape[1])[None, :]
    starts_group = np.concatenate([np.ones_like(values[:, :1], dtype=bool), values[:, 1:] != values[:, :-1]], axis=-1)
    group_start = np.maximum.accumulate(np.where(starts_group, position, 0), axis=-1)
    above = np.take_along_axis(before, group_start, axis=-1)
    kept = (above < top_p).sum(axis=-1)  # `above` never decreases, so the kept ones are a prefix
    return values[rows, np.maximum(kept, 1) - 1]


def reference_keep_mask(logits: np.ndarray, top_k: int, top_p: float) -> np.ndarray:
    """The filter rule token by token, by brute force (for tests): `[B, V]` bool."""
    logits = np.asarray(logits, dtype=np.float64)
    keep = np.ones(logits.shape, dtype=bool)
    for b, row in enumerate(logits):
        k = candidate_count(top_k, row.size)
        kth = np.sort(row)[::-1][k - 1]
        in_top_k = row >= kth
        probs = np.where(in_top_k, np.exp(row - row.max()), 0.0)
        probs /= probs.sum()
        for v in range(row.size):
            above = probs[row > row[v]].sum()
            keep[b, v] = in_top_k[v] and (not uses_nucleus(top_p) or above < top_p)
    return keep
