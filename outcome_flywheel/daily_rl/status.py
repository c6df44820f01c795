"""The daily loop's state and history, read from the warehouse and the checkpoint folder (the
service's `/api/rl/status` and `/api/rl/history`, the status page)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from outcome_flywheel.daily_rl.loop import read_checkpoint
from outcome_flywheel.json_rows import records

CHECKPOINTS = ("checkpoints", "policy")


def daily_status(warehouse) -> dict[str, Any]:
    """The checkpoint `latest` points at (with its gate), the last day's training row, the last
    evaluation against the base, and the last report's reward."""
    latest = warehouse.path(*CHECKPOINTS, "latest")
    checkpoint = None
    if latest.exists():
        info = read_checkpoint(latest.resolve()) or {}
        checkpoint = {"path": str(latest.resolve()), **{k: info.get(k) for k in (
            "date", "policy_version", "kind", "parent_version", "trained", "gate", "gate_reason", "verified")}}
    training = warehouse.read_all("policy_training")
    last_training = records(training.sort_values("date").tail(1), [
        "date", "policy_version", "trained", "examples", "loss", "kl_to_base", "gate", "gate_reason"]) if len(training) else []
    evaluation = warehouse.read_all("policy_eval")
    last_eval: dict[str, Any] | None = None
    if len(evaluation):
        day = evaluation["date"].max()
        rows = evaluation[evaluation["date"] == day]
        last_eval = {"date": day, "metrics": records(rows, ["metric", "status", "policy", "base", "difference", "ci_low", "ci_high", "n", "label"])}
    report = warehouse.read_all("daily_report")
    last_report = records(report.sort_values("date").tail(1), ["date", "headlines", "rollouts", "mean_structure", "reward_avg", "trained", "gate"]) if len(report) else []
    return {
        "latest_checkpoint": checkpoint,
        "last_training": last_training[0] if last_training else None,
        "last_evaluation": last_eval,
        "last_report": last_report[0] if last_report else None,
        "days_scored": int(report["date"].nunique()) if len(report) else 0,
    }


def daily_history(warehouse) -> list[dict[str, Any]]:
    """One row per day: mean reward, GSPO loss, KL to the base, the gate, structure of policy and base."""
    report = warehouse.read_all("daily_report")
    training = warehouse.read_all("policy_training")
    if report.empty and training.empty:
        return []
    days = sorted(set(report.get("date", pd.Series(dtype=str))) | set(training.get("date", pd.Series(dtype=str))))
    frame = pd.DataFrame({"date": days})
    if len(report):
        frame = frame.merge(report[["date", "reward_avg", "mean_structure"]], on="date", how="left")
    if len(training):
        frame = frame.merge(training[["date", "policy_version", "trained", "loss", "kl_to_base", "gate"]], on="date", how="left")
    evaluation = warehouse.read_all("policy_eval")
    if len(evaluation):
        structure = evaluation[evaluation["metric"] == "structure_score"][["date", "policy", "base", "label"]]
        structure = structure.rename(columns={"policy": "structure_policy", "base": "structure_base", "label": "structure_label"})
        frame = frame.merge(structure, on="date", how="left")
    return records(frame, list(frame.columns))
