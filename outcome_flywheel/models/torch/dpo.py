"""Outcome-weighted DPO with LoRA, in PyTorch.

DPO (Rafailov et al. 2023, "Direct Preference Optimization: Your Language Model is Secretly a
Reward Model"): for a prompt x with a chosen y_w and a rejected y_l,

    loss = -log sigmoid( beta * [ (log pi(y_w|x) - log ref(y_w|x)) - (log pi(y_l|x) - log ref(y_l|x)) ] )

with log pi(y|x) the SEQUENCE-summed token log-probabilities (with `completion_unit="line"`, also
summed over the completion's lines, each scored as its own response to x: segments.py). TRL's
DPOTrainer computes this over the whole completion but has no per-pair weights; the preference flywheel needs them (a pair the market
confirmed counts 1.0, one it contradicted 0.3 ...), so the batch loss here is the weighted mean
sum_i w_i * loss_i / sum_i w_i. The reference is the base model with the LoRA adapter disabled,
evaluated once before training (it never changes). The MLX backend mirrors `weighted_dpo_loss`
(parity within 1e-4).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Iterator, Sequence

import torch
import torch.nn.functional as F

from outcome_flywheel.models.interface import LoraSettings, Messages, TrainStats
from outcome_flywheel.models.segments import COMPLETION_UNITS, encode_segments, flatten_segments


@dataclass
class WeightedDPOConfig:
    """Outcome-weighted DPO settings; the one source of truth for their defaults.

    TRL's DPO defaults (beta 0.1, lr 5e-5, 3 epochs) learned only the bundled operator, whose taste
    sits in sector names (an operator with a ticker rule: holdout AUC 0.59). Scoring plans line by
    line, a smaller beta and a longer, faster run learn every consistent synthetic operator
    (benchmarks/flywheel_auc.py; figures in docs/flywheel.md)."""

    beta: float = field(default=0.02, metadata={"help": "DPO temperature: how far the adapter may move from the base per unit of preference; also the scale of the style score sigma(beta * margin)."})
    learning_rate: float = field(default=1e-3, metadata={"help": "AdamW learning rate of the LoRA weights."})
    batch_size: int = field(default=8, metadata={"help": "Pairs per optimiser step."})
    epochs: int = field(default=8, metadata={"help": "Passes over the training pairs."})
    lora: LoraSettings = field(default_factory=lambda: LoraSettings(r=8, alpha=16), metadata={"help": "LoRA rank, alpha, dropout and target modules."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient norm clip."})
    completion_unit: str = field(default="line", metadata={"help": "`line`: a plan's log-prob is the sum over its lines, each a response to the prompt (segments.py); `sequence`: the whole completion, plain DPO."})
    seed: int = field(default=0, metadata={"help": "Seeds the LoRA init and the batch order."})

    def __post_init__(self) -> None:
        if self.completion_unit not in COMPLETION_UNITS:
            raise ValueError(f"completion_unit must be one of {COMPLETION_UNITS}, got {self.completion_unit!r}")

    @classmethod
    def with_overrides(cls, **overrides) -> "WeightedDPOConfig":
        """The defaults with every override that is not None."""
        return cls(**{k: v for k, v in overrides.items() if v is not None})

    def as_dict(self) -> dict:
        d = asdict(self)
        d["lora"]["target_modules"] = list(d["lora"]["target_modules"])
        return d


@dataclass
class PreferencePair:
    prompt: Messages
    chosen: str
    rejected: str
    weight: float = 1.0


def weighted_dpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    weights: torch.Tensor,
    beta: float,
    mean_weight: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Weighted DPO over sequence-summed log-probs, all tensors [B]. Returns (loss, metrics).

    loss = sum_B w_i l_i / (B * mean_weight), with `mean_weight` the mean over the whole training
    set, so a minibatch estimates the dataset objective sum_i w_i l_i / sum_i w_i and a batch of
    0.3-weight pairs counts 0.3x a batch of 1.0-weight pairs. Without it: the batch's own sum.
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


def _sequence_logps(backend, prompt_ids: list[list[int]], segment_ids: list[list[list[int]]]) -> torch.Tensor:
    """[B] log pi(completion | prompt): summed over tokens, and over segments (segments.py)."""
    prompts, responses, owner = flatten_segments(prompt_ids, segment_ids)
    logp, mask = backend.batch_logprobs(prompts, responses)
    per_row = (logp * mask).sum(-1)
    index = torch.tensor(owner, device=per_row.device)
    return per_row.new_zeros(len(prompt_ids)).index_add(0, index, per_row)


def _batches(n: int, batch_size: int, epochs: int, seed: int) -> Iterator[list[int]]:
    rng = random.Random(seed)
    for _ in range(epochs):
        order = list(range(n))
        rng.shuffle(order)
        for start in range(0, n, batch_size):
            yield order[start : start + batch_size]


def train_weighted_dpo(backend, pairs: Sequence[PreferencePair], config: WeightedDPOConfig) -> TrainStats:
    """LoRA weighted DPO on `backend` (a TorchBackend); adds a fresh adapter if it has none."""
    if not pairs:
        raise ValueError("no preference pairs to train on")
    if any(p.weight <= 0 for p in pairs):
        raise ValueError("pair weights must be positive (swap chosen/rejected for a negative outcome weight)")
    torch.manual_seed(config.seed)
    backend.add_lora(config.lora)
    prompt_ids = [backend.prompt_ids(p.prompt) for p in pairs]
    chosen_ids = [encode_segments(backend.encode_response, p.chosen, config.completion_unit) for p in pairs]
    rejected_ids = [encode_segments(backend.encode_response, p.rejected, config.completion_unit) for p in pairs]
    weights = torch.tensor([float(p.weight) for p in pairs], dtype=torch.float32)
    mean_weight = float(weights.mean())

    # Reference log-probs: the base with the adapter off, once, before any update.
    ref_chosen = torch.empty(len(pairs))
    ref_rejected = torch.empty(len(pairs))
    backend.model.eval()
    with torch.no_grad(), backend.adapter_disabled():
        for start in range(0, len(pairs), 32):
            sl = slice(start, start + 32)
            ref_chosen[sl] = _sequence_logps(backend, prompt_ids[sl], chosen_ids[sl]).float().cpu()
            ref_rejected[sl] = _sequence_logps(backend, prompt_ids[sl], rejected_ids[sl]).float().cpu()

    device = backend.device

    def loss_fn(idx: list[int]):
        p = [prompt_ids[i] for i in idx]
        # Chosen and rejected in one forward pass.
        logps = _sequence_logps(backend, p + p, [chosen_ids[i] for i in idx] + [rejected_ids[i] for i in idx]).float()
        n = len(idx)
        return weighted_dpo_loss(
            logps[:n], logps[n:], ref_chosen[idx].to(device), ref_rejected[idx].to(device),
            weights[idx].to(device), config.beta, mean_weight,
        )

    backend.model.train()  # LoRA dropout (0 by default) would apply here
    try:
        stats = torch_train_loop(backend, loss_fn, _batches(len(pairs), config.batch_size, config.epochs, config.seed), config)
    finally:
        backend.model.eval()
    stats.extra["config"] = config.as_dict()
    stats.extra["n_pairs"] = len(pairs)
    return stats


def torch_train_loop(backend, loss_fn, batches, config: WeightedDPOConfig) -> TrainStats:
    from outcome_flywheel.models.torch.training import train_loop

    return train_loop(backend.trainable_parameters(), loss_fn, batches, config.learning_rate, max_grad_norm=config.max_grad_norm)
