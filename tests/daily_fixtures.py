"""Helpers of the daily loop's end-to-end tests: a data dir with tiny-local linked in, and the resources."""

from __future__ import annotations

import os
from pathlib import Path

from outcome_flywheel.daily_rl.feeds.source import DEFAULT_ARCHIVE, FeedSource
from outcome_flywheel.daily_rl.judge.llm_judge import Judge
from outcome_flywheel.market_data import BUNDLED_PRICES, MarketData
from outcome_flywheel.models.loader import ModelLoader
from outcome_flywheel.storage import Warehouse
from outcome_flywheel.tracking import Tracker
from resources.steps import StepRunnerResource


def linked_data_dir(parent: Path, tiny_model_dir: Path) -> Path:
    """`parent/data` holding only tiny-local, where the `base_model` asset would put it."""
    root = parent / "data"
    (root / "models").mkdir(parents=True)
    os.symlink(tiny_model_dir, root / "models" / "tiny-local")
    return root


def daily_resources(
    root: Path,
    max_headlines: int = 3,
    prices_file: str = str(BUNDLED_PRICES),
    dtype: str = "auto",
    archive_dir: str = DEFAULT_ARCHIVE,
    tracking_uri: str = "off",
) -> dict:
    """The daily_rl group's resources on `root`, as plain objects (torch on CPU, the bundled archive and prices).
    MLflow records nothing unless `tracking_uri` says where ("" = the embedded store under `root`)."""
    return dict(
        warehouse=Warehouse(data_dir=str(root)),
        model_backend=ModelLoader(
            data_dir=str(root), base_model="tiny-local", backend="torch", device="cpu", dtype=dtype
        ),
        feeds=FeedSource(archive_dir=archive_dir, max_headlines=max_headlines, data_dir=str(root)),
        judge=Judge(),
        market_data=MarketData(data_dir=str(root), prices_file=prices_file),
        # the step's code over Pipes in the test's process: fast; tests/pipelines/test_pipes_steps.py runs the subprocess
        step_runner=StepRunnerResource(runner="in_process"),
        tracking=Tracker(data_dir=str(root), tracking_uri=tracking_uri),
    )
