"""The GSPO trainer's settings and examples (TRL style: a Config dataclass beside the trainer, each
field's default and help written once). Plain Python: importing this imports neither torch nor mlx.

Group Sequence Policy Optimization (Zheng et al. 2025, "Group Sequence Policy Optimization"): for
response y_i of prompt x with group-normalised advantage A_i,

    s_i  = (pi_theta(y_i|x) / pi_old(y_i|x)) ** (1/|y_i|) = exp(mean_t(log pi_theta - log pi_old))
    loss = mean_i  -min(s_i * A_i, clip(s_i, 1 - eps_low, 1 + eps_high) * A_i)

over response tokens only, every log-prob at the rollouts' sampling temperature (logits / T, before
top-k / top-p, as TRL's GRPO and verl). The trainer is `gspo.train_gspo`; the loss is written once
per framework (`torch/losses.py`, `mlx/losses.py`).

Off-policy by days (notes trained when their price matures, sampled by an older checkpoint): pi_old
is the policy the update starts from (recomputed), and each sequence's loss is weighted by the
truncated behaviour importance ratio (TIS), min(exp(mean_t(log pi_old - log pi_behaviour)), tis_cap).
For notes the parent itself sampled that weight is 1 (within float error).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from outcome_flywheel.models.interface import LoraSettings, Messages

OBJECTIVES = ("gspo", "reward_weighted")
OLD_LOGPROBS = ("auto", "stored", "recompute")


@dataclass
class GSPOConfig:
    """GSPO settings; the one source of truth for their defaults."""

    objective: str = field(default="gspo", metadata={"help": "`gspo`: the clipped sequence-ratio objective; `reward_weighted`: -A_i * mean_t log pi_theta (the original loop's update, GSPO's gradient at ratio 1)."})
    learning_rate: float = field(default=2e-3, metadata={"help": "AdamW learning rate. LoRA on tiny-local needs a large step to move in one epoch a day (benchmarks/daily_learning.py); for a 0.6B+ model start near 1e-5 (full) / 1e-4 (LoRA)."})
    epsilon_low: float = field(default=3e-4, metadata={"help": "Lower clip band of the sequence ratio, 1 - eps_low (the paper's value)."})
    epsilon_high: float = field(default=4e-4, metadata={"help": "Upper clip band of the sequence ratio, 1 + eps_high (the paper's value)."})
    batch_size: int = field(default=16, metadata={"help": "Sequences per padded minibatch (one AdamW step each)."})
    epochs: int = field(default=1, metadata={"help": "Passes over the examples."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient norm clip."})
    lora: LoraSettings | None = field(default_factory=LoraSettings, metadata={"help": "LoRA rank, alpha, dropout and target modules of a fresh adapter; None = full fine-tune."})
    seed: int = field(default=0, metadata={"help": "Shuffles the minibatch order (the LoRA init draws from the framework's generator, seeded by the caller)."})
    temperature: float = field(default=1.0, metadata={"help": "The rollouts' sampling temperature: logits are divided by it in the pi_old and pi_theta passes."})
    share_prompt_prefix: bool = field(default=True, metadata={"help": "A headline's rollouts share its prompt: keep a prompt group in one minibatch and (torch) run the prompt once, expanding its KV cache (gradients flow through it)."})
    one_at_a_time: bool = field(default=False, metadata={"help": "The original loop's way, one sequence per forward and step (for the benchmark)."})
    tis_cap: float | None = field(default=2.0, metadata={"help": "Truncation cap C of the behaviour IS weight min(pi_old / pi_behaviour, C) per sequence (GSPO's length-normalised ratio; TRL's and verl's default cap 2.0); None = no correction. Needs recomputed pi_old."})
    old_logprobs: str = field(default="recompute", metadata={"help": "pi_old: `recompute` = one no-grad pass of the training forward over the behaviour policy before the first step (ratio exactly 1 in any precision); `stored` = the behaviour log-probs saved at generation (within 1e-4 in fp32, off by more than the clip band in bf16); `auto` = stored in fp32, recomputed otherwise."})

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {self.objective!r}")
        if self.old_logprobs not in OLD_LOGPROBS:
            raise ValueError(f"old_logprobs must be auto | stored | recompute, got {self.old_logprobs!r}")
        if self.tis_cap is not None and not (self.tis_cap >= 1.0 and self.tis_cap < float("inf")):
            raise ValueError(f"tis_cap must be a finite number >= 1 (or None), got {self.tis_cap}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 (the rollouts' sampling temperature), got {self.temperature}")


@dataclass
class GSPOExample:
    """One rollout to train on."""

    prompt: Messages = field(metadata={"help": "The chat messages the response answers."})
    response_ids: list[int] = field(metadata={"help": "The sampled response's token ids."})
    behavior_logprobs: list[float] = field(metadata={"help": "Per response token, under the policy that sampled it, at its sampling temperature."})
    advantage: float = field(metadata={"help": "Group-normalised reward within the headline's rollouts."})
