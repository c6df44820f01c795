"""The LLM judge of the daily loop: the frozen base model (or FLYWHEEL_JUDGE_MODEL), never the
policy being trained. It ranks each headline's notes by iterative best-of-remaining selection
(`outcome_flywheel.daily_rl.judge.ranking.rank_groups`): candidates labelled [A]..[H] in the prompt the base
model was trained on (`outcome_flywheel.models.prompts.judge_messages`), temperature 0.3, a greedy
retry asking for exactly one letter.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Sequence

from outcome_flywheel.daily_rl.judge.ranking import GroupJudgement, JudgeGroup, judge_groups, select_outcome_headlines
from outcome_flywheel.models.interface import ModelBackend
from outcome_flywheel.models.loader import ModelLoader


@dataclass
class Judge:
    """Which model judges, and how."""

    judge_model: str = field(
        default="", metadata={"help": "FLYWHEEL_JUDGE_MODEL: a hub id or folder; empty = the frozen base model."}
    )
    temperature: float = field(default=0.3, metadata={"help": "Sampling temperature of the judge's first answer."})
    max_new_tokens: int = field(default=8, metadata={"help": "Tokens the judge may write per answer."})
    outcome_headlines_shown: int = field(
        default=3, metadata={"help": "Next-day headlines shown per prompt (the most related first)."}
    )
    prompt_tokens: int = field(
        default=4096,
        metadata={
            "help": "Token budget of one judge prompt (template, headlines, labels and notes; never past the model's context less the answer): notes are cut to fit, max-min fairly, and the cut is recorded."
        },
    )
    thinking: bool = field(
        default=False,
        metadata={
            "help": "Let a reasoning judge (Qwen3) think before its letter (`enable_thinking`); the letter is read after </think>."
        },
    )
    thinking_max_new_tokens: int = field(
        default=1024, metadata={"help": "Tokens the judge may write per answer when thinking."}
    )

    def describe(self, models: ModelLoader) -> str:
        return self.judge_model or f"frozen base ({models.base_model})"

    def load(self, models: ModelLoader) -> ModelBackend:
        """The judge model, without any policy adapter: the base model, or `judge_model` on the same
        backend and device."""
        if self.judge_model:
            return replace(models, base_model=self.judge_model).load(download=True)
        return models.load()

    def rank(self, backend: ModelBackend, groups: Sequence[JudgeGroup], shuffle: bool = True) -> list[GroupJudgement]:
        max_new_tokens = self.thinking_max_new_tokens if self.thinking else self.max_new_tokens
        return judge_groups(
            backend, groups, self.temperature, max_new_tokens, self.prompt_tokens, shuffle, self.thinking
        )

    def outcome_context(self, prediction_headline: str, outcome_headlines: Sequence[str]) -> list[str]:
        return select_outcome_headlines(prediction_headline, outcome_headlines, self.outcome_headlines_shown)
