"""Demo of the preference flywheel on the embedded defaults (bundled audit log and prices, tiny-local).

    python -m scripts.demo_flywheel        (DAGSTER_HOME decides the instance; else an ephemeral one)

`run(instance)` runs two jobs of the code location, recorded in `instance`:
  1. `flywheel_decisions` (`operator_decisions` + `decision_outcomes`) for every date of the audit
     log, in ONE run (the assets have a single-run backfill policy, so a partition range is one run);
  2. `flywheel_training` (`dpo_dataset` -> `preference_adapter` -> `holdout_eval` -> `style_drift`).
It assumes `base_model` is already materialised (tiny-local built under FLYWHEEL_DATA_DIR).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable

import dagster as dg

from assets.partitions import preference_partitions
from outcome_flywheel.preferences.audit_log import records_frame
from outcome_flywheel.preferences.status import training_status
from outcome_flywheel.settings import env
from pipelines.launch import IN_PROCESS, run_job
from pipelines.preferences import flywheel_resources
from pipelines.resources import core_resources
from scripts import QUIET_CONSOLE

RUN_CONFIG = {**QUIET_CONSOLE, **IN_PROCESS}


def decision_range(resources: dict) -> tuple[str, str]:
    """First and last decision date of the audit log that fall inside the preference partitions."""
    frame = records_frame(resources["audit_log"].parse(), env("FLYWHEEL_TIMEZONE"))
    keys = set(preference_partitions.get_partition_keys())
    dates = sorted(d for d in frame["decision_date"].unique() if d in keys)
    if not dates:
        raise ValueError(
            "the audit log has no decision inside the preference partitions "
            "(FLYWHEEL_PREFERENCES_START_DATE / FLYWHEEL_START_DATE)"
        )
    return dates[0], dates[-1]


def run(
    instance: dg.DagsterInstance, log: Callable[[str], None] = print, training_config: dict | None = None
) -> dict[str, Any]:
    """`training_config`: extra run config of `flywheel_training` (the real-model demo trains one epoch)."""
    # Resolved values (a resource built from the environment may hold EnvVars until a run starts).
    resources = {k: r.process_config_and_initialize() for k, r in {**core_resources(), **flywheel_resources()}.items()}
    started = time.perf_counter()
    first, last = decision_range(resources)
    log(f"flywheel: decisions and outcomes {first}..{last} (one run)")
    r1 = run_job("flywheel_decisions", instance, partition_range=(first, last), run_config=RUN_CONFIG)
    log("flywheel: dpo_dataset -> preference_adapter -> holdout_eval -> style_drift")
    r2 = run_job("flywheel_training", instance, run_config={**RUN_CONFIG, **(training_config or {})})

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
        "run_ids": [r1.run_id, r2.run_id],
        "wall_s": round(time.perf_counter() - started, 1),
    }
    log(json.dumps(summary, default=str))
    return summary


if __name__ == "__main__":
    with dg.DagsterInstance.get() if os.environ.get("DAGSTER_HOME") else dg.DagsterInstance.ephemeral() as inst:
        run(inst)
