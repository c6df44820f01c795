"""The trainers' losses in PyTorch; `mlx/losses.py` is their mirror, formula for formula (parity
tests: tests/test_models_parity.py). Formulas and references: `gspo_config.py`, `dpo_config.py`."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from outcome_flywheel.models.gspo_config import OBJECTIVES


def gspo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    epsilon_low: float = 3e-4,
    epsilon_high: float = 4e-4,
    objective: str = "gspo",
    behavior_logp: torch.Tensor | None = None,
    tis_cap: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO (Zheng et al. 2025) or reward-weighted loss of a padded batch:

        s_i  = exp(mean_t(log pi_theta - log pi_old))  over response tokens
        loss = mean_i -min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i)

    objective "reward_weighted": loss = mean_i -A_i mean_t log pi_theta (the original loop).
    With `behavior_logp` and `tis_cap` (notes sampled by an older policy, trained days later): each
    sequence's term is weighted by the truncated behaviour IS ratio (TIS), a constant,
        w_i = min(exp(mean_t(log pi_old - log pi_behaviour)), tis_cap)
    where pi_old is the policy the update started from. Metrics add is_ratio_mean / is_ratio_max
    (before truncation) and is_truncated_fraction.
    logp, old_logp, mask: [B, T] (mask true on response tokens); advantages: [B].
    Metrics: clip_fraction (sequences whose clipped term is the active one, TRL's definition:
    ratio above 1+eps_high with A>0 or below 1-eps_low with A<0), ratio mean/min/max, mean logp.
    """
    maskf = mask.to(logp.dtype)
    lengths = maskf.sum(-1).clamp(min=1.0)
    mean_logp = (logp * maskf).sum(-1) / lengths  # mean_t log pi_theta, [B]
    log_ratio = ((logp - old_logp.to(logp.dtype)) * maskf).sum(-1) / lengths
    ratio = torch.exp(log_ratio)  # s_i
    advantages = advantages.to(logp.dtype)
    if objective == "gspo":
        clipped = torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)
        per_sequence = -torch.minimum(ratio * advantages, clipped * advantages)
    elif objective == "reward_weighted":
        per_sequence = -advantages * mean_logp
    else:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    is_ratio = None
    if behavior_logp is not None and tis_cap is not None:
        with torch.no_grad():
            old = old_logp.to(logp.dtype)
            is_ratio = torch.exp(((old - behavior_logp.to(logp.dtype)) * maskf).sum(-1) / lengths)
        per_sequence = per_sequence * torch.clamp(is_ratio, max=float(tis_cap))
    loss = per_sequence.mean()
    with torch.no_grad():
        low = (ratio < 1.0 - epsilon_low) & (advantages < 0)
        high = (ratio > 1.0 + epsilon_high) & (advantages > 0)
        metrics = {
            "clip_fraction": float((low | high).float().mean()),
            "ratio_mean": float(ratio.mean()),
            "ratio_min": float(ratio.min()),
            "ratio_max": float(ratio.max()),
            "mean_logp": float(mean_logp.mean()),
        }
        if is_ratio is not None:
            metrics.update(is_ratio_mean=float(is_ratio.mean()), is_ratio_max=float(is_ratio.max()),
                           is_truncated_fraction=float((is_ratio > float(tis_cap)).float().mean()))
    return loss, metrics


def weighted_dpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    weights: torch.Tensor,
    beta: float,
    mean_weight: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """DPO (Rafailov et al. 2023) with a weight per pair, over sequence-summed log-probs [B]:

        l_i = -log sigmoid(beta ((pi_c - ref_c) - (pi_r - ref_r))),  loss = sum_B w_i l_i / (B * mean_weight)

    with `mean_weight` the mean over the whole training set, so a minibatch estimates the dataset
    objective sum_i w_i l_i / sum_i w_i and a batch of 0.3-weight pairs counts 0.3x a batch of
    1.0-weight pairs. Without it: the batch's own sum of weights.
    """
    chosen_logratio = policy_chosen_logps - ref_chosen_logps
    rejected_logratio = policy_rejected_logps - ref_rejected_logps
    logits = beta * (chosen_logratio - rejected_logratio)
    per_pair = -F.logsigmoid(logits)
    weights = weights.to(per_pair.dtype)
    norm = weights.sum().clamp_min(1e-12) if mean_weight is None else per_pair.new_tensor(len(per_pair) * mean_weight)
    loss = (weights * per_pair).sum() / norm
    with torch.no_grad():
        chosen_reward = beta * chosen_logratio
        rejected_reward = beta * rejected_logratio
        metrics = {
            "rewards_chosen": chosen_reward.mean().item(),
            "rewards_rejected": rejected_reward.mean().item(),
            "rewards_margin": (chosen_reward - rejected_reward).mean().item(),
            "rewards_accuracy": (chosen_reward > rejected_reward).float().mean().item(),
        }
    return loss, metrics


def sft_loss(logp: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """Completion-only SFT (`sft_config.py`): the mean negative log-likelihood over the masked
    (completion) tokens of the batch; prompt tokens are not in `logp` at all. `[B, T]` each."""
    maskf = mask.to(logp.dtype)
    tokens = maskf.sum().clamp(min=1.0)
    loss = -(logp * maskf).sum() / tokens
    with torch.no_grad():
        metrics = {"completion_tokens": float(tokens), "geometric_mean_token_prob": float(torch.exp(-loss))}
    return loss, metrics
