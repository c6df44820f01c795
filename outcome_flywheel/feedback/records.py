"""What people say about the daily loop's notes, as validated records (pydantic, the same models the
service's endpoints take): feedback on one note (thumbs, stars, a correction) and a curator's
verdict on a correction. Both are lines of one append-only JSONL log (`log.py`)."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_CORRECTION_CHARS = 8_000  # a note is at most 512 tokens (~2.5k characters); leaves room, refuses megabytes
NAME_PATTERN = r"^[A-Za-z0-9 ._@-]{1,64}$"


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


class FeedbackIn(BaseModel):
    """Feedback on one daily note: `(date, headline_id, rollout_index)` names it."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    date: dt.date = Field(description="The rollouts' partition day (YYYY-MM-DD).")
    headline_id: str = Field(
        min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$", description="rollouts.headline_id"
    )
    rollout_index: int = Field(ge=0, le=7, description="Which of the headline's notes (0-7).")
    thumbs: Literal["up", "down"] | None = Field(default=None, description="up / down.")
    stars: int | None = Field(default=None, ge=1, le=5, description="1-5.")
    correction: str | None = Field(
        default=None, max_length=MAX_CORRECTION_CHARS, description="What the note should have said."
    )
    reviewer: str = Field(pattern=NAME_PATTERN, description="Who gave it.")

    @field_validator("correction")
    @classmethod
    def _blank_is_none(cls, value: str | None) -> str | None:
        return value or None

    @model_validator(mode="after")
    def _says_something(self) -> "FeedbackIn":
        if self.thumbs is None and self.stars is None and self.correction is None:
            raise ValueError("feedback needs thumbs, stars or a correction")
        return self


class FeedbackRecord(FeedbackIn):
    """A feedback line of the log: the request plus its id and time."""

    kind: Literal["feedback"] = "feedback"
    feedback_id: str = Field(default_factory=lambda: uuid.uuid4().hex, pattern=r"^[0-9a-f]{32}$")
    created_at: str = Field(default_factory=_now)


class VerificationIn(BaseModel):
    """A curator's verdict on a feedback's correction."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    action: Literal["approve", "edit", "reject"]
    correction: str | None = Field(
        default=None, max_length=MAX_CORRECTION_CHARS, description="The edited correction (edit only)."
    )
    curator: str = Field(pattern=NAME_PATTERN)

    @model_validator(mode="after")
    def _edit_has_text(self) -> "VerificationIn":
        if self.action == "edit" and not self.correction:
            raise ValueError("an edit needs the corrected text")
        if self.action != "edit" and self.correction:
            raise ValueError("only an edit carries a correction")
        return self


class VerificationRecord(VerificationIn):
    kind: Literal["verification"] = "verification"
    feedback_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    created_at: str = Field(default_factory=_now)


def human_signal(thumbs: str | None, stars: int | None) -> float | None:
    """A note's human score in [0, 1]: thumbs up 1 / down 0, stars (s - 1) / 4, their mean when
    both are given; None without either."""
    values = []
    if thumbs is not None:
        values.append(1.0 if thumbs == "up" else 0.0)
    if stars is not None:
        values.append((int(stars) - 1) / 4.0)
    return sum(values) / len(values) if values else None
