"""GSPO for the daily loop, in PyTorch (TRL style: a Config dataclass beside the trainer).

Group Sequence Policy Optimization (Zheng et al. 2025, "Group Sequence Policy Optimization"):
for response y_i of prompt x with group-normalised advantage A_i,

    s_i  = (pi_theta(y_i|x) / pi_old(y_i|x)) ** (1/|y_i|) = exp(mean_t(log pi_theta - log pi_old))
    loss = mean_i  -min(s_i * A_i, clip(s_i, 1 - eps_low, 1 + eps_high) * A_i)

over response tokens only. Every log-prob here is taken at the rollouts' sampling temperature T
(log-softmax of logits / T, before top-k / top-p), as TRL's GRPO and verl do, so that pi_theta and
pi_old are the distributions the samples were drawn from, not the temperature-1 model.

pi_old is the behaviour policy: the checkpoint that generated the rollouts (the caller checks
their `policy_version`), unchanged since. By default (`old_logprobs="recompute"`) it is evaluated
by one no-grad pass of the training forward before the first update, so s_i = 1 exactly at the
first step; the log-probs stored at generation (`GSPOExample.behavior_logprobs`, at the same T)
must agree with it and the largest per-sequence gap is reported (`behavior_logprob_gap_max`).
At s_i = 1 the gradient is exactly that of the group-normalised reward-weighted log-likelihood
`-A_i * mean_t log pi_theta` (objective "reward_weighted", the original loop's update).

`gspo_loss` is the plain function the MLX backend mirrors (parity within 1e-4); `train_gspo`
feeds padded minibatches through `TorchBackend.batch_logprobs` and `torch_training.train_loop`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import torch

from outcome_flywheel.models.interface import LoraSettings, Messages, TrainStats
from outcome_flywheel.models.sampling import gspo_minibatches
from outcome_flywheel.models.torch.backend import left_padded
from outcome_flywheel.models.torch.training import train_loop

if TYPE_CHECKING:
    from outcome_flywheel.models.torch.backend import TorchBackend

OBJECTIVES = ("gspo", "reward_weighted")


@dataclass
class GSPOConfig:
    objective: str = "gspo"  # "gspo" | "reward_weighted"
    # LoRA on tiny-local needs a large step to move in one epoch a day (benchmarks/daily_learning.py);
    # for a 0.6B+ model start near 1e-5 (full) / 1e-4 (LoRA).
    learning_rate: float = 2e-3
    epsilon_low: float = 3e-4  # paper values
    epsilon_high: float = 4e-4
    batch_size: int = 16  # sequences per padded minibatch (one Adam step each)
    epochs: int = 1
    max_grad_norm: float = 1.0
    lora: LoraSettings | None = field(default_factory=LoraSettings)  # None = full fine-tune
    seed: int = 0  # shuffles the minibatch order
    # The rollouts' sampling temperature: logits are divided by it in the pi_old and pi_theta passes.
    temperature: float = 1.0
    # The 8 rollouts of a headline share its prompt: run the prompt once per minibatch and expand its
    # KV cache (gradients flow through it), instead of recomputing it for every row.
    share_prompt_prefix: bool = True
    one_at_a_time: bool = False  # the original loop's way (one sequence per forward), for the benchmark
    # pi_old: "recompute" = one no-grad pass of the training forward over the behaviour policy (not
    # yet updated) before the first step, so the ratio starts at exactly 1 in any precision;
    # "stored" = the behaviour log-probs saved at generation (equal to it within 1e-4 in fp32, but
    # not bit for bit, and off by more than the 3e-4 clip band in bf16); "auto" = stored in fp32,
    # recomputed otherwise.
    old_logprobs: str = "recompute"

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {self.objective!r}")
        if self.old_logprobs not in ("auto", "stored", "recompute"):
            raise ValueError(f"old_logprobs must be auto | stored | recompute, got {self.old_logprobs!r}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 (the rollouts' sampling temperature), got {self.temperature}")


@dataclass
class GSPOExample:
    prompt: Messages
    response_ids: list[int]
    behavior_logprobs: list[float]  # per response token, under the policy that sampled it, at its sampling temperature
    advantage: float


def gspo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    epsilon_low: float = 3e-4,
    epsilon_high: float = 4e-4,
    objective: str = "gspo",
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO (or reward-weighted) loss of a padded batch.

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
    return loss, metrics


def _pad(rows: Sequence[Sequence[float]], width: int) -> torch.Tensor:
    out = torch.zeros((len(rows), width), dtype=torch.float32)
    for b, row in enumerate(rows):
        out[b, : len(row)] = torch.tensor(list(row), dtype=torch.float32)
    return out


def shared_prefix_logprobs(
    backend: "TorchBackend", prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]], temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same result as `backend.batch_logprobs` (`(logp, mask)`, `[B, T]`), computing each distinct
    prompt once: the prompts run left-padded with a KV cache, the cache rows are gathered per
    response (differentiable indexing), then the responses run on top of it."""
    with backend.autocast():
        logits, responses, mask = _shared_prefix_logits(backend, prompt_ids, response_ids)
    logits = logits / temperature
    logp = logits.gather(-1, responses[:, :, None])[:, :, 0] - torch.logsumexp(logits, dim=-1)
    return logp.masked_fill(~mask, 0.0), mask


def _shared_prefix_logits(backend: "TorchBackend", prompt_ids, response_ids) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fp32 logits predicting every response token `[B, T, V]`, the responses and their mask."""
    model, device, pad = backend.model, backend.device, backend.tokenizer.pad_token_id
    unique: dict[tuple[int, ...], int] = {}
    rows = [unique.setdefault(tuple(p), len(unique)) for p in prompt_ids]
    ids, attention, positions = left_padded(list(unique), pad, device)
    out = model(input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=True, logits_to_keep=1)
    index = torch.tensor(rows, device=device)
    first_logits = out.logits[:, -1, :].float().index_select(0, index)  # predicts each response's first token
    cache = out.past_key_values
    cache.batch_select_indices(index)

    length = max(len(r) for r in response_ids)
    responses = torch.full((len(rows), length), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.bool)
    for b, r in enumerate(response_ids):
        responses[b, : len(r)] = torch.tensor(list(r))
        mask[b, : len(r)] = True
    responses, mask = responses.to(device), mask.to(device)
    # right padding of the responses is invisible to real tokens (causal attention)
    full_attention = torch.cat([attention.index_select(0, index), torch.ones_like(responses)], dim=-1)
    response_positions = positions[:, -1:].index_select(0, index) + 1 + torch.arange(length, device=device)[None, :]
    if length == 1:
        return first_logits[:, None, :], responses, mask
    rest = model(input_ids=responses[:, :-1], attention_mask=full_attention[:, :-1],
                 position_ids=response_positions[:, :-1], past_key_values=cache, use_cache=True).logits.float()
    return torch.cat([first_logits[:, None, :], rest], dim=1), responses, mask


def train_gspo(backend: "TorchBackend", examples: Sequence[GSPOExample], config: GSPOConfig) -> TrainStats:
    """`config.epochs` passes over `examples` in shuffled padded minibatches, one Adam step each.

    Adds a fresh LoRA adapter when `config.lora` is set and the policy has none (the first
    trained day); with `lora=None` every weight trains.
    """
    batches = gspo_minibatches(examples, config, backend.prompt_ids)  # validates before any change
    if config.lora is not None and not backend.has_adapter:
        backend.add_lora(config.lora)
    elif config.lora is None and not backend.has_adapter:
        backend.use_master_weights()  # fp32 weights under bf16 compute: small steps are not rounded away
    params = backend.trainable_parameters()
    share = config.share_prompt_prefix and not config.one_at_a_time

    device = backend.device
    temperature = config.temperature
    if share:
        logprobs_fn = lambda p, r: shared_prefix_logprobs(backend, p, r, temperature)  # noqa: E731
    else:
        logprobs_fn = lambda p, r: backend.batch_logprobs(p, r, temperature)  # noqa: E731

    recompute = config.old_logprobs == "recompute" or (config.old_logprobs == "auto" and backend.dtype != torch.float32)
    old_by_batch: list[torch.Tensor] = []
    behavior_gaps: list[float] = []
    for batch in batches:
        stored = _pad([b.behavior_logprobs for b in batch], max(len(b.response_ids) for b in batch)).to(device)
        if recompute:
            with torch.no_grad():  # the policy has not moved yet: this is pi_old through the training forward
                old, mask = logprobs_fn([b.prompt_ids for b in batch], [b.response_ids for b in batch])
            old = old.detach().float()
            lengths = mask.sum(-1).clamp(min=1)
            behavior_gaps += (((stored - old) * mask).sum(-1) / lengths).abs().tolist()
            old_by_batch.append(old)
        else:
            old_by_batch.append(stored)

    def loss_fn(indexed_batch):
        index, batch = indexed_batch
        logp, mask = logprobs_fn([b.prompt_ids for b in batch], [b.response_ids for b in batch])
        adv = torch.tensor([b.advantage for b in batch], dtype=torch.float32, device=device)
        return gspo_loss(logp, old_by_batch[index], mask, adv, config.epsilon_low, config.epsilon_high, config.objective)

    backend.model.train()
    try:
        stats = (
            train_loop(params, loss_fn, list(enumerate(batches)), config.learning_rate, config.max_grad_norm)
            if batches else TrainStats()
        )
    finally:
        backend.model.eval()
    stats.extra["old_logprobs"] = "recomputed" if recompute else "stored"
    if behavior_gaps:
        # How far the sampler's stored log-probs sit from the training forward (per-sequence mean).
        stats.extra["behavior_logprob_gap_max"] = float(max(behavior_gaps))
    stats.extra.update(_sizes(batches, config.epochs))
    return stats


def _sizes(batches, epochs: int) -> dict[str, int]:
    """Examples and response tokens of one epoch (the plan repeats every example once an epoch)."""
    rows = [b for batch in batches for b in batch]
    per_epoch = max(1, int(epochs))
    return {"examples": len(rows) // per_epoch, "response_tokens": sum(len(b.response_ids) for b in rows) // per_epoch}
