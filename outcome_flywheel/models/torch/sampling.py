"""The PyTorch sampler: our own batched loop over the model's KV cache rather than `generate()`,
for two reasons: each prompt gets its own random generator (seeded by the caller, so a headline's
samples do not depend on which other headlines share the batch), and the log-probability of every
sampled token is recorded under the policy at the sampling temperature (log-softmax of logits / T,
before top-k / top-p, as TRL's GRPO and verl define it): the exact quantity teacher forcing at
temperature T reproduces (`batch_logprobs(..., temperature=T)`) and GSPO's pi_old.
`mlx/sampling.py` is its mirror."""

from __future__ import annotations

from typing import Sequence

import torch

from outcome_flywheel.models.interface import Sample, SamplingConfig
from outcome_flywheel.models.sampling import candidate_count, ended_by_stop, keep_thresholds, row_seed, uses_nucleus
from outcome_flywheel.models.torch.graph_sampler import inverse_cdf, sampling_rule
from outcome_flywheel.models.torch.static_cache import attention_kernels


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Top-k then nucleus (top-p) on temperature-scaled logits: the rule of `sampling.py`, whose
    one threshold per row is computed on the host from the top-k candidates."""
    k = candidate_count(top_k, logits.shape[-1])
    if k == logits.shape[-1] and not uses_nucleus(top_p):
        return logits
    top = torch.topk(logits, k, dim=-1).values
    # to the host first: MPS has no float64 (keep_thresholds works in float64 on the host)
    threshold = torch.from_numpy(keep_thresholds(top.float().cpu().numpy(), top_p)).to(logits.dtype).to(logits.device)
    return logits.masked_fill(logits < threshold[:, None], float("-inf"))


def left_padded(
    prompt_ids: Sequence[Sequence[int]], pad: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`(input_ids, attention_mask, position_ids)` of prompts padded on the left, so every row's
    next token sits in the last column; positions count real tokens only."""
    width = max(len(p) for p in prompt_ids)
    ids = torch.full((len(prompt_ids), width), pad, dtype=torch.long)
    attention = torch.zeros((len(prompt_ids), width), dtype=torch.long)
    for i, p in enumerate(prompt_ids):
        ids[i, width - len(p) :] = torch.tensor(list(p))
        attention[i, width - len(p) :] = 1
    ids, attention = ids.to(device), attention.to(device)
    return ids, attention, (attention.cumsum(-1) - 1).clamp(min=0)


def sample_batch(
    backend, prompt_ids: list[list[int]], n: int, cfg: SamplingConfig, seeds: Sequence[int]
) -> list[list[Sample]]:
    """`n` samples for each tokenised prompt of one forward batch (`TorchBackend._sample_batch`)."""
    pad = backend.tokenizer.pad_token_id
    rows = [(i, j) for i in range(len(prompt_ids)) for j in range(n)]
    input_ids, attention, positions = left_padded(prompt_ids, pad, backend.device)
    # Each row's uniforms for every step, drawn up front from its own generator; sampling is
    # then one vectorised inverse-CDF lookup per step (no per-row multinomial calls).
    uniforms = (
        torch.stack(
            [
                torch.rand(
                    cfg.max_new_tokens,
                    generator=torch.Generator().manual_seed(row_seed(seeds[i], j)),
                    dtype=torch.float64,
                )
                for i, j in rows
            ]
        ).to(backend.device)
        if cfg.temperature > 0
        else None
    )

    with attention_kernels(backend.device):
        # The prompt is run once (the prefill); its KV cache then serves its n samples.
        outputs = backend.model(
            input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True, logits_to_keep=1
        )
        engine = getattr(backend, "graph_sampler", None)
        if engine is not None and not engine.unusable_reason(len(rows), input_ids.shape[1], cfg.max_new_tokens):
            rows_prompt = torch.tensor([i for i, _ in rows], dtype=torch.long, device=backend.device)
            rule = sampling_rule(backend, cfg, outputs.logits.shape[-1])
            decoded = engine.decode(
                outputs, rows_prompt, attention, positions[:, -1] + 1, uniforms, cfg.max_new_tokens, rule
            )
        else:
            decoded = _decode(backend, rows, n, cfg, outputs, attention, positions, uniforms)
    return _grouped(backend, prompt_ids, rows, cfg.ignore_eos, *decoded)


def _decode(
    backend, rows, n, cfg, outputs, attention, positions, uniforms
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The eager decode loop over transformers' dynamic cache (CPU, MPS, and what the static
    sampler does not take): `(tokens, logps, alive)`, each `[rows, steps]`."""
    pad = backend.tokenizer.pad_token_id
    past = outputs.past_key_values
    past.batch_repeat_interleave(n)
    logits = outputs.logits[:, -1, :].float().repeat_interleave(n, dim=0)
    attention = attention.repeat_interleave(n, dim=0)
    next_pos = positions[:, -1:].repeat_interleave(n, dim=0) + 1

    # Per step, for every row: its token, its log-prob, and whether the row was still going.
    # Finished rows leave the batch (and the cache); `active` maps batch rows to rows.
    total = len(rows)
    step_tokens, step_logps, step_alive = [], [], []
    active = torch.arange(total, device=backend.device)
    stop = torch.tensor(sorted(backend.stop_ids) if not cfg.ignore_eos else [], dtype=torch.long, device=backend.device)
    banned = torch.tensor(backend.banned_ids(cfg), dtype=torch.long, device=backend.device)
    for step in range(cfg.max_new_tokens):
        scaled = logits / cfg.temperature if cfg.temperature > 0 else logits  # greedy: temperature 1
        # pi_old is the whole vocabulary's distribution; the ban (think tokens) is a filter, as top-k
        lse = torch.logsumexp(scaled, dim=-1)
        if len(banned):
            scaled = scaled.index_fill(-1, banned, float("-inf"))
        if cfg.temperature <= 0:
            chosen = scaled.argmax(-1)
        else:
            probs = filter_logits(scaled, cfg.top_k, cfg.top_p).softmax(-1)
            chosen = inverse_cdf(probs, uniforms[active, step : step + 1])
        tokens_now = torch.full((total,), pad, dtype=torch.long, device=backend.device)
        logps_now = torch.zeros(total, dtype=lse.dtype, device=backend.device)
        alive_now = torch.zeros(total, dtype=torch.bool, device=backend.device)
        tokens_now[active] = chosen
        logps_now[active] = (
            logits.gather(-1, chosen[:, None])[:, 0] / (cfg.temperature if cfg.temperature > 0 else 1.0) - lse
        )
        alive_now[active] = True
        step_tokens.append(tokens_now)
        step_logps.append(logps_now)
        step_alive.append(alive_now)
        keep = ~torch.isin(chosen, stop)
        if not bool(keep.any()) or step == cfg.max_new_tokens - 1:
            break
        if not bool(keep.all()):
            kept = torch.nonzero(keep).flatten()
            past.batch_select_indices(kept)
            active, chosen, attention, next_pos = active[kept], chosen[kept], attention[kept], next_pos[kept]
        attention = torch.cat([attention, torch.ones_like(attention[:, :1])], dim=-1)
        outputs = backend.model(
            input_ids=chosen[:, None],
            attention_mask=attention,
            position_ids=next_pos,
            past_key_values=past,
            use_cache=True,
            logits_to_keep=1,
            cache_position=torch.full((1,), attention.shape[1] - 1, dtype=torch.long, device=backend.device),
        )
        past = outputs.past_key_values
        logits = outputs.logits[:, -1, :].float()
        next_pos = next_pos + 1

    return torch.stack(step_tokens, dim=1), torch.stack(step_logps, dim=1), torch.stack(step_alive, dim=1)


def _grouped(
    backend,
    prompt_ids,
    rows,
    ignore_eos: bool,
    step_tokens: torch.Tensor,
    step_logps: torch.Tensor,
    step_alive: torch.Tensor,
) -> list[list[Sample]]:
    """Per prompt, its samples: each row's tokens and log-probs while it was alive."""
    # One device->host copy at the end instead of per-token reads inside the loop.
    total = len(rows)
    all_tokens = step_tokens.tolist()
    all_logps = step_logps.double().tolist()
    alive = step_alive.tolist()
    tokens = [[t for t, a in zip(all_tokens[r], alive[r]) if a] for r in range(total)]
    logps = [[lp for lp, a in zip(all_logps[r], alive[r]) if a] for r in range(total)]
    grouped: list[list[Sample]] = [[] for _ in prompt_ids]
    for r, (i, _) in enumerate(rows):
        finished = ended_by_stop(tokens[r], backend.stop_ids, ignore_eos)
        grouped[i].append(
            Sample(text=backend.decode(tokens[r]), token_ids=tokens[r], logprobs=logps[r], finished=finished)
        )
    return grouped
