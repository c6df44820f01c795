"""Shared set-up of the daily-loop benchmarks: a data dir with tiny-local, the real assets and resources."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from outcome_flywheel.settings import PROJECT_ROOT, env


def tiny_local_data_dir(data_dir: str | None = None) -> Path:
    """A data dir holding tiny-local (built once into .cache/, as the tests do) at models/tiny-local."""
    from outcome_flywheel.models.provision.tiny_local import cached_tiny_local

    cached = cached_tiny_local()
    root = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="flywheel-bench-")) / "data"
    (root / "models").mkdir(parents=True, exist_ok=True)
    link = root / "models" / "tiny-local"
    if not link.exists():
        os.symlink(cached, link)
    os.environ["FLYWHEEL_DATA_DIR"] = str(root)
    return root


def resources(root: Path, max_headlines: int) -> dict:
    from outcome_flywheel.daily_rl.feeds.source import FeedSource
    from outcome_flywheel.daily_rl.judge.llm_judge import Judge
    from outcome_flywheel.market_data import MarketData
    from outcome_flywheel.models.loader import ModelLoader
    from outcome_flywheel.storage import Warehouse
    from outcome_flywheel.tracking import Tracker
    from resources.steps import StepRunnerResource

    return dict(
        warehouse=Warehouse(data_dir=str(root)),
        model_backend=ModelLoader(data_dir=str(root), base_model="tiny-local", backend="torch", device="cpu"),
        feeds=FeedSource(max_headlines=max_headlines, data_dir=str(root)),
        judge=Judge(judge_model=env("FLYWHEEL_JUDGE_MODEL", "")),  # as the assets' resource reads it
        market_data=MarketData(data_dir=str(root)),
        step_runner=StepRunnerResource(runner="in_process"),  # learning figures, not process starts
        tracking=Tracker(data_dir=str(root), tracking_uri="off"),  # tracking's cost: benchmarks/tracking_cost.py
    )


def archive_days(n: int, start: str | None = None) -> list[str]:
    days = sorted(p.name for p in (PROJECT_ROOT / "sample_data" / "feeds_archive").iterdir() if p.is_dir())
    if start:
        days = [d for d in days if d >= start]
    return days[:n]
