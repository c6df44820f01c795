"""`decision_outcomes`: the T+5 basket return vs SPY of every decision's proposal."""

from datetime import datetime, timezone

import dagster as dg
import pandas as pd

from assets.catalog import OWNERS, TABLE_KINDS, table_metadata
from assets.partitions import preference_partitions
from outcome_flywheel.market_data import MarketData
from outcome_flywheel.preferences.audit_log import load_orders
from outcome_flywheel.preferences.windows import (
    BENCHMARK,
    OUTCOME_COLUMNS,
    WINDOW_DAYS,
    compute_outcome,
    empty_outcomes,
    t5_window,
)
from outcome_flywheel.storage import Warehouse


def outcome_rows(
    decisions: pd.DataFrame, market_data: dg.ResourceParam[MarketData], now: datetime
) -> tuple[pd.DataFrame, int]:
    """Outcomes of `decisions` with ONE price request for every symbol and date they need."""
    if decisions.empty:
        return empty_outcomes(), 0
    symbols = {BENCHMARK}
    windows = []
    for r in decisions.itertuples(index=False):
        symbols.update(o["symbol"] for o in load_orders(r.proposal_orders_json))
        try:
            windows.append(t5_window(r.ts_utc, WINDOW_DAYS))
        except ValueError:
            pass
    start = min(decisions["decision_date"])
    end = max([w.exit_date for w in windows], default=start)
    table, downloads = market_data.price_table(sorted(symbols), start, end, now)
    computed_at = now.isoformat()
    rows = []
    for r in decisions.itertuples(index=False):
        out = compute_outcome(r.ts_utc, load_orders(r.proposal_orders_json), table, now=now)
        out.update(decision_id=r.decision_id, decision_date=r.decision_date, computed_at=computed_at)
        rows.append(out)
    df = pd.DataFrame(rows)[list(OUTCOME_COLUMNS)].astype(OUTCOME_COLUMNS)
    return df, downloads


@dg.asset(
    group_name="flywheel",
    partitions_def=preference_partitions,
    backfill_policy=dg.BackfillPolicy.single_run(),
    deps=["operator_decisions"],
    pool="duckdb",
    kinds=TABLE_KINDS,
    owners=OWNERS,
    metadata=table_metadata("decision_outcomes", OUTCOME_COLUMNS),
)
def decision_outcomes(
    context: dg.AssetExecutionContext, market_data: dg.ResourceParam[MarketData], warehouse: dg.ResourceParam[Warehouse]
):
    """T+5 outcome of each decision's proposal on the NYSE calendar (exchange_calendars XNYS): entry at
    the first session close at or after the decision, exit 5 sessions later; equal-weighted basket
    return, SPY's return and the difference in percentage points (`vs_spy_pct`). `status` is matured,
    pending (exit not closed or not in the data yet; re-run by `flywheel_outcomes_schedule` once it
    can mature) or no_data (with the reason). Never invents a price."""
    keys = list(context.partition_keys)
    frames = [warehouse.read("operator_decisions", k) for k in keys]
    frames = [f for f in frames if len(f)]
    decisions = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    now = datetime.now(timezone.utc)
    outcomes, downloads = outcome_rows(decisions, market_data, now)
    for key in keys:
        rows = outcomes[outcomes["decision_date"] == key]
        warehouse.write("decision_outcomes", rows if len(rows) else empty_outcomes(), partition=key)
    status = outcomes["status"].value_counts().to_dict() if len(outcomes) else {}
    pending = outcomes[outcomes["status"] == "pending"]
    next_check = pending["exit_close_utc"].dropna().min() if len(pending) else None
    matured = outcomes[outcomes["status"] == "matured"]
    metadata: dict = {"mean_vs_spy_pct": round(float(matured["vs_spy_pct"].mean()), 4)} if len(matured) else {}
    yield dg.MaterializeResult(
        metadata={
            "n_decisions": len(outcomes),
            "n_matured": int(status.get("matured", 0)),
            "n_pending": int(status.get("pending", 0)),
            "n_no_data": int(status.get("no_data", 0)),
            "downloads": downloads,
            "market_data": market_data.describe(),
            **metadata,  # left out when nothing matured (a NaN breaks the plots)
            "earliest_pending_exit_close": str(next_check) if next_check else "none",
            "not_matured": dg.MetadataValue.md(
                "\n".join(
                    f"- {r.decision_id}: {r.status}: {r.reason}"
                    for r in outcomes[outcomes["status"] != "matured"].head(20).itertuples()
                )
                or "none"
            ),
        }
    )


def pending_partitions_ready(outcomes: pd.DataFrame, now: datetime) -> list[str]:
    """Partitions holding a pending outcome whose exit session has closed by `now` (it may mature
    once the prices arrive); pending outcomes whose exit is still ahead wait."""
    if outcomes.empty:
        return []
    pending = outcomes[outcomes["status"] == "pending"].dropna(subset=["exit_close_utc"])
    ready = pending[pd.to_datetime(pending["exit_close_utc"], utc=True) <= pd.Timestamp(now)]
    return sorted(ready["decision_date"].unique().tolist())


def unmaterialized_decision_dates(log_dates: set[str], materialized: set[str], partition_keys: set[str]) -> list[str]:
    """Decision dates present in the audit log but with no `operator_decisions` partition yet."""
    return sorted((log_dates & partition_keys) - materialized)
