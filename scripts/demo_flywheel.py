"""Demo of the preference flywheel on the embedded defaults (bundled audit log and prices, tiny-local).

    python -m scripts.demo_flywheel        (DAGSTER_HOME decides the instance; else an ephemeral one)

`run(instance)` materialises, recording the runs in `instance`:
  1. `operator_decisions` + `decision_outcomes` for every date of the audit log, in ONE run (the
     assets have a single-run backfill policy, so a partition range is one run);
  2. `dpo_dataset` -> `preference_adapter` -> `holdout_eval` -> `style_drift`.
It assumes `base_model` is already materialised (tiny-local built under FLYWHEEL_DATA_DIR).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable

import dagster as dg

from assets.preferences.adapter import preference_adapter
from outcome_flywheel.preferences.audit_log import records_frame
from assets.preferences.dataset import dpo_dataset
from assets.preferences.decisions import operator_decisions
from assets.preferences.evaluation import holdout_eval, style_drift
from assets.preferences.outcomes import decision_outcomes
from outcome_flywheel.preferences.status import training_status
from pipelines.preferences import flywheel_resources
from scripts import QUIET_CONSOLE
from assets.partitions import daily_partitions
from pipelines.resources import core_resources
from outcome_flywheel.settings import env

RANGE_START = "dagster/asset_partition_range_start"
RANGE_END = "dagster/asset_partition_range_end"


def decision_range(resources: dict) -> tuple[str, str]:
    """First and last decision date of the audit log that fall inside the daily partitions."""
    frame = records_frame(resources["audit_log"].parse(), env("FLYWHEEL_TIMEZONE"))
    keys = set(daily_partitions.get_partition_keys())
    dates = sorted(d for d in frame["decision_date"].unique() if d in keys)
    if not dates:
        raise ValueError("the audit log has no decision inside the daily partitions (FLYWHEEL_START_DATE)")
    return dates[0], dates[-1]


def run(instance: dg.DagsterInstance, log: Callable[[str], None] = print) -> dict[str, Any]:
    # Resolved values (a resource built from the environment may hold EnvVars until a run starts).
    resources = {k: r.process_config_and_initialize() for k, r in {**core_resources(), **flywheel_resources()}.items()}
    started = time.perf_counter()
    first, last = decision_range(resources)
    log(f"flywheel: decisions and outcomes {first}..{last} (one run)")
    r1 = dg.materialize(
        [operator_decisions, decision_outcomes], instance=instance, resources=resources,
        tags={RANGE_START: first, RANGE_END: last}, run_config=QUIET_CONSOLE,
    )
    if not r1.success:
        raise RuntimeError("operator_decisions / decision_outcomes failed")
    log("flywheel: dpo_dataset -> preference_adapter -> holdout_eval -> style_drift")
    r2 = dg.materialize([dpo_dataset, preference_adapter, holdout_eval, style_drift], instance=instance, resources=resources, run_config=QUIET_CONSOLE)
    if not r2.success:
        raise RuntimeError("flywheel training run failed")

    warehouse = resources["warehouse"]
    outcomes = warehouse.read_all("decision_outcomes")
    status = training_status(warehouse)
    ev = status["last_eval"] or {}
    summary = {
        "n_decisions": status["n_preferences"],
        "n_quarantined_lines": status["n_quarantined_lines"],
        "outcomes": {k: int(v) for k, v in outcomes["status"].value_counts().items()},
        "n_pairs": status["n_dpo_pairs"],
        "n_train": status["n_train"],
        "n_holdout": status["n_holdout"],
        "holdout_auc": ev.get("auc"),
        "auc_ci95": [ev.get("auc_low"), ev.get("auc_high")],
        "label": ev.get("label"),
        "drift": status["drift"]["drift"],
        "adapter": status["latest_adapter"],
        "run_ids": [r1.dagster_run.run_id, r2.dagster_run.run_id],
        "wall_s": round(time.perf_counter() - started, 1),
    }
    log(json.dumps(summary, default=str))
    return summary


if __name__ == "__main__":
    with (dg.DagsterInstance.get() if os.environ.get("DAGSTER_HOME") else dg.DagsterInstance.ephemeral()) as inst:
        run(inst)
