"""What every record does the same way: a trainer's per-step histories (`TrainStats`) as MLflow series, an
evaluation's figures as a run of their own."""

from __future__ import annotations

import math
import os
from typing import Any, Callable, Iterable, Mapping

NOT_PER_STEP = ("is_ratio_by_example",)  # per training example, not per optimiser step


def step_series(stats: Any) -> dict[str, list]:
    """Each per-step history of a `TrainStats`: loss, grad norm (before clipping), and every list of its
    `extra` one long per optimiser step (GSPO: clip_fraction, kl, ...; DPO: rewards_accuracy, margins, ...)."""
    if stats is None or not getattr(stats, "steps", 0):
        return {}
    out: dict[str, list] = {"loss": list(stats.losses), "grad_norm": list(stats.grad_norms)}
    for name, values in stats.extra.items():
        if name not in NOT_PER_STEP and isinstance(values, list) and len(values) == stats.steps:
            out[name] = values
    return out


def record_figures(
    tracker: Any,
    loop: str,
    run_name: str,
    tags: Mapping[str, Any],
    metrics: Mapping[str, Any],
    artifacts: Iterable[str | os.PathLike] = (),
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """An evaluation's or report's own run in the loop's experiment (the A/B, the back-test, the holdout AUC,
    the charts): its figures and files; returns the links for the asset's metadata. Never raises."""
    run = tracker.start(loop, run_name, tags, log)
    with run:
        run.metrics(metrics)
        run.artifacts(artifacts, "charts")
    return run.links()


def numbers(row: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The numeric entries of `row` (bools and text left out), keys prefixed `prefix/`."""
    head = f"{prefix}/" if prefix else ""
    out = {}
    for key, value in row.items():
        if isinstance(value, bool) or value is None:
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(number):
            out[f"{head}{key}"] = number
    return out
