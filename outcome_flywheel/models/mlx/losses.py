"""The trainers' losses in MLX: the mirror of `torch/losses.py`, formula for formula (parity tests:
tests/models/test_models_parity.py). Formulas and references: `gspo_config.py`, `dpo_config.py`."""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn

from outcome_flywheel.models.train.gspo_config import OBJECTIVES


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
    ref_logp: mx.array | None = None,
    kl_beta: float = 0.0,
    normaliser: float | None = None,
    sequence_advantages: "mx.array | None" = None,
    sequence_clip: tuple[float, float] = (3e-4, 4e-4),
    kl_mask: "mx.array | None" = None,
) -> tuple[mx.array, dict[str, mx.array]]:
    """The mirror of torch's `gspo_loss`, formula for formula (formulas and papers: `gspo_config.py`).

    objective "token": loss = sum_it m_it [-w_it min(r_it A_it, clip(r_it, 1 - eps_low, 1 + eps_high) A_it)
    + beta k3_it] / Z + sum_i |y_i| (-w_i min(s_i N_i, clip(s_i, 1 - seq_low, 1 + seq_high) N_i)) / Z, r_it and w_it per
    token, advantages [B, T] or [B], Z = `normaliser` (default: the batch's response tokens), N =
    `sequence_advantages` (None: no sequence term), (seq_low, seq_high) = `sequence_clip`. "gspo": the sequence ratio s_i and weight w_i, advantages [B].
    "reward_weighted": -A_i mean_t log pi_theta. k3_it = exp(q) - 1 - q, q = log pi_ref - log pi_theta.
    """
    maskf = mask.astype(logp.dtype)
    lengths = mx.maximum(maskf.sum(axis=-1), 1.0)
    mean_logp = (logp * maskf).sum(axis=-1) / lengths
    old = mx.stop_gradient(old_logp.astype(logp.dtype))
    advantages = advantages.astype(logp.dtype)
    is_weight, seq_clipped = None, None
    if behavior_logp is not None and tis_cap is not None:
        behaviour = behavior_logp.astype(logp.dtype)
        is_ratio = (
            mx.exp(old - behaviour)
            if objective == "token"
            else mx.exp(((old - behaviour) * maskf).sum(axis=-1) / lengths)
        )
        is_ratio = mx.stop_gradient(is_ratio)
        is_weight = mx.minimum(is_ratio, float(tis_cap))
    on = maskf > 0
    if objective == "token":
        token_adv = advantages if advantages.ndim == 2 else mx.broadcast_to(advantages[:, None], logp.shape)
        ratio = mx.exp(logp - old)
        clipped = mx.clip(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)
        per_token = -mx.minimum(ratio * token_adv, clipped * token_adv)
        if is_weight is not None:
            per_token = per_token * is_weight
        z = mx.maximum(maskf.sum(), 1.0) if normaliser is None else mx.array(float(normaliser), dtype=logp.dtype)
        loss = (per_token * maskf).sum() / z
        if sequence_advantages is not None:  # the whole-note part: GSPO's sequence ratio and band
            seq_adv = sequence_advantages.astype(logp.dtype)
            s_i = mx.exp(((logp - old) * maskf).sum(axis=-1) / lengths)
            s_clipped = mx.clip(s_i, 1.0 - sequence_clip[0], 1.0 + sequence_clip[1])
            sequence_term = -mx.minimum(s_i * seq_adv, s_clipped * seq_adv)
            if is_weight is not None:
                seq_is = mx.stop_gradient(
                    mx.exp(((old - behavior_logp.astype(logp.dtype)) * maskf).sum(axis=-1) / lengths)
                )
                sequence_term = sequence_term * mx.minimum(seq_is, float(tis_cap))
            loss = loss + (sequence_term * lengths).sum() / z  # one normaliser for every part, as torch's
            s_sg = mx.stop_gradient(s_i)
            seq_clipped = ((s_sg < 1.0 - sequence_clip[0]) & (seq_adv < 0)) | (
                (s_sg > 1.0 + sequence_clip[1]) & (seq_adv > 0)
            )
        active = on & (token_adv != 0)
        ratio_sg = mx.stop_gradient(ratio)
        low, high = (ratio_sg < 1.0 - epsilon_low) & (token_adv < 0), (ratio_sg > 1.0 + epsilon_high) & (token_adv > 0)
        count = mx.maximum(on.sum(), 1)
        ratio_mean = (ratio_sg * maskf).sum() / count
        ratio_min = mx.where(on, ratio_sg, mx.inf).min()
        ratio_max = mx.where(on, ratio_sg, -mx.inf).max()
    elif objective in ("gspo", "reward_weighted"):
        if advantages.ndim != 1:
            raise ValueError(
                f"objective {objective!r} takes one advantage per sequence, got shape {tuple(advantages.shape)}"
            )
        ratio = mx.exp(((logp - old) * maskf).sum(axis=-1) / lengths)
        if objective == "gspo":
            clipped = mx.clip(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)
            per_sequence = -mx.minimum(ratio * advantages, clipped * advantages)
        else:
            per_sequence = -advantages * mean_logp
        if is_weight is not None:
            per_sequence = per_sequence * is_weight
        loss = per_sequence.mean()
        active = mx.ones(advantages.shape, dtype=mx.bool_)  # per sequence: over all of them, as TRL
        ratio_sg = mx.stop_gradient(ratio)
        low, high = (
            (ratio_sg < 1.0 - epsilon_low) & (advantages < 0),
            (ratio_sg > 1.0 + epsilon_high) & (advantages > 0),
        )
        ratio_mean, ratio_min, ratio_max = ratio_sg.mean(), ratio_sg.min(), ratio_sg.max()
    else:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    kl_tokens = None
    if ref_logp is not None:
        q = mx.stop_gradient(ref_logp.astype(logp.dtype)) - logp
        kl_tokens = mx.exp(q) - 1.0 - q
        kl_m = maskf if kl_mask is None else kl_mask.astype(logp.dtype) * maskf  # the tokens the term covers
        if kl_beta:
            if objective == "token":
                loss = loss + float(kl_beta) * (kl_tokens * kl_m).sum() / z
            else:
                loss = loss + float(kl_beta) * ((kl_tokens * kl_m).sum(axis=-1) / lengths).mean()
    metrics = {
        "clip_fraction": ((low | high) & active).astype(mx.float32).sum()
        / mx.maximum(active.astype(mx.float32).sum(), 1.0),
        "ratio_mean": ratio_mean,
        "ratio_min": ratio_min,
        "ratio_max": ratio_max,
        "mean_logp": mx.stop_gradient(mean_logp).mean(),
    }
    if kl_tokens is not None:
        metrics["kl"] = mx.stop_gradient((kl_tokens * kl_m).sum() / mx.maximum(kl_m.sum(), 1.0))
    if seq_clipped is not None:
        metrics["sequence_clip_fraction"] = seq_clipped.astype(mx.float32).mean()
    if is_weight is not None:
        if objective == "token":
            count = mx.maximum(on.sum(), 1)
            metrics.update(
                is_ratio_mean=(is_ratio * maskf).sum() / count,
                is_ratio_max=mx.where(on, is_ratio, -mx.inf).max(),
                is_truncated_fraction=((is_ratio > float(tis_cap)) & on).astype(mx.float32).sum() / count,
            )
        else:
            metrics.update(
                is_ratio_mean=is_ratio.mean(),
                is_ratio_max=is_ratio.max(),
                is_truncated_fraction=(is_ratio > float(tis_cap)).astype(mx.float32).mean(),
            )
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
    norm = (
        mx.maximum(weights.sum(), 1e-12)
        if mean_weight is None
        else mx.array(len(per_pair) * mean_weight, dtype=per_pair.dtype)
    )
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
    metrics = {
        "completion_tokens": mx.stop_gradient(tokens),
        "geometric_mean_token_prob": mx.stop_gradient(mx.exp(-loss)),
    }
    return loss, metrics


def side_probability_loss(
    logp: mx.array, side_mask: mx.array, coefficients: mx.array, normaliser: float
) -> tuple[mx.array, dict[str, mx.array]]:
    """The counterfactual side term: the mirror of torch's `side_probability_loss` (-sum_i c_i pi_i / Z)."""
    probability = mx.exp((logp * side_mask.astype(logp.dtype)).sum(-1))
    coefficients = coefficients.astype(logp.dtype)
    loss = -(coefficients * probability).sum() / float(normaliser)
    on = (coefficients != 0).astype(logp.dtype)
    mean = mx.stop_gradient((probability * on).sum() / on.sum())  # NaN: no row has the term
    return loss, {"side_probability": mean, "side_loss": mx.stop_gradient(loss)}


def side_pair_loss(
    own_logp: mx.array,
    own_mask: mx.array,
    rows: mx.array,
    other_logp: mx.array,
    other_mask: mx.array,
    coefficients: mx.array,
    normaliser: float,
    directions: mx.array | None = None,
) -> tuple[mx.array, dict[str, mx.array]]:
    """The counterfactual term's `pair` form: the mirror of torch's `side_pair_loss`
    (-sum_i |c_i| log sigmoid(sign(c_i) (l_own,i - l_other,i)) / Z, `directions` centring the side pairs as
    there: `centered_pair`); log sigmoid(x) = -logaddexp(0, -x)."""
    own = mx.take((own_logp * own_mask.astype(own_logp.dtype)).sum(-1), rows.astype(mx.int32))
    other = (other_logp * other_mask.astype(other_logp.dtype)).sum(-1)
    c = coefficients.astype(own_logp.dtype)
    x = own - other
    if directions is not None:
        d = directions.astype(own_logp.dtype)
        x = x - d * (d * x).sum() / mx.maximum(mx.abs(d).sum(), 1.0)
    margin = mx.sign(c) * x
    loss = (mx.abs(c) * mx.logaddexp(mx.zeros_like(margin), -margin)).sum() / float(normaliser)
    return loss, {"side_loss": mx.stop_gradient(loss)}


def side_lean_loss(
    own_logp: mx.array,
    own_mask: mx.array,
    rows: mx.array,
    other_logp: mx.array,
    other_mask: mx.array,
    directions: mx.array,
    old_margins: mx.array | None,
    weight: float,
    long_share: float | None = None,
    target_weight: float = 0.0,
) -> tuple[mx.array, dict[str, mx.array]]:
    """The side pairs' lean terms: the mirror of torch's `side_lean_loss` (the anchor weight * lean^2, lean = the
    side pairs' mean d_i (x_i - x_old,i); the target target_weight * KL(p || sigmoid(mean d_i x_i)));
    log sigmoid(x) = -logaddexp(0, -x)."""
    own = mx.take((own_logp * own_mask.astype(own_logp.dtype)).sum(-1), rows.astype(mx.int32))
    other = (other_logp * other_mask.astype(other_logp.dtype)).sum(-1)
    d = directions.astype(own_logp.dtype)
    sides = mx.abs(d).sum()
    loss, metrics = mx.zeros((), dtype=own_logp.dtype), {}
    if old_margins is not None:
        lean = (d * (own - other - old_margins.astype(own_logp.dtype))).sum() / mx.maximum(sides, 1.0)
        loss = loss + float(weight) * mx.square(lean)
        metrics["side_lean"] = mx.stop_gradient(lean)
    if long_share is not None:
        p = float(long_share)
        margin = (d * (own - other)).sum() / mx.maximum(sides, 1.0)
        zero = mx.zeros_like(margin)
        kl = p * (math.log(p) + mx.logaddexp(zero, -margin)) + (1.0 - p) * (
            math.log(1.0 - p) + mx.logaddexp(zero, margin)
        )
        loss = loss + float(target_weight) * kl * (sides > 0).astype(kl.dtype)
        metrics["side_lean_margin"] = mx.where(sides > 0, mx.stop_gradient(margin), mx.array(float("nan")))
    return loss, metrics


def exact_kl_loss(kl: mx.array, beta: float, normaliser: float) -> tuple[mx.array, dict[str, mx.array]]:
    """The exact KL penalty: the mirror of torch's `exact_kl_loss` (beta * sum_n KL_n / Z)."""
    loss = kl.sum() * (float(beta) / float(normaliser))
    return loss, {"kl": mx.stop_gradient(kl.mean())}
