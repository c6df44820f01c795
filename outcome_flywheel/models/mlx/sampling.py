"""The MLX sampler, the mirror of `torch/sampling.py`: our own batched loop over mlx-lm's
`BatchKVCache` (left-padded prompts, per-row RoPE offsets). Every sample row has its own PRNG key,
derived from the prompt's seed and the sample index, so a prompt's samples do not depend on the rest
of the batch. The log-prob recorded for each sampled token is under the policy at the sampling
temperature (logits / T, before top-k / top-p, as torch): what teacher forcing at T reproduces and
GSPO needs as pi_old."""

from __future__ import annotations

from typing import Sequence

import mlx.core as mx
import numpy as np

from outcome_flywheel.models.interface import Sample, SamplingConfig
from outcome_flywheel.models.sampling import candidate_count, ended_by_stop, keep_thresholds, row_seed, uses_nucleus


def filter_logits(logits: mx.array, top_k: int, top_p: float) -> mx.array:
    """Top-k then nucleus (top-p) on temperature-scaled logits: the rule of `sampling.py`, as the
    torch backend (one threshold per row, computed on the host from the top-k candidates)."""
    k = candidate_count(top_k, logits.shape[-1])
    if k == logits.shape[-1] and not uses_nucleus(top_p):
        return logits
    top = mx.topk(logits, k, axis=-1) if k < logits.shape[-1] else logits
    threshold = mx.array(keep_thresholds(np.array(top.astype(mx.float32)), top_p).astype(np.float32)).astype(
        logits.dtype
    )
    return mx.where(logits < threshold[:, None], mx.array(-float("inf"), dtype=logits.dtype), logits)


_split_keys = mx.vmap(lambda key: mx.random.split(key))
_categorical = mx.vmap(lambda logits, key: mx.random.categorical(logits, key=key))


def sample_batch(
    backend, prompt_ids: list[list[int]], n: int, cfg: SamplingConfig, seeds: Sequence[int]
) -> list[list[Sample]]:
    """`n` samples for each tokenised prompt of one forward batch (`MLXBackend._sample_batch`)."""
    from mlx_lm.models.cache import BatchKVCache

    pad = backend.tokenizer.pad_token_id
    rows = [(i, j) for i in range(len(prompt_ids)) for j in range(n)]
    width = max(len(p) for p in prompt_ids)
    # Left padding so every row's next token sits in the last column; the cache masks the
    # padding and starts each row's RoPE positions at its first real token.
    inputs = np.full((len(rows), width), pad, dtype=np.int32)
    left_padding = []
    for r, (i, _) in enumerate(rows):
        ids = prompt_ids[i]
        inputs[r, width - len(ids) :] = ids
        left_padding.append(width - len(ids))
    cache = [BatchKVCache(left_padding) for _ in backend.model.layers]
    keys = mx.stack([mx.random.key(row_seed(seeds[i], j)) for i, j in rows])
    stop = np.array(sorted(backend.stop_ids) if not cfg.ignore_eos else [], dtype=np.int64)
    banned_ids = backend.banned_ids(cfg)

    tokens: list[list[int]] = [[] for _ in rows]
    logps: list[list[float]] = [[] for _ in rows]
    done = np.zeros(len(rows), dtype=bool)
    logits = backend.model(mx.array(inputs), cache=cache)[:, -1, :].astype(mx.float32)
    banned = None
    if banned_ids:
        flags = np.zeros(logits.shape[-1], dtype=bool)
        flags[banned_ids] = True
        banned = mx.array(flags)[None, :]
    for _ in range(cfg.max_new_tokens):
        scaled = logits / cfg.temperature if cfg.temperature > 0 else logits  # greedy: temperature 1
        # pi_old: the chosen logit minus a logsumexp (no [B, V] log-prob array)
        behaviour, lse = scaled, mx.logsumexp(scaled, axis=-1)
        if banned is not None:  # a filter, as top-k: pi_old stays the whole vocabulary's distribution
            scaled = mx.where(banned, mx.array(-float("inf"), dtype=scaled.dtype), scaled)
        if cfg.temperature <= 0:
            chosen = mx.argmax(scaled, axis=-1)
        else:
            split = _split_keys(keys)
            step_keys, keys = split[:, 0], split[:, 1]
            chosen = _categorical(filter_logits(scaled, cfg.top_k, cfg.top_p), step_keys)
        chosen = mx.where(mx.array(done), pad, chosen.astype(mx.int32))
        chosen_logp = mx.take_along_axis(behaviour, chosen[:, None], axis=-1)[:, 0] - lse
        mx.eval(chosen, chosen_logp, keys)
        chosen_np, logp_np = np.array(chosen), np.array(chosen_logp)
        for r in np.flatnonzero(~done):
            tokens[r].append(int(chosen_np[r]))
            logps[r].append(float(logp_np[r]))
        done = done | np.isin(chosen_np, stop)
        if done.all():
            break
        logits = backend.model(chosen[:, None], cache=cache)[:, -1, :].astype(mx.float32)

    grouped: list[list[Sample]] = [[] for _ in prompt_ids]
    for r, (i, _) in enumerate(rows):
        finished = ended_by_stop(tokens[r], backend.stop_ids, cfg.ignore_eos)
        grouped[i].append(
            Sample(text=backend.decode(tokens[r]), token_ids=tokens[r], logprobs=logps[r], finished=finished)
        )
    return grouped
