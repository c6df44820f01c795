"""`daily_report`: the loop's per-day numbers and its figures (reward, KL, pass-through)."""

import base64
import math

import dagster as dg
import pandas as pd

from assets.catalog import OWNERS, TABLE_KINDS, table_metadata
from assets.partitions import daily_rl_partitions
from outcome_flywheel.daily_rl.report import FIGURES, SUMMARY_COLUMNS, day_summary
from outcome_flywheel.storage import Warehouse, atomic_write_bytes

# Columns of the short table in the report (the last REPORT_DAYS days up to D), with their headers.
REPORT_COLUMNS = {
    "date": "day", "headlines": "headlines", "rollouts": "rollouts", "mean_structure": "structure",
    "usable_share": "pass-through", "reward_avg": "reward", "steps": "steps", "loss": "loss", "kl_to_base": "KL",
}
REPORT_DAYS = 7
FIGURE_TITLES = {"reward": "Reward and structure", "kl": "KL to the base model", "pass_through": "Judge pass-through"}


@dg.asset(
    partitions_def=daily_rl_partitions,
    group_name="daily_rl",
    deps=["rollout_scores", "policy_checkpoint", "rollouts"],
    pool="duckdb",
    kinds=TABLE_KINDS,
    owners=OWNERS,
    metadata=table_metadata("daily_report", SUMMARY_COLUMNS),
)
def daily_report(context: dg.AssetExecutionContext, warehouse: dg.ResourceParam[Warehouse]):
    """Day D's headlines, rollouts, pass-through (usable share), mean structure score, reward
    n/avg/min/max/negatives and training summary (table `daily_report`, one row per day), and
    figures over every reported day up to D: reward curve, KL to base, pass-through. The `report`
    entry shows the last days' numbers and the figures inline; the PNGs are also written under
    reports/daily_rl/D/."""
    day = context.partition_key
    row = day_summary(
        day, warehouse.read("headlines", day), warehouse.read("rollouts", day),
        warehouse.read("rollout_scores", day), warehouse.read("policy_training", day),
    )
    warehouse.write("daily_report", pd.DataFrame([row], columns=SUMMARY_COLUMNS), partition=day)
    history = warehouse.read_all("daily_report")
    history = history[history["date"] <= day].sort_values("date").reset_index(drop=True)

    folder = warehouse.path("reports", "daily_rl", day)
    figures = {}
    for name, make in FIGURES.items():
        png = make(history)
        atomic_write_bytes(folder / f"{name}.png", png)
        figures[name] = png
    metadata: dict = {"report": dg.MetadataValue.md(report_markdown(day, history, figures))}
    metadata.update(numeric_metadata(row))
    metadata["policy_version"] = row["policy_version"]
    metadata["days_reported"] = len(history)
    metadata["figures_dir"] = dg.MetadataValue.path(str(folder))
    return dg.MaterializeResult(metadata=metadata)


def numeric_metadata(row: dict) -> dict:
    """The day's numbers as plain rounded values (Dagster plots them across partitions); NaN left out."""
    out = {}
    for key, value in row.items():
        if isinstance(value, bool):
            out[key] = value
        elif isinstance(value, int):
            out[key] = value
        elif isinstance(value, float) and not math.isnan(value):
            out[key] = round(value, 6 if key == "kl_to_base" else 4)
    return out


def report_markdown(day: str, history: pd.DataFrame, figures: dict[str, bytes]) -> str:
    """One markdown entry: the last days' numbers, then each figure as an inline PNG (data URI)."""
    recent = history.tail(REPORT_DAYS)
    header = "| " + " | ".join(REPORT_COLUMNS.values()) + " |\n|" + " --- |" * len(REPORT_COLUMNS) + "\n"
    rows = "".join("| " + " | ".join(_cell(r[c], c) for c in REPORT_COLUMNS) + " |\n" for _, r in recent.iterrows())
    parts = [
        f"**Daily loop up to {day}** ({len(history)} day{'s' if len(history) != 1 else ''} reported; "
        f"the last {len(recent)} below). Pass-through = share of yesterday's notes the judge ranked; reward in [0, 1]; "
        "KL to the base in nats per token.",
        header + rows,
    ]
    for name, png in figures.items():  # each figure carries its own title
        parts.append(f"![{FIGURE_TITLES.get(name, name)}](data:image/png;base64,{base64.b64encode(png).decode()})")
    return "\n\n".join(parts)


def _cell(value, column: str) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "–"
        return f"{value:.3g}" if column in ("loss", "kl_to_base") else f"{value:.3f}"
    return str(value)
