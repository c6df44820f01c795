"""`holdout_eval` and `style_drift`: does the adapter's style score separate what the operator approved?"""

from datetime import datetime, timezone

import dagster as dg
import pandas as pd

from assets.catalog import OWNERS, TABLE_KINDS, column_names, table_metadata
from assets.tracking_links import link_metadata
from outcome_flywheel.models.loader import ModelLoader
from outcome_flywheel.preferences.metrics import auc_report, drift_level, rejected_winners
from outcome_flywheel.preferences.status import latest_adapter_dir
from outcome_flywheel.preferences.style_match import score_holdout, scoring_settings
from outcome_flywheel.storage import Warehouse
from outcome_flywheel.tracking import Tracker
from outcome_flywheel.tracking.records import numbers, record_figures

EVAL_TABLE = "holdout_eval"
EVAL_HISTORY_TABLE = "holdout_eval_history"
DRIFT_TABLE = "style_drift"


def _md_table(df: pd.DataFrame) -> str:
    if df.empty:
        return "none"
    lines = ["| decision | date | style score | vs SPY (pp) | plan |", "|---|---|---|---|---|"]
    for r in df.itertuples(index=False):
        plan = str(r.proposal_plan).replace("\n", " ")
        lines.append(
            f"| {r.decision_id} | {r.decision_date} | {r.style_match_score:.3f} | {r.vs_spy_pct:+.2f} | {plan} |"
        )
    return "\n".join(lines)


@dg.asset(
    group_name="flywheel",
    deps=["preference_adapter", "dpo_dataset", "base_model"],
    pool="accelerator",
    kinds=TABLE_KINDS,
    owners=OWNERS,
    metadata=table_metadata(EVAL_TABLE, column_names(EVAL_TABLE)),
)
def holdout_eval(
    context: dg.AssetExecutionContext,
    model_backend: dg.ResourceParam[ModelLoader],
    warehouse: dg.ResourceParam[Warehouse],
    tracking: dg.ResourceParam[Tracker],
):
    """Every holdout proposal scored with the latest adapter against holding, as its pairs were
    trained: margin_logp = the DPO implicit reward (log-prob under base + adapter minus under the
    base) of the proposal minus that of holding, style_match_score = sigmoid(beta * margin). Approval AUC (Mann-Whitney U
    over score and decision == approve) with a bootstrap 95% interval and its label (useful > 0.65,
    marginal 0.55-0.65, else no useful signal yet; an interval reaching 0.5 is no signal); rejected
    winners (rejected, score >= 0.5, beat SPY), top 5. Appends to `holdout_eval_history`."""
    adapter = latest_adapter_dir(warehouse)
    if adapter is None:
        raise FileNotFoundError("no preference adapter yet: materialise preference_adapter first")
    pairs = warehouse.read("dpo_dataset")
    backend = model_backend.load(adapter_path=adapter)
    scored = score_holdout(backend, pairs, *scoring_settings(adapter))
    report = auc_report(
        scored["style_match_score"].to_numpy(), (scored["decision"] == "approve").to_numpy(), seed=model_backend.seed
    )
    winners = rejected_winners(scored)
    evaluated_at = datetime.now(timezone.utc).isoformat()
    scored.insert(0, "adapter_run", adapter.name)
    scored["evaluated_at"] = evaluated_at
    warehouse.write(EVAL_TABLE, scored[column_names(EVAL_TABLE, scored.columns)])
    history = pd.DataFrame(
        [
            {
                "adapter_run": adapter.name,
                "evaluated_at": evaluated_at,
                **report.as_dict(),
                "n_rejected_winners": int(len(winners)),
                "mean_score_approved": float(scored.loc[scored["decision"] == "approve", "style_match_score"].mean()),
                "mean_score_other": float(scored.loc[scored["decision"] != "approve", "style_match_score"].mean()),
            }
        ]
    )
    # One row per adapter: re-evaluating the same adapter replaces its row.
    warehouse.write(EVAL_HISTORY_TABLE, history, partition=adapter.name, key="run")
    context.log.info(
        f"holdout AUC {report.auc:.3f} [{report.auc_low:.3f}, {report.auc_high:.3f}] n={report.n_holdout}: {report.label}"
    )
    links = record_figures(  # a run of the preferences experiment, beside the adapter's training run
        tracking,
        "preferences",
        f"holdout_eval {adapter.name}",
        {"partition": adapter.name, "dagster_run_id": context.run_id, "asset_key": "holdout_eval"},
        numbers(
            {"auc": report.auc, "auc_low": report.auc_low, "auc_high": report.auc_high, "n_holdout": report.n_holdout}
        ),
        log=context.log.warning,
    )
    return dg.MaterializeResult(
        metadata={
            **link_metadata(links),
            "adapter_run": adapter.name,
            **_rounded(auc=report.auc, auc_low=report.auc_low, auc_high=report.auc_high),
            "label": report.label,
            "dagster/row_count": len(scored),
            "n_holdout": report.n_holdout,
            "n_approved": report.n_approved,
            "rejected_winners": dg.MetadataValue.md(_md_table(winners)),
        }
    )


@dg.asset(
    group_name="flywheel",
    deps=["holdout_eval"],
    pool="duckdb",
    kinds=TABLE_KINDS,
    owners=OWNERS,
    metadata=table_metadata(DRIFT_TABLE, column_names(DRIFT_TABLE)),
    check_specs=[
        dg.AssetCheckSpec(
            "drift_not_high", asset="style_drift", description="Warns when the mean of the last 3 AUCs is below 0.55."
        )
    ],
)
def style_drift(
    context: dg.AssetExecutionContext, warehouse: dg.ResourceParam[Warehouse], tracking: dg.ResourceParam[Tracker]
):
    """Style drift: the mean of the last 3 holdout AUCs; below 0.55 -> `high` (the adapter no longer
    tells what the operator approves: retrain, or look at what changed)."""
    hist = warehouse.read_all(EVAL_HISTORY_TABLE)
    hist = hist.sort_values("evaluated_at") if len(hist) else hist
    level = drift_level(hist["auc"].tolist() if len(hist) else [])
    row = {
        **level,
        "computed_at": datetime.now(timezone.utc).isoformat(),
        "last_runs": ",".join(hist["adapter_run"].tail(3)) if len(hist) else "",
    }
    warehouse.write(DRIFT_TABLE, pd.DataFrame([row])[column_names(DRIFT_TABLE, row)])
    last = hist["adapter_run"].iloc[-1] if len(hist) else ""
    links = record_figures(
        tracking,
        "preferences",
        f"style_drift {last}",
        {"partition": last, "dagster_run_id": context.run_id, "asset_key": "style_drift", "drift": level["drift"]},
        numbers({"mean_auc_last": level["mean_auc_last"], "n_evals": level["n_evals"]}),
        log=context.log.warning,
    )
    yield dg.MaterializeResult(
        metadata={
            **link_metadata(links),
            "drift": level["drift"],
            **_rounded(mean_auc_last=level["mean_auc_last"]),
            "n_evals": level["n_evals"],
        }
    )
    yield dg.AssetCheckResult(
        check_name="drift_not_high",
        passed=level["drift"] != "high",
        severity=dg.AssetCheckSeverity.WARN,
        metadata=_rounded(mean_auc_last=level["mean_auc_last"]),
    )


def _rounded(**values: float) -> dict:
    """Rounded floats for metadata (Dagster plots them); NaN (nothing to measure yet) left out."""
    return {k: round(float(v), 4) for k, v in values.items() if v is not None and v == v}
