"""The supervised fine-tuning (SFT) trainer's settings and examples (TRL style: a Config dataclass
beside the trainer). Plain Python: importing this imports neither torch nor mlx.

Completion-only SFT with LoRA: for a prompt x (chat-rendered, plus an optional `prefix` the
assistant turn starts with, e.g. a teacher's reasoning block) and a completion y,

    loss = - sum_{examples} sum_{t in y} log pi(y_t | x, prefix, y_<t) / (number of completion tokens)

Prompt and prefix tokens are context only (masked: no loss), as TRL's `completion_only_loss`. The
trainer is `sft.train_sft`; the loss is written once per framework (`torch/losses.py`, `mlx/losses.py`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from outcome_flywheel.models.interface import LoraSettings, Messages


@dataclass
class SFTConfig:
    """Completion-only LoRA SFT settings; the one source of truth for their defaults."""

    learning_rate: float = field(default=5e-4, metadata={"help": "AdamW learning rate of the LoRA weights."})
    batch_size: int = field(default=8, metadata={"help": "Examples per optimiser step."})
    epochs: int = field(default=2, metadata={"help": "Passes over a phase's examples."})
    lora: LoraSettings = field(
        default_factory=lambda: LoraSettings(r=8, alpha=16),
        metadata={
            "help": "LoRA rank, alpha, dropout and target modules (kept when the policy already has an adapter)."
        },
    )
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient norm clip."})
    max_completion_tokens: int = field(default=512, metadata={"help": "Completions are cut to this many tokens."})
    seed: int = field(default=0, metadata={"help": "Seeds the LoRA init and the batch order."})

    def __post_init__(self) -> None:
        if not self.learning_rate > 0 or self.batch_size < 1 or self.epochs < 1 or self.max_completion_tokens < 1:
            raise ValueError("learning_rate must be > 0; batch_size, epochs and max_completion_tokens at least 1")

    def as_dict(self) -> dict:
        d = asdict(self)
        d["lora"]["target_modules"] = list(d["lora"]["target_modules"])
        return d


@dataclass
class SFTExample:
    """One supervised example: what the model reads (prompt, then `prefix` inside its own turn) and
    what it learns to write (`completion`; `end_turn`: followed by the end-of-turn token)."""

    prompt: Messages = field(metadata={"help": "The chat messages."})
    completion: str = field(metadata={"help": "The target text (the only tokens with a loss)."})
    prefix: str = field(
        default="", metadata={"help": "Text the assistant turn starts with, read but not learned (masked)."}
    )
    end_turn: bool = field(default=True, metadata={"help": "Append the end-of-turn token to the completion (learned)."})
