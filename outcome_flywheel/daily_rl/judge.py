"""The LLM judge of the daily loop: the frozen base model (or FLYWHEEL_JUDGE_MODEL), never the
policy being trained. It ranks each headline's notes by iterative best-of-remaining selection
(`outcome_flywheel.daily_rl.judging.rank_groups`): candidates labelled [A]..[H] in the prompt the base
model was trained on (`outcome_flywheel.models.prompts.judge_messages`), temperature 0.3, a greedy
retry asking for exactly one letter.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Sequence

from outcome_flywheel.daily_rl.judging import GroupJudgement, JudgeGroup, judge_groups, select_outcome_headlines, stable_seed
from outcome_flywheel.models import ModelBackend, ModelLoader


@dataclass
class Judge:
    """Which model judges, and how."""

    judge_model: str = field(default="", metadata={"help": "FLYWHEEL_JUDGE_MODEL: a hub id or folder; empty = the frozen base model."})
    temperature: float = field(default=0.3, metadata={"help": "Sampling temperature of the judge's first answer."})
    max_new_tokens: int = field(default=8, metadata={"help": "Tokens the judge may write per answer."})
    outcome_headlines_shown: int = field(default=3, metadata={"help": "Next-day headlines shown per prompt (the most related first)."})
    max_candidate_chars: int = field(default=360, metadata={"help": "Each note is cut to this many characters in the prompt."})

    def describe(self, models: ModelLoader) -> str:
        return self.judge_model or f"frozen base ({models.base_model})"

    def load(self, models: ModelLoader) -> ModelBackend:
        """The judge model, without any policy adapter: the base model, or `judge_model` on the same
        backend and device."""
        if not self.judge_model:
            return models.load()
        other = replace(models, base_model=self.judge_model)
        return other.load(model_path=other.base_model_dir(download=True))

    def rank(self, backend: ModelBackend, groups: Sequence[JudgeGroup], shuffle: bool = True) -> list[GroupJudgement]:
        return judge_groups(backend, groups, self.temperature, self.max_new_tokens, self.max_candidate_chars, shuffle)

    def outcome_context(self, prediction_headline: str, outcome_headlines: Sequence[str]) -> list[str]:
        return select_outcome_headlines(prediction_headline, outcome_headlines, self.outcome_headlines_shown)
