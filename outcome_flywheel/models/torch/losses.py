"""The trainers' losses in PyTorch; `mlx/losses.py` is their mirror, formula for formula (parity
tests: tests/models/test_models_parity.py). Formulas and references: `gspo_config.py`, `dpo_config.py`."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from outcome_flywheel.models.train.gspo_config import OBJECTIVES


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
    ref_logp: torch.Tensor | None = None,
    kl_beta: float = 0.0,
    normaliser: float | None = None,
    sequence_advantages: "torch.Tensor | None" = None,
    sequence_clip: tuple[float, float] = (3e-4, 4e-4),
    kl_mask: "torch.Tensor | None" = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The daily loop's policy loss of a padded batch (formulas and papers: `gspo_config.py`).

    objective "token" (DAPO's token-level clipped surrogate, Dr. GRPO's constant normaliser) for the
    span-scoped parts, plus GSPO's sequence term for the whole-note part:
        r_it = exp(log pi_theta - log pi_old),  w_it = min(exp(log pi_old - log pi_behaviour), tis_cap)
        loss = sum_it m_it [-w_it min(r_it A_it, clip(r_it, 1 - eps_low, 1 + eps_high) A_it) + beta k3_it] / Z
             + sum_i |y_i| (-w_i min(s_i N_i, clip(s_i, 1 - seq_low, 1 + seq_high) N_i)) / Z
      advantages: [B, T] (per token) or [B] (the same on every token); Z = `normaliser` (default: the
      batch's response tokens, DAPO's token mean) for every part: the sequence term weighs each note by its
      length |y_i|, so its gradient on each token is N_i / Z like a span part's A_it / Z; N = `sequence_advantages` [B] (None: no sequence
      term), s_i and w_i as for "gspo" below, (seq_low, seq_high) = `sequence_clip`.
    objective "gspo" (Zheng et al. 2025), advantages [B]:
        s_i  = exp(mean_t(log pi_theta - log pi_old)),  w_i = min(exp(mean_t(log pi_old - log pi_behaviour)), tis_cap)
        loss = mean_i -w_i min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i) + beta mean_i mean_t k3_it
    objective "reward_weighted": loss = mean_i -A_i mean_t log pi_theta (the original loop), + the KL term.
    k3_it = exp(q) - 1 - q, q = log pi_ref - log pi_theta (Schulman's estimator), when `ref_logp` is given;
    `kl_mask` [B, T] (the call's ticker tokens, `GSPOConfig.kl_span`) takes the place of m_it in the beta term
    and in the reported kl (the mean k3 over the tokens the term covers).
    The IS weight is used only with `behavior_logp` and `tis_cap`.
    logp, old_logp, mask (true on response tokens), behavior_logp, ref_logp: [B, T].
    Metrics: clip_fraction (tokens, or sequences for gspo, whose clipped term is the active one, TRL's
    definition: ratio above 1+eps_high with A>0 or below 1-eps_low with A<0; per token over those with A != 0),
    ratio mean/min/max, mean logp, kl (mean k3 per token), is_ratio_* (before truncation).
    """
    maskf = mask.to(logp.dtype)
    lengths = maskf.sum(-1).clamp(min=1.0)
    mean_logp = (logp * maskf).sum(-1) / lengths  # mean_t log pi_theta, [B]
    old = old_logp.to(logp.dtype)
    advantages = advantages.to(logp.dtype)
    is_weight = None
    with torch.no_grad():
        if behavior_logp is not None and tis_cap is not None:
            token_is = torch.exp(old - behavior_logp.to(logp.dtype))
            is_ratio = (
                token_is
                if objective == "token"
                else torch.exp(((old - behavior_logp.to(logp.dtype)) * maskf).sum(-1) / lengths)
            )
            is_weight = torch.clamp(is_ratio, max=float(tis_cap))
    sequence_term = None
    if objective == "token":
        token_adv = advantages if advantages.dim() == 2 else advantages[:, None].expand_as(logp)
        ratio = torch.exp(logp - old)  # r_it
        clipped = torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)
        per_token = -torch.minimum(ratio * token_adv, clipped * token_adv)
        if is_weight is not None:
            per_token = per_token * is_weight
        z = maskf.sum().clamp(min=1.0) if normaliser is None else logp.new_tensor(float(normaliser))
        loss = (per_token * maskf).sum() / z
        if sequence_advantages is not None:  # the whole-note part: GSPO's sequence ratio and band
            seq_adv = sequence_advantages.to(logp.dtype)
            s_i = torch.exp(((logp - old) * maskf).sum(-1) / lengths)
            s_clipped = torch.clamp(s_i, 1.0 - sequence_clip[0], 1.0 + sequence_clip[1])
            sequence_term = -torch.minimum(s_i * seq_adv, s_clipped * seq_adv)
            if is_weight is not None:  # the sequence's TIS weight: its tokens' log-ratios averaged
                with torch.no_grad():
                    seq_is = torch.exp(((old - behavior_logp.to(logp.dtype)) * maskf).sum(-1) / lengths)
                sequence_term = sequence_term * torch.clamp(seq_is, max=float(tis_cap))
            # One normaliser for every part (Dr. GRPO's Z): the sequence term's pull on each of its tokens is
            # N_i / Z, as a span part's is A_it / Z, so each part weighs exactly its declared share.
            loss = loss + (sequence_term * lengths).sum() / z
            seq_clipped = ((s_i < 1.0 - sequence_clip[0]) & (seq_adv < 0)) | (
                (s_i > 1.0 + sequence_clip[1]) & (seq_adv > 0)
            )
        active = (maskf > 0) & (token_adv != 0)
        low, high = (ratio < 1.0 - epsilon_low) & (token_adv < 0), (ratio > 1.0 + epsilon_high) & (token_adv > 0)
        ratio_values = ratio[maskf > 0]
    elif objective in ("gspo", "reward_weighted"):
        if advantages.dim() != 1:
            raise ValueError(
                f"objective {objective!r} takes one advantage per sequence, got shape {tuple(advantages.shape)}"
            )
        ratio = torch.exp(((logp - old) * maskf).sum(-1) / lengths)  # s_i
        if objective == "gspo":
            clipped = torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)
            per_sequence = -torch.minimum(ratio * advantages, clipped * advantages)
        else:
            per_sequence = -advantages * mean_logp
        if is_weight is not None:
            per_sequence = per_sequence * is_weight
        loss = per_sequence.mean()
        z = None
        active = torch.ones_like(advantages, dtype=torch.bool)  # per sequence: over all of them, as TRL
        low, high = (ratio < 1.0 - epsilon_low) & (advantages < 0), (ratio > 1.0 + epsilon_high) & (advantages > 0)
        ratio_values = ratio
    else:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    kl_tokens = None
    if ref_logp is not None:
        q = ref_logp.to(logp.dtype) - logp
        kl_tokens = torch.exp(q) - 1.0 - q  # k3, per token
        kl_m = maskf if kl_mask is None else kl_mask.to(logp.dtype) * maskf  # the tokens the term covers
        if kl_beta:
            if objective == "token":
                loss = loss + float(kl_beta) * (kl_tokens * kl_m).sum() / z
            else:
                loss = loss + float(kl_beta) * ((kl_tokens * kl_m).sum(-1) / lengths).mean()
    with torch.no_grad():
        metrics = {
            "clip_fraction": float(((low | high) & active).sum() / active.sum().clamp(min=1)),
            "ratio_mean": float(ratio_values.mean()) if ratio_values.numel() else 1.0,
            "ratio_min": float(ratio_values.min()) if ratio_values.numel() else 1.0,
            "ratio_max": float(ratio_values.max()) if ratio_values.numel() else 1.0,
            "mean_logp": float(mean_logp.mean()),
        }
        if kl_tokens is not None:
            metrics["kl"] = float((kl_tokens * kl_m).sum() / kl_m.sum().clamp(min=1.0))
        if sequence_term is not None:
            metrics["sequence_clip_fraction"] = float(seq_clipped.float().mean())
        if is_weight is not None:
            values = is_ratio[maskf > 0] if objective == "token" else is_ratio
            metrics.update(
                is_ratio_mean=float(values.mean()),
                is_ratio_max=float(values.max()),
                is_truncated_fraction=float((values > float(tis_cap)).float().mean()),
            )
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


def side_probability_loss(
    logp: torch.Tensor, side_mask: torch.Tensor, coefficients: torch.Tensor, normaliser: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """The counterfactual side term of one set of rows (`gspo_config.py`): pi_i = exp(sum_t m_it log pi_theta,it),
    the side phrase's probability after row i's prefix, and loss = -sum_i c_i pi_i / Z. logp, side_mask: [B, T];
    coefficients: [B] (0 on rows without the term); Z = `normaliser`, the minibatch's (Dr. GRPO's constant).
    Metrics: side_probability, the mean pi_i over the rows with c_i != 0 (NaN: none), and side_loss, the loss."""
    probability = torch.exp((logp * side_mask.to(logp.dtype)).sum(-1))
    coefficients = coefficients.to(logp.dtype)
    loss = -(coefficients * probability).sum() / float(normaliser)
    with torch.no_grad():
        on = (coefficients != 0).to(logp.dtype)
        metrics = {"side_probability": float((probability * on).sum() / on.sum()), "side_loss": float(loss)}
    return loss, metrics


def side_pair_loss(
    own_logp: torch.Tensor,
    own_mask: torch.Tensor,
    rows: torch.Tensor,
    other_logp: torch.Tensor,
    other_mask: torch.Tensor,
    coefficients: torch.Tensor,
    normaliser: float,
    directions: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The counterfactual term's `pair` form (`GSPOConfig.counterfactual_form`): a logistic loss on the decision's
    two actions, the better one preferred, loss = -sum_i |c_i| log sigmoid(sign(c_i) (l_own,i - l_other,i)) / Z,
    l = sum_t m_t log pi_theta,t over the action's tokens (DPO's pair loss, Rafailov et al. 2023, without its
    reference). own_logp, own_mask: [B, T], the minibatch's rows; rows: [C] the carriers' indices in it;
    other_logp, other_mask: [C, T'], their other actions' rows; coefficients: [C], c_i = the own row's. Unlike
    the `probability` form, its pull on a rare action does not shrink with that action's probability.
    `directions` ([C]: +1 the own action is long, -1 short, 0 not a side) makes it `centered_pair`: each side
    pair's margin toward long, d_i (l_own,i - l_other,i), less the mean over the side pairs (d != 0)."""
    own = (own_logp * own_mask.to(own_logp.dtype)).sum(-1)[rows]
    other = (other_logp * other_mask.to(other_logp.dtype)).sum(-1)
    c = coefficients.to(own_logp.dtype)
    x = own - other
    if directions is not None:  # x_i - d_i mean_j(d_j x_j) = d_i (m_i - mean m), as d_i^2 = 1 on side pairs
        d = directions.to(own_logp.dtype)
        x = x - d * (d * x).sum() / d.abs().sum().clamp(min=1.0)
    loss = -(c.abs() * torch.nn.functional.logsigmoid(torch.sign(c) * x)).sum() / float(normaliser)
    return loss, {"side_loss": float(loss.detach())}


def side_lean_loss(
    own_logp: torch.Tensor,
    own_mask: torch.Tensor,
    rows: torch.Tensor,
    other_logp: torch.Tensor,
    other_mask: torch.Tensor,
    directions: torch.Tensor,
    old_margins: torch.Tensor | None,
    weight: float,
    long_share: float | None = None,
    target_weight: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The side pairs' lean terms, on x = l_own - l_other as in `side_pair_loss` over the side pairs (d_i != 0).
    The anchor (`GSPOConfig.side_lean_anchor`, where `old_margins` is given): weight * lean^2, lean = the mean of
    d_i (x_i - x_old,i), x_old at pi_old ([C], no gradient): how far the margins toward long moved together since
    the day began. The target (`GSPOConfig.side_lean_target`, where `long_share` p is given): target_weight *
    KL(p || sigmoid(M)), M = the mean margin toward long d_i x_i: its minimum puts M at logit(p), the share of
    the update's side pairs where long did better. Rows and masks as `side_pair_loss`'s; a minibatch without a
    side pair takes 0 from both. Metrics: side_lean (the anchor's lean), side_lean_margin (M; NaN: no side pair)."""
    own = (own_logp * own_mask.to(own_logp.dtype)).sum(-1)[rows]
    other = (other_logp * other_mask.to(other_logp.dtype)).sum(-1)
    d = directions.to(own_logp.dtype)
    sides = d.abs().sum()
    loss, metrics = own.new_zeros(()), {}
    if old_margins is not None:
        lean = (d * (own - other - old_margins.to(own_logp.dtype))).sum() / sides.clamp(min=1.0)
        loss = loss + float(weight) * lean.square()
        metrics["side_lean"] = float(lean.detach())
    if long_share is not None:
        p = float(long_share)
        margin = (d * (own - other)).sum() / sides.clamp(min=1.0)
        kl = p * (math.log(p) - F.logsigmoid(margin)) + (1.0 - p) * (math.log(1.0 - p) - F.logsigmoid(-margin))
        loss = loss + float(target_weight) * kl * (sides > 0).to(kl.dtype)
        metrics["side_lean_margin"] = float(margin.detach()) if float(sides) > 0 else float("nan")
    return loss, metrics


def exact_kl_loss(kl: torch.Tensor, beta: float, normaliser: float) -> tuple[torch.Tensor, dict[str, float]]:
    """The exact KL penalty (`GSPOConfig.kl_estimator` exact): beta * sum_n KL_n / Z, KL_n = sum_v pi_theta(v)
    (log pi_theta(v) - log pi_ref(v)) at each covered position n (`kl`: [N], the backend's `position_kl`), Z the
    minibatch's normaliser (Dr. GRPO's constant, as the k3 term's). Metric kl: the mean KL_n."""
    loss = kl.sum() * (float(beta) / float(normaliser))
    with torch.no_grad():
        metrics = {"kl": float(kl.mean())}
    return loss, metrics
