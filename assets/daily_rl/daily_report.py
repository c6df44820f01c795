"""`daily_report`: the loop's per-day numbers and its figures (reward, KL, pass-through)."""

import base64

import dagster as dg
import pandas as pd

from outcome_flywheel.daily_rl.report import FIGURES, SUMMARY_COLUMNS, day_summary
from assets.partitions import daily_partitions
from outcome_flywheel.storage import Warehouse, atomic_write_bytes


@dg.asset(
    partitions_def=daily_partitions,
    group_name="daily_rl",
    deps=["rollout_scores", "policy_checkpoint", "rollouts"],
    pool="duckdb",
    kinds={"parquet"},
)
def daily_report(context: dg.AssetExecutionContext, warehouse: dg.ResourceParam[Warehouse]):
    """Day D's headlines, rollouts, pass-through (usable share), mean structure score, reward
    n/avg/min/max/negatives and training summary (table `daily_report`, one row per day), and
    figures over every reported day up to D: reward curve, KL to base, pass-through (PNG under
    reports/daily_rl/D/, shown inline here)."""
    day = context.partition_key
    row = day_summary(
        day, warehouse.read("headlines", day), warehouse.read("rollouts", day),
        warehouse.read("rollout_scores", day), warehouse.read("policy_training", day),
    )
    warehouse.write("daily_report", pd.DataFrame([row], columns=SUMMARY_COLUMNS), partition=day)
    history = warehouse.read_all("daily_report")
    history = history[history["date"] <= day].sort_values("date")

    folder = warehouse.path("reports", "daily_rl", day)
    metadata: dict = {k: v for k, v in row.items() if isinstance(v, (int, float, bool, str)) and v == v}
    for name, make in FIGURES.items():
        png = make(history)
        path = folder / f"{name}.png"
        atomic_write_bytes(path, png)
        metadata[f"{name}_png"] = dg.MetadataValue.path(str(path))
        metadata[f"{name}_figure"] = dg.MetadataValue.md(f"![{name}](data:image/png;base64,{base64.b64encode(png).decode()})")
    metadata["days_reported"] = len(history)
    return dg.MaterializeResult(metadata=metadata)
