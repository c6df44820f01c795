"""Metadata values as Dagster Pipes sends them: typed where the UI renders them (markdown, a path),
plain JSON numbers and strings otherwise; NaN and None left out, numpy scalars made plain. Also the
declaration of a check a step reports (`DeclaredCheck`), from which its asset declares the check spec."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd


@dataclass(frozen=True)
class DeclaredCheck:
    """An asset check a step reports, declared once beside the code that computes it: the asset
    declares its `AssetCheckSpec` from it and the step reports its result under it."""

    name: str
    asset: str  # the asset key it checks, as a plain string
    description: str
    blocking: bool = True  # a failed blocking check stops the downstream assets; else a warning


def md(text: str) -> dict:
    return {"raw_value": text, "type": "md"}


def path(value: str) -> dict:
    return {"raw_value": str(value), "type": "path"}


def num(value, digits: int = 4) -> float | None:
    """A rounded float (Dagster plots it); None for NaN (not trained / nothing scored)."""
    value = float(value)
    return round(value, digits) if value == value else None


def plain(value: Any) -> Any:
    """A JSON value: numpy scalars as Python ones; dicts and lists walked."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        return value.item()
    return value


def present(metadata: dict) -> dict:
    """`metadata` without its None entries, every value plain."""
    return {k: plain(v) for k, v in metadata.items() if v is not None}


def mapping_table(values: dict, key: str, value: str) -> str:
    rows = "".join(f"| {k} | {v:.3f} |\n" for k, v in values.items())
    return f"| {key} | {value} |\n| --- | --- |\n{rows}" if rows else "none"


def counts_table(counts: pd.Series, key: str, value: str) -> str:
    rows = "".join(f"| {k} | {int(v)} |\n" for k, v in counts.items())
    return f"| {key} | {value} |\n| --- | --- |\n{rows}" if rows else "none"
