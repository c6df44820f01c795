"""`dpo_dataset`: outcome-weighted preference pairs over every decision partition, with exports."""

import hashlib
import json

import dagster as dg
import pandas as pd

from assets.catalog import OWNERS, TABLE_KINDS, table_metadata
from outcome_flywheel.exports import EXPORT_FORMATS, jsonl_bytes
from outcome_flywheel.preferences.pool import POOL_CAP, cap_pool
from outcome_flywheel.preferences.status import latest_decisions, prompt_context_keys, training_status
from outcome_flywheel.preferences.weighting import (
    PAIR_COLUMNS,
    WEIGHT_TABLE,
    build_pairs,
    dataset_fingerprint,
    export_metadata,
    export_rows,
    holdout_split,
    outcome_treatment,
)
from outcome_flywheel.storage import Warehouse, atomic_write_bytes

EXPORT_DIR = ("exports", "preference")
TREATMENTS = sorted({treatment for _, _, treatment in WEIGHT_TABLE.values()})


def _triple(prompt, chosen: str, rejected: str) -> tuple[str, str, str]:
    prompt = json.loads(prompt) if isinstance(prompt, str) else prompt
    return json.dumps(prompt, sort_keys=True), chosen, rejected


def holdout_leaks(pairs: pd.DataFrame, exported_trl_rows: list[dict] | None = None) -> list[str]:
    """Decision ids of holdout pairs found in training: train rows whose id hashes to the holdout,
    ids in both splits, or a holdout (prompt, chosen, rejected) in the exported TRL rows that no
    training pair accounts for."""
    if pairs.empty:
        return []
    train = pairs[pairs["split"] == "train"]
    hold = pairs[pairs["split"] == "holdout"]
    leaks = set(train["decision_id"]) & set(hold["decision_id"])
    leaks |= {d for d in train["decision_id"] if holdout_split(d) != "train"}
    if exported_trl_rows is not None:
        exported = {
            _triple(r["prompt"], r["chosen"][0]["content"], r["rejected"][0]["content"]) for r in exported_trl_rows
        }
        trained = {_triple(*t) for t in zip(train["prompt"], train["chosen"], train["rejected"])}
        for d, *t in zip(hold["decision_id"], hold["prompt"], hold["chosen"], hold["rejected"]):
            key = _triple(*t)
            if key in exported and key not in trained:
                leaks.add(d)
    return sorted(leaks)


def weights_off_table(pairs: pd.DataFrame) -> list[str]:
    bad = []
    for r in pairs.itertuples(index=False):
        weight, replication, treatment = outcome_treatment(r.decision, r.verdict)
        if (
            (weight, replication, treatment) != (r.outcome_weight, r.replication, r.treatment)
            or r.effective_weight != abs(weight)
            or r.swapped != (weight < 0)
        ):
            bad.append(r.decision_id)
    return bad


@dg.asset(
    group_name="flywheel",
    deps=["operator_decisions", "decision_outcomes"],
    pool="duckdb",
    kinds=TABLE_KINDS,
    owners=OWNERS,
    metadata=table_metadata("dpo_dataset", PAIR_COLUMNS),
    check_specs=[
        dg.AssetCheckSpec(
            "no_holdout_in_training",
            asset="dpo_dataset",
            blocking=True,
            description="No holdout decision is in the training split or the exports.",
        ),
        dg.AssetCheckSpec(
            "weights_follow_table",
            asset="dpo_dataset",
            blocking=True,
            description="Every pair's weight, replication and swap match the outcome-weighting table.",
        ),
    ],
)
def dpo_dataset(context: dg.AssetExecutionContext, warehouse: dg.ResourceParam[Warehouse]):
    """DPO pairs from every decision: approve -> proposal over hold, reject -> hold over proposal,
    override -> operator's orders over proposal; plans rendered as text the same way every time; the
    prompt holds the context keys named in FLYWHEEL_PREFERENCE_CONTEXT (default none).
    Weighted by the T+5 outcome (docs/flywheel.md, "How the loop works"; swap when the market proved the operator wrong).
    20% of decisions (stable hash of the id) are the holdout, never trained on or exported. Exports
    for TRL, NeMo-RL and Together/OpenAI (replicated x3 / x1 / x1.5) with metadata sidecars."""
    decisions = latest_decisions(warehouse.read_all("operator_decisions"))
    outcomes = warehouse.read_all("decision_outcomes")
    if len(outcomes):
        outcomes = outcomes.drop_duplicates("decision_id", keep="last")
    keys = prompt_context_keys()
    pairs, skipped = (
        build_pairs(decisions, outcomes, context_keys=keys)
        if len(decisions)
        else build_pairs(pd.DataFrame(columns=["decision_id"]), None)
    )
    pairs, dropped_by_cap = cap_pool(pairs)  # the pool's cap: the oldest decisions go first
    warehouse.write("dpo_dataset", pairs)
    fingerprint = dataset_fingerprint(pairs)

    export_dir = warehouse.path(*EXPORT_DIR)
    export_counts = {}
    for fmt in EXPORT_FORMATS:
        rows = export_rows(pairs, fmt)
        data = jsonl_bytes(rows)
        sha = hashlib.sha256(data).hexdigest()
        path = export_dir / f"{fmt}.jsonl"
        atomic_write_bytes(path, data)
        meta = export_metadata(pairs, fmt, len(rows), sha)
        atomic_write_bytes(path.with_suffix(".meta.json"), json.dumps(meta, indent=1, sort_keys=True).encode())
        export_counts[fmt] = len(rows)
    # Read the TRL export back for the leak check: it checks what was written, not what was meant.
    exported_trl = [json.loads(line) for line in (export_dir / "trl.jsonl").read_text().splitlines() if line]

    status = training_status(warehouse)
    by_treatment = pairs["treatment"].value_counts().to_dict() if len(pairs) else {}
    yield dg.MaterializeResult(
        metadata={
            "n_pairs": len(pairs),
            "n_train": int((pairs["split"] == "train").sum()) if len(pairs) else 0,
            "n_holdout": int((pairs["split"] == "holdout").sum()) if len(pairs) else 0,
            "n_skipped": len(skipped),
            "pool_cap": POOL_CAP,
            "n_dropped_by_cap": dropped_by_cap,
            "prompt_context_keys": ", ".join(keys) or "(none: one context-free prompt)",
            **{f"n_{t}": int(by_treatment.get(t, 0)) for t in TREATMENTS},
            **{f"export_rows_{fmt}": n for fmt, n in export_counts.items()},
            "export_dir": dg.MetadataValue.path(str(export_dir)),
            "dataset_fingerprint": fingerprint,
            "dagster/row_count": len(pairs),
            "n_new_pairs_since_last_adapter": status["n_new_pairs_since_last_adapter"],
            "min_new_pairs": status["min_new_pairs"],
            "ready_to_train": status["ready_to_train"],
            "blocking_reasons": dg.MetadataValue.md("\n".join(f"- {r}" for r in status["blocking_reasons"]) or "none"),
        }
    )
    leaks = holdout_leaks(pairs, exported_trl)
    yield dg.AssetCheckResult(
        check_name="no_holdout_in_training",
        passed=not leaks,
        metadata={"leaked_decision_ids": dg.MetadataValue.json(leaks[:50])},
    )
    off = weights_off_table(pairs)
    yield dg.AssetCheckResult(
        check_name="weights_follow_table", passed=not off, metadata={"decision_ids": dg.MetadataValue.json(off[:50])}
    )
