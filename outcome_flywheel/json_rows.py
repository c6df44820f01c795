"""DataFrame rows as JSON-ready dicts (numpy scalars to Python, NaN / NA to None): what the status
readers of every area and the service hand out. Shared by the areas, so it lives below them."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd


def plain(value: Any) -> Any:
    """JSON-ready: numpy scalars to Python, NaN / NA to None."""
    if hasattr(value, "item"):
        value = value.item()
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return None
    return value


def records(frame: pd.DataFrame, columns: list[str]) -> list[dict[str, Any]]:
    """The rows of `frame` as dicts of the `columns` it has, in that order."""
    present = [c for c in columns if c in frame.columns]
    return [{c: plain(v) for c, v in zip(present, row)} for row in frame[present].itertuples(index=False)]
