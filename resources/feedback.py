"""Resources of the feedback area: where the note-feedback log lives."""

from outcome_flywheel.feedback.log import FeedbackLog
from resources.settings import DataclassResource, env_or_default, mirrored


class FeedbackLogResource(DataclassResource[FeedbackLog]):
    """The JSONL log of people's feedback on the daily notes and the curators' verdicts (FLYWHEEL_FEEDBACK_LOG)."""

    plain = FeedbackLog
    path: str = mirrored(FeedbackLog, "path")
    data_dir: str = mirrored(FeedbackLog, "data_dir")

    @classmethod
    def from_env(cls) -> "FeedbackLogResource":
        return cls(path=env_or_default("FLYWHEEL_FEEDBACK_LOG", ""), data_dir=env_or_default("FLYWHEEL_DATA_DIR"))
