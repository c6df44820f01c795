"""The trainers' losses in MLX: the mirror of `torch/losses.py`, formula for formula (parity tests:
tests/test_models_parity.py). Formulas and references: `gspo_config.py`, `dpo_config.py`."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from outcome_flywheel.models.gspo_config import OBJECTIVES


def gspo_loss(
    logp: mx.array,
    old_logp: mx.array,
    mask: mx.array,
    advantages: mx.array,
    epsilon_low: float = 3e-4,
    epsilon_high: float = 4e-4,
    objective: str = "gspo",
    behavior_logp: mx.array | None = None,
    tis_cap: float | None = None,
) -> tuple[mx.array, dict[str, mx.array]]:
    """GSPO (Zheng et al. 2025) or reward-weighted loss of a padded batch:

        s_i  = exp(mean_t(log pi_theta - log pi_old))  over response tokens
        loss = mean_i -min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i)

    objective "reward_weighted": loss = mean_i -A_i mean_t log pi_theta (the original loop).
    With `behavior_logp` and `tis_cap` (notes sampled by an older policy, trained days later): each
    sequence's term is weighted by the truncated behaviour IS ratio (TIS), a constant,
        w_i = min(exp(mean_t(log pi_old - log pi_behaviour)), tis_cap)
    where pi_old is the policy the update started from. Metrics add is_ratio_mean / is_ratio_max
    (before truncation) and is_truncated_fraction.
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
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    is_ratio = None
    if behavior_logp is not None and tis_cap is not None:
        old = mx.stop_gradient(old_logp.astype(logp.dtype))
        is_ratio = mx.stop_gradient(mx.exp(((old - behavior_logp.astype(logp.dtype)) * maskf).sum(axis=-1) / lengths))
        per_sequence = per_sequence * mx.minimum(is_ratio, float(tis_cap))
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
    if is_ratio is not None:
        metrics.update(is_ratio_mean=is_ratio.mean(), is_ratio_max=is_ratio.max(),
                       is_truncated_fraction=(is_ratio > float(tis_cap)).astype(mx.float32).mean())
    return loss, metrics


def weighted_dpo_loss(
    policy_chosen_logps: mx.array,
    policy_rejected_logps: mx.array,
    ref_chosen_logps: mx.array,
    ref_rejected_logps: mx.array,
    weights: mx.array,
    beta: float,
    mean_weight: float | None = None,
) -> tuple[mx.array, dict[str, mx.array]]:
    """DPO (Rafailov et al. 2023) with a weight per pair, over sequence-summed log-probs [B]:

        l_i = -log sigmoid(beta ((pi_c - ref_c) - (pi_r - ref_r))),  loss = sum_B w_i l_i / (B * mean_weight)

    with `mean_weight` over the whole training set (as torch), else the batch's own sum of weights.
    """
    chosen_logratio = policy_chosen_logps - ref_chosen_logps
    rejected_logratio = policy_rejected_logps - ref_rejected_logps
    logits = beta * (chosen_logratio - rejected_logratio)
    per_pair = -nn.log_sigmoid(logits)
    weights = weights.astype(per_pair.dtype)
    norm = mx.maximum(weights.sum(), 1e-12) if mean_weight is None else mx.array(len(per_pair) * mean_weight, dtype=per_pair.dtype)
    loss = (weights * per_pair).sum() / norm
    chosen_reward = mx.stop_gradient(beta * chosen_logratio)
    rejected_reward = mx.stop_gradient(beta * rejected_logratio)
    metrics = {
        "rewards_chosen": chosen_reward.mean(),
        "rewards_rejected": rejected_reward.mean(),
        "rewards_margin": (chosen_reward - rejected_reward).mean(),
        "rewards_accuracy": (chosen_reward > rejected_reward).astype(mx.float32).mean(),
    }
    return loss, metrics


def sft_loss(logp: mx.array, mask: mx.array) -> tuple[mx.array, dict[str, mx.array]]:
    """Completion-only SFT: the mirror of torch's `sft_loss` (mean NLL over the completion tokens)."""
    maskf = mask.astype(logp.dtype)
    tokens = mx.maximum(maskf.sum(), 1.0)
    loss = -(logp * maskf).sum() / tokens
    metrics = {"completion_tokens": mx.stop_gradient(tokens), "geometric_mean_token_prob": mx.stop_gradient(mx.exp(-loss))}
    return loss, metrics
