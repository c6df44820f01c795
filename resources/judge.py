"""The LLM judge of the daily loop: the frozen base model (or FLYWHEEL_JUDGE_MODEL), never the
policy being trained. It ranks each headline's notes by iterative best-of-remaining selection
(`assets.daily_rl.judging.rank_groups`): candidates labelled [A]..[H] in the prompt the base
model was trained on (`resources.models.prompts.judge_messages`), temperature 0.3, a greedy
retry asking for exactly one letter.
"""

from __future__ import annotations

from typing import Sequence

import dagster as dg
from pydantic import Field

from assets.daily_rl.judging import GroupJudgement, JudgeGroup, judge_groups, select_outcome_headlines, stable_seed
from resources.models import ModelBackend, ModelBackendResource
from resources.settings import env_or_default

__all__ = ["JudgeGroup", "JudgeResource", "judge_groups", "stable_seed"]


class JudgeResource(dg.ConfigurableResource):
    """Which model judges, and how."""

    judge_model: str = Field(default="", description="FLYWHEEL_JUDGE_MODEL: a hub id or folder; empty = the frozen base model.")
    temperature: float = Field(default=0.3, description="Sampling temperature of the judge's first answer.")
    max_new_tokens: int = Field(default=8, description="Tokens the judge may write per answer.")
    outcome_headlines_shown: int = Field(default=3, description="Next-day headlines shown per prompt (the most related first).")
    max_candidate_chars: int = Field(default=360, description="Each note is cut to this many characters in the prompt.")

    @classmethod
    def from_env(cls) -> "JudgeResource":
        return cls(judge_model=env_or_default("FLYWHEEL_JUDGE_MODEL", ""))

    def describe(self, model_backend: ModelBackendResource) -> str:
        return self.judge_model or f"frozen base ({model_backend.base_model})"

    def load(self, model_backend: ModelBackendResource) -> ModelBackend:
        """The judge model, without any policy adapter."""
        if not self.judge_model:
            return model_backend.load()
        other = ModelBackendResource(
            base_model=self.judge_model, backend=model_backend.backend, device=model_backend.device,
            seed=model_backend.seed, data_dir=model_backend.data_dir,
        )
        return other.load(model_path=other.base_model_dir(download=True))

    def rank(self, backend: ModelBackend, groups: Sequence[JudgeGroup]) -> list[GroupJudgement]:
        return judge_groups(backend, groups, self.temperature, self.max_new_tokens, self.max_candidate_chars)

    def outcome_context(self, prediction_headline: str, outcome_headlines: Sequence[str]) -> list[str]:
        return select_outcome_headlines(prediction_headline, outcome_headlines, self.outcome_headlines_shown)
