"""Resources of the daily loop: where the day's feeds come from, and the judge."""

from outcome_flywheel.daily_rl.feeds.source import DEFAULT_ARCHIVE, FeedSource
from outcome_flywheel.daily_rl.judge.llm_judge import Judge
from resources.settings import DataclassResource, env_int_or_default, env_or_default, mirrored


class FeedsResource(DataclassResource[FeedSource]):
    """The day's raw feeds, from the archive folder or from live URLs (kept for replay)."""

    plain = FeedSource
    variables = {"max_headlines": "FLYWHEEL_MAX_HEADLINES", "min_headlines": "FLYWHEEL_MIN_HEADLINES"}
    archive_dir: str = mirrored(FeedSource, "archive_dir")
    feed_urls: str = mirrored(FeedSource, "feed_urls")
    max_headlines: int = mirrored(FeedSource, "max_headlines")
    min_headlines: int = mirrored(FeedSource, "min_headlines")
    timeout_s: float = mirrored(FeedSource, "timeout_s")
    max_bytes: int = mirrored(FeedSource, "max_bytes")
    refetch: bool = mirrored(FeedSource, "refetch")
    data_dir: str = mirrored(FeedSource, "data_dir")

    @classmethod
    def from_env(cls, max_headlines: int | None = None) -> "FeedsResource":
        """From the environment; `max_headlines` overrides FLYWHEEL_MAX_HEADLINES (the demo's small days)."""
        return cls(
            archive_dir=env_or_default("FLYWHEEL_FEEDS_ARCHIVE", DEFAULT_ARCHIVE),
            feed_urls=env_or_default("FLYWHEEL_FEED_URLS", ""),
            max_headlines=max_headlines if max_headlines is not None else env_int_or_default("FLYWHEEL_MAX_HEADLINES"),
            min_headlines=env_int_or_default("FLYWHEEL_MIN_HEADLINES"),
            data_dir=env_or_default("FLYWHEEL_DATA_DIR"),
        )


class JudgeResource(DataclassResource[Judge]):
    """Which model judges the rollouts, and how (the frozen base model unless FLYWHEEL_JUDGE_MODEL is set)."""

    plain = Judge
    judge_model: str = mirrored(Judge, "judge_model")
    temperature: float = mirrored(Judge, "temperature")
    max_new_tokens: int = mirrored(Judge, "max_new_tokens")
    outcome_headlines_shown: int = mirrored(Judge, "outcome_headlines_shown")
    prompt_tokens: int = mirrored(Judge, "prompt_tokens")
    thinking: bool = mirrored(Judge, "thinking")
    thinking_max_new_tokens: int = mirrored(Judge, "thinking_max_new_tokens")

    @classmethod
    def from_env(cls) -> "JudgeResource":
        return cls(judge_model=env_or_default("FLYWHEEL_JUDGE_MODEL", ""))
