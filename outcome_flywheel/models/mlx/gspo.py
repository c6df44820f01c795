"""GSPO for the daily loop in MLX: the mirror of `gspo.py` (torch), formula for formula.

Same batching plan (`sampling.gspo_batch_plan`: one `random.Random(config.seed)` shuffling whole
prompt groups), same temperature (log-probs of logits / `config.temperature` in the pi_old and
pi_theta passes), same pi_old (by default one no-grad pass of the training forward before the
first update, so the ratio starts at exactly 1), same loss; parity is tested over several
optimiser steps. Only the log-prob function and the optimiser loop are mlx's own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import mlx.core as mx
import numpy as np

from outcome_flywheel.models.interface import TrainStats
from outcome_flywheel.models.sampling import gspo_minibatches

if TYPE_CHECKING:
    from outcome_flywheel.models.torch.gspo import GSPOConfig, GSPOExample
    from outcome_flywheel.models.mlx.backend import MLXBackend


def gspo_loss(
    logp: mx.array, old_logp: mx.array, mask: mx.array, advantages: mx.array,
    epsilon_low: float = 3e-4, epsilon_high: float = 4e-4, objective: str = "gspo",
) -> tuple[mx.array, dict[str, mx.array]]:
    """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization"), as `gspo.gspo_loss`:

        s_i  = exp(mean_t(log pi_theta - log pi_old))  over response tokens
        loss = mean_i -min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i)

    objective "reward_weighted": loss = mean_i -A_i mean_t log pi_theta (the original loop).
    `logp`, `old_logp`, `mask`: [B, T]; `advantages`: [B]. Metrics as torch: clip_fraction
    (TRL's definition: the clipped term is the active one), ratio mean/min/max, mean logp.
    """
    maskf = mask.astype(logp.dtype)
    lengths = mx.maximum(maskf.sum(axis=-1), 1.0)
    mean_logp = (logp * maskf).sum(axis=-1) / lengths
    log_ratio = ((logp - old_logp.astype(logp.dtype)) * maskf).sum(axis=-1) / lengths
    ratio = mx.exp(log_ratio)
    advantages = advantages.astype(logp.dtype)
    if objective == "gspo":
        clipped = mx.clip(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)
        per_sequence = -mx.minimum(ratio * advantages, clipped * advantages)
    elif objective == "reward_weighted":
        per_sequence = -advantages * mean_logp
    else:
        raise ValueError(f"objective must be 'gspo' or 'reward_weighted', got {objective!r}")
    loss = per_sequence.mean()
    ratio_sg = mx.stop_gradient(ratio)
    low = (ratio_sg < 1.0 - epsilon_low) & (advantages < 0)
    high = (ratio_sg > 1.0 + epsilon_high) & (advantages > 0)
    metrics = {
        "clip_fraction": (low | high).astype(mx.float32).mean(),
        "ratio_mean": ratio_sg.mean(),
        "ratio_min": ratio_sg.min(),
        "ratio_max": ratio_sg.max(),
        "mean_logp": mx.stop_gradient(mean_logp).mean(),
    }
    return loss, metrics


def train_gspo(backend: "MLXBackend", examples: Sequence["GSPOExample"], config: "GSPOConfig") -> TrainStats:
    """As `gspo.train_gspo`: a fresh LoRA adapter when `config.lora` is set and the policy has
    none (with `lora=None` every weight trains, in fp32: see `MLXBackend.use_master_weights`),
    `config.epochs` passes in the shared batching plan, one AdamW step per minibatch."""
    from outcome_flywheel.models.torch.gspo import _sizes
    from outcome_flywheel.models.mlx.backend import train_loop

    batches = gspo_minibatches(examples, config, backend.prompt_ids)  # validates before any change
    if config.lora is not None and not backend.has_adapter:
        # mlx draws LoRA's A from its global PRNG: seed it so a re-run repeats (the torch
        # caller seeds torch for the same reason).
        mx.random.seed(int(config.seed))
        backend.add_lora(config.lora)
    elif config.lora is None and not backend.has_adapter:
        backend.use_master_weights()
    temperature = config.temperature

    recompute = config.old_logprobs == "recompute" or (config.old_logprobs == "auto" and backend.dtype != mx.float32)
    old_by_batch, behavior_gaps = [], []
    with backend._eval_mode():
        for batch in batches:
            stored = np.zeros((len(batch), max(len(b.response_ids) for b in batch)), dtype=np.float32)
            for i, b in enumerate(batch):
                stored[i, : len(b.behavior_logprobs)] = b.behavior_logprobs
            if recompute:
                old, mask = backend.batch_logprobs([b.prompt_ids for b in batch], [b.response_ids for b in batch], temperature)
                old = mx.stop_gradient(old.astype(mx.float32))
                mx.eval(old)  # now, before any update: this is pi_old
                lengths = np.maximum(np.array(mask).sum(-1), 1)
                behavior_gaps += list(np.abs(((stored - np.array(old)) * np.array(mask)).sum(-1) / lengths))
                old_by_batch.append(old)
            else:
                old_by_batch.append(mx.array(stored))

    def loss_fn(model, indexed_batch):
        index, batch = indexed_batch
        logp, mask = backend.batch_logprobs([b.prompt_ids for b in batch], [b.response_ids for b in batch], temperature)
        advantages = mx.array([b.advantage for b in batch], dtype=mx.float32)
        return gspo_loss(logp, old_by_batch[index], mask, advantages, config.epsilon_low, config.epsilon_high, config.objective)

    stats = (
        train_loop(backend.model, loss_fn, list(enumerate(batches)), config.learning_rate, config.max_grad_norm)
        if batches else TrainStats()
    )
    stats.extra["old_logprobs"] = "recomputed" if recompute else "stored"
    if behavior_gaps:
        stats.extra["behavior_logprob_gap_max"] = float(max(behavior_gaps))
    stats.extra.update(_sizes(batches, config.epochs))
    return stats
