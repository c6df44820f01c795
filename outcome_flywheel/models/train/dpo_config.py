"""The outcome-weighted DPO trainer's settings and pairs (TRL style: a Config dataclass beside the
trainer, each field's default and help written once). Plain Python: importing this imports neither
torch nor mlx.

DPO (Rafailov et al. 2023, "Direct Preference Optimization: Your Language Model is Secretly a
Reward Model"): for a prompt x with a chosen y_w and a rejected y_l,

    loss = -log sigmoid( beta * [ (log pi(y_w|x) - log ref(y_w|x)) - (log pi(y_l|x) - log ref(y_l|x)) ] )

with log pi(y|x) the SEQUENCE-summed token log-probabilities (with `completion_unit="line"`, also
summed over the completion's lines, each scored as its own response to x: segments.py). TRL's
DPOTrainer has no per-pair weights; the preference flywheel needs them (a pair the market confirmed
counts 1.0, one it contradicted 0.3 ...), so the loss is the weighted mean sum_i w_i l_i / sum_i w_i.
The reference is the base model with the LoRA adapter disabled. The trainer is
`dpo.train_weighted_dpo`; the loss is written once per framework (`torch/losses.py`, `mlx/losses.py`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from outcome_flywheel.models.interface import LoraSettings, Messages
from outcome_flywheel.models.segments import COMPLETION_UNITS


@dataclass
class WeightedDPOConfig:
    """Outcome-weighted DPO settings; the one source of truth for their defaults.

    TRL's DPO defaults (beta 0.1, lr 5e-5, 3 epochs) learned only the bundled operator, whose taste
    sits in sector names (an operator with a ticker rule: holdout AUC 0.59). Scoring plans line by
    line, a smaller beta and a longer, faster run learn every consistent synthetic operator
    (benchmarks/flywheel_auc.py; figures in docs/flywheel.md)."""

    beta: float = field(
        default=0.02,
        metadata={
            "help": "DPO temperature: how far the adapter may move from the base per unit of preference; also the scale of the style score sigma(beta * margin)."
        },
    )
    learning_rate: float = field(default=1e-3, metadata={"help": "AdamW learning rate of the LoRA weights."})
    batch_size: int = field(default=8, metadata={"help": "Pairs per optimiser step."})
    epochs: int = field(default=8, metadata={"help": "Passes over the training pairs."})
    lora: LoraSettings = field(
        default_factory=lambda: LoraSettings(r=8, alpha=16),
        metadata={"help": "LoRA rank, alpha, dropout and target modules."},
    )
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient norm clip."})
    completion_unit: str = field(
        default="line",
        metadata={
            "help": "`line`: a plan's log-prob is the sum over its lines, each a response to the prompt (segments.py); `sequence`: the whole completion, plain DPO."
        },
    )
    seed: int = field(default=0, metadata={"help": "Seeds the LoRA init and the batch order."})
    reference_batch_size: int = field(
        default=32,
        metadata={
            "help": "Pairs per no-grad pass of the reference log-probs, computed once before training (TRL's precompute_ref_batch_size); in data-parallel training each rank takes every N-th batch."
        },
    )

    def __post_init__(self) -> None:
        if self.completion_unit not in COMPLETION_UNITS:
            raise ValueError(f"completion_unit must be one of {COMPLETION_UNITS}, got {self.completion_unit!r}")
        if self.reference_batch_size < 1:
            raise ValueError(f"reference_batch_size must be >= 1, got {self.reference_batch_size}")

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
    """One preference of the training set, its outcome weight applied (swaps already made)."""

    prompt: Messages = field(metadata={"help": "The chat messages both completions answer."})
    chosen: str = field(metadata={"help": "The preferred completion."})
    rejected: str = field(metadata={"help": "The other completion."})
    weight: float = field(default=1.0, metadata={"help": "The pair's outcome weight (> 0)."})
