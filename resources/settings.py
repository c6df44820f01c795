"""Environment variables the project reads, with their embedded defaults.

Resources take their fields from here through `env_or_default`, so a variable that is set
shows in the Dagster UI as an `EnvVar` and one that is not falls back to the default.
"""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg

PROJECT_ROOT = Path(__file__).resolve().parent.parent
SAMPLE_DATA = PROJECT_ROOT / "sample_data"

# name -> (default, what it means); the README's configuration table lists the same.
DEFAULTS: dict[str, str] = {
    "FLYWHEEL_DATA_DIR": "./data",
    "FLYWHEEL_BASE_MODEL": "tiny-local",
    "FLYWHEEL_BACKEND": "torch",
    "FLYWHEEL_DEVICE": "auto",
    "FLYWHEEL_SEED": "0",
    "FLYWHEEL_START_DATE": "2025-01-01",
    "FLYWHEEL_TIMEZONE": "America/New_York",
}


def env(name: str, default: str | None = None) -> str:
    """The variable's value, else `default`, else the project default."""
    value = os.environ.get(name)
    if value not in (None, ""):
        return value
    if default is not None:
        return default
    return DEFAULTS[name]


def env_or_default(name: str, default: str | None = None):
    """`dg.EnvVar(name)` when the variable is set (shown as such in the UI), else the default."""
    if os.environ.get(name) not in (None, ""):
        return dg.EnvVar(name)
    return default if default is not None else DEFAULTS[name]


def resolve_path(path: str | os.PathLike) -> Path:
    """Relative paths are taken from the project root, so the demo, tests and the UI agree."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else (PROJECT_ROOT / p)


def env_int_or_default(name: str, default: int | None = None):
    """Integer form of `env_or_default` (`dg.EnvVar.int` when set)."""
    if os.environ.get(name) not in (None, ""):
        return dg.EnvVar.int(name)
    return default if default is not None else int(DEFAULTS[name])
