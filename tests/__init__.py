"""The project's tests, in folders that mirror the code (tests/daily_rl/reward/ tests outcome_flywheel/daily_rl/reward/)."""

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
