"""The daily loop's partition keys and what is derived from them: the day before, a seed that
every process derives alike, and the error of a day that cannot be updated as asked."""

from __future__ import annotations

import hashlib
from datetime import date, timedelta


def previous_day(day: str) -> str:
    return (date.fromisoformat(day) - timedelta(days=1)).isoformat()


class DailyUpdateError(ValueError):
    """The day cannot be updated as asked (bad override date, missing headlines, unverified parent...)."""


def stable_seed(*parts) -> int:
    """A seed from any values, the same in every process (Python's hash() is salted)."""
    return int(hashlib.sha256("|".join(str(p) for p in parts).encode()).hexdigest()[:15], 16)
