"""The flywheel's training status, read from the warehouse (used by asset metadata, the sensor and
`flywheel status`, `outcome_flywheel/cli.py`). Takes any object with the `Warehouse` read methods."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pandas as pd

from outcome_flywheel.preferences.metrics import drift_level
from outcome_flywheel.preferences.weighting import build_pairs

MIN_NEW_PAIRS = 10
ADAPTERS_DIR = ("adapters", "preference")
TRAIN_INFO = "train_info.json"


def min_new_pairs() -> int:
    return int(os.environ.get("FLYWHEEL_MIN_NEW_PAIRS") or MIN_NEW_PAIRS)


def prompt_context_keys() -> tuple[str, ...]:
    """FLYWHEEL_PREFERENCE_CONTEXT: the decision-context keys the pairs' prompt holds (`note` = the
    proposal's note); unset = none, one context-free prompt for every decision."""
    raw = os.environ.get("FLYWHEEL_PREFERENCE_CONTEXT") or ""
    return tuple(sorted({k.strip() for k in raw.split(",") if k.strip()}))


def adapter_context_keys(adapter_dir: Path | None) -> tuple[str, ...]:
    """The context keys of the dataset an adapter was trained on (its train_info.json); a new
    proposal's prompt must be rendered the same way. An adapter recorded without them used every key."""
    if adapter_dir is None or not (Path(adapter_dir) / TRAIN_INFO).exists():
        return prompt_context_keys()
    info = json.loads((Path(adapter_dir) / TRAIN_INFO).read_text())
    if "prompt_context_keys" not in info:
        return ("*",)
    return tuple(info["prompt_context_keys"])


def latest_decisions(decisions: pd.DataFrame) -> pd.DataFrame:
    """One row per decision id (a corrected line that moved to another date may sit in two
    partitions until the old one is re-run: the later log line wins)."""
    if decisions.empty:
        return decisions
    return decisions.sort_values("line_number").drop_duplicates("decision_id", keep="last").reset_index(drop=True)


def current_pairs(warehouse) -> pd.DataFrame:
    """The pairs the dataset would hold now, from the decision and outcome partitions on disk."""
    decisions = latest_decisions(warehouse.read_all("operator_decisions"))
    if decisions.empty:
        return pd.DataFrame()
    outcomes = warehouse.read_all("decision_outcomes")
    if len(outcomes):
        outcomes = outcomes.drop_duplicates("decision_id", keep="last")
    pairs, _ = build_pairs(decisions, outcomes, context_keys=prompt_context_keys())
    return pairs


def latest_adapter_dir(warehouse) -> Path | None:
    link = warehouse.path(*ADAPTERS_DIR, "latest")
    return link.resolve() if link.exists() else None


def trained_state(adapter_dir: Path | None) -> dict[str, str]:
    """decision_id -> verdict the adapter was trained with (from its train_info.json)."""
    if adapter_dir is None or not (adapter_dir / TRAIN_INFO).exists():
        return {}
    return json.loads((adapter_dir / TRAIN_INFO).read_text()).get("trained", {})


def new_pairs_since(pairs: pd.DataFrame, trained: dict[str, str]) -> int:
    """Training pairs that are new, or whose verdict changed (an outcome matured), since the adapter."""
    if pairs.empty:
        return 0
    train = pairs[pairs["split"] == "train"]
    return int(sum(trained.get(d) != v for d, v in zip(train["decision_id"], train["verdict"])))


def _clean(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def last_eval(warehouse) -> dict[str, Any] | None:
    hist = warehouse.read_all("holdout_eval_history")
    if hist.empty:
        return None
    row = hist.sort_values("evaluated_at").iloc[-1]
    return {
        k: _clean(row[k].item() if hasattr(row[k], "item") else row[k])
        for k in ["adapter_run", "evaluated_at", "auc", "auc_low", "auc_high", "n_holdout", "label"]
    }


def drift(warehouse) -> dict[str, Any]:
    hist = warehouse.read_all("holdout_eval_history")
    aucs = hist.sort_values("evaluated_at")["auc"].tolist() if len(hist) else []
    return {k: _clean(v) for k, v in drift_level(aucs).items()}


def training_status(warehouse, min_new: int | None = None, pairs: pd.DataFrame | None = None) -> dict[str, Any]:
    """n_preferences, n_dpo_pairs, n_holdout, ready_to_train with blocking reasons, last eval, drift
    (`pairs`: `current_pairs(warehouse)` when the caller has it already)."""
    min_new = min_new_pairs() if min_new is None else min_new
    decisions = latest_decisions(warehouse.read_all("operator_decisions"))
    pairs = current_pairs(warehouse) if pairs is None else pairs
    dataset = warehouse.read("dpo_dataset")
    adapter = latest_adapter_dir(warehouse)
    new = new_pairs_since(pairs, trained_state(adapter))
    n_train = int((pairs["split"] == "train").sum()) if len(pairs) else 0
    n_holdout = int((pairs["split"] == "holdout").sum()) if len(pairs) else 0
    reasons = []
    if decisions.empty:
        reasons.append("no operator decisions materialised yet")
    if n_train == 0:
        reasons.append("no training pairs")
    if new < min_new:
        reasons.append(f"{new} new pairs since the last adapter, fewer than {min_new}")
    if len(pairs) and pairs.loc[pairs["split"] == "holdout", "decision"].eq("approve").nunique() < 2:
        reasons.append("the holdout needs both approved and not-approved decisions for an AUC")
    quarantined = warehouse.read("operator_decisions_quarantine")
    return {
        "n_preferences": int(len(decisions)),
        "n_quarantined_lines": int(len(quarantined)),
        "n_dpo_pairs": int(len(pairs)),
        "n_train": n_train,
        "n_holdout": n_holdout,
        "n_pairs_in_dataset_table": int(len(dataset)),
        "n_new_pairs_since_last_adapter": new,
        "min_new_pairs": min_new,
        "ready_to_train": not reasons,
        "blocking_reasons": reasons,
        "latest_adapter": str(adapter) if adapter else None,
        "last_eval": last_eval(warehouse),
        "drift": drift(warehouse),
    }
