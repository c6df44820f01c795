"""`rollout_outcomes`: each note's trade call (policy and base) and its realised price outcome on XNYS."""

from datetime import datetime, timezone
from typing import Optional

import dagster as dg
import pandas as pd
from pydantic import Field

from assets.catalog import OWNERS, TABLE_KINDS, table_metadata
from assets.partitions import daily_rl_partitions
from outcome_flywheel.daily_rl.evaluation.look_ahead import LOOK_AHEAD_COLUMNS, look_ahead_flags
from outcome_flywheel.daily_rl.notes.calls import CALL_COLUMNS, calls_frame
from outcome_flywheel.daily_rl.notes.outcomes import BENCHMARK, OUTCOME_COLUMNS, outcome_rows, price_range
from outcome_flywheel.market_data import MarketData
from outcome_flywheel.settings import env
from outcome_flywheel.storage import Warehouse
from outcome_flywheel.trading_sessions import PriceTable

NOTE_COLUMNS = ["date", "source", "headline_id", "rollout_index", "policy_version"]
ROLLOUT_OUTCOME_COLUMNS = NOTE_COLUMNS + CALL_COLUMNS + list(OUTCOME_COLUMNS) + list(LOOK_AHEAD_COLUMNS)


class RolloutOutcomesConfig(dg.Config):
    """Run config of `rollout_outcomes`; a field left out takes its FLYWHEEL_* variable."""

    horizon_sessions: Optional[int] = Field(
        default=None,
        ge=1,
        le=60,
        description=("Sessions between entry and exit. Default: FLYWHEEL_OUTCOME_HORIZON, else 1."),
    )
    cost_bps: Optional[float] = Field(
        default=None,
        ge=0,
        description=(
            "Round-trip cost in basis points taken off every call's return. Default: FLYWHEEL_OUTCOME_COST_BPS, else 10."
        ),
    )

    def resolved(self) -> tuple[int, float]:
        horizon = self.horizon_sessions or int(env("FLYWHEEL_OUTCOME_HORIZON"))
        cost = self.cost_bps if self.cost_bps is not None else float(env("FLYWHEEL_OUTCOME_COST_BPS"))
        return horizon, cost


def day_notes(warehouse: Warehouse, day: str) -> pd.DataFrame:
    """D's notes of both sources: `rollouts` (source policy) and `baseline_rollouts` (source base)."""
    frames = []
    for table, source in (("rollouts", "policy"), ("baseline_rollouts", "base")):
        frame = warehouse.read(table, day)
        if len(frame):
            frames.append(frame.assign(source=source)[NOTE_COLUMNS + ["response"]])
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=NOTE_COLUMNS + ["response"])


def closes_off_the_data(outcomes: pd.DataFrame, prices: PriceTable) -> list[str]:
    """Matured rows whose entry or exit close is not the price data's close of that symbol and date."""
    bad = []
    for r in outcomes[outcomes["status"] == "matured"].itertuples(index=False):
        for when, value in ((r.entry_date, r.entry_close), (r.exit_date, r.exit_close)):
            if prices.close.get((when, r.symbol)) != value:
                bad.append(f"{r.source} {r.headline_id}/{r.rollout_index} {r.symbol} {when}")
    return bad


@dg.asset(
    partitions_def=daily_rl_partitions,
    group_name="daily_rl",
    deps=["rollouts", "baseline_rollouts"],
    pool="duckdb",
    kinds=TABLE_KINDS,
    owners=OWNERS,
    metadata=table_metadata("rollout_outcomes", ROLLOUT_OUTCOME_COLUMNS),
    check_specs=[
        dg.AssetCheckSpec(
            "no_invented_prices",
            asset="rollout_outcomes",
            blocking=True,
            description="Every matured call's entry and exit closes are the price data's closes of that symbol and session; nothing filled.",
        )
    ],
)
def rollout_outcomes(
    context: dg.AssetExecutionContext,
    config: RolloutOutcomesConfig,
    warehouse: dg.ResourceParam[Warehouse],
    market_data: dg.ResourceParam[MarketData],
):
    """The call of every note of D (the policy's `rollouts` and the base's `baseline_rollouts`):
    symbol (validated against the market data's symbols; company names map to tickers), side, the
    note's timeframe, size and stop, or why there is no usable call; and its outcome on XNYS sessions.
    Entry = close of the first session strictly after D (the note is written after D's news), exit =
    close h sessions later (FLYWHEEL_OUTCOME_HORIZON, default 1). With s = +1 long / -1 short:
    return_pct = 100 s (exit/entry - 1) - cost/100, vs_spy_pct = 100 s (r - r_SPY) - cost/100, cost
    FLYWHEEL_OUTCOME_COST_BPS (10 bps round trip). Status matured / pending (re-run by
    `daily_rl_outcomes_schedule` once the exit session has closed, or once the price data reaches the
    exit) / no_data (reason) / no_call. `look_ahead` flags the policy's notes when its checkpoint was
    trained on headlines dated after D (an override re-run; rule in outcome_flywheel.daily_rl.evaluation.look_ahead):
    policy_eval and backtest leave those days out unless their run config includes them."""
    day = context.partition_key
    horizon, cost = config.resolved()
    notes = day_notes(warehouse, day)
    if notes.empty and not warehouse.exists("rollouts", day):
        raise dg.Failure(f"rollouts of {day} are not materialised: run daily_update for {day} first")
    calls = calls_frame(notes, market_data.universe()).drop(columns=["response"])
    symbols = sorted({s for s in calls["symbol"].dropna()} | {BENCHMARK})
    start, end = price_range([day], horizon)
    now = datetime.now(timezone.utc)  # one clock: the closed sessions served and the outcomes' maturity
    table, downloads = market_data.price_table(symbols, start, end, now)
    outcomes = outcome_rows(calls, table, now, horizon, cost)
    outcomes = pd.concat([outcomes, look_ahead_flags(outcomes, warehouse.read_all("policy_training"))], axis=1)[
        ROLLOUT_OUTCOME_COLUMNS
    ]
    warehouse.write("rollout_outcomes", outcomes, partition=day)
    yield dg.MaterializeResult(
        metadata={
            **outcome_metadata(outcomes),
            "horizon_sessions": horizon,
            "cost_bps": cost,
            "market_data": market_data.describe(),
            "downloads": downloads,
        }
    )
    bad = closes_off_the_data(outcomes, table)
    yield dg.AssetCheckResult(
        check_name="no_invented_prices", passed=not bad, metadata={"rows": "; ".join(bad[:20]) or "none"}
    )


def outcome_metadata(outcomes: pd.DataFrame) -> dict:
    """Counts by status and, per source, the matured calls' hit rate and mean vs_spy_pct."""
    meta: dict = {"dagster/row_count": len(outcomes)}
    for status in ("matured", "pending", "no_data", "no_call"):
        meta[f"n_{status}"] = int((outcomes["status"] == status).sum())
    for source in ("policy", "base"):
        matured = outcomes[(outcomes["source"] == source) & (outcomes["status"] == "matured")]
        if len(matured):  # left out when nothing matured (a NaN breaks the plots)
            meta[f"{source}_hit_rate"] = round(float((matured["vs_spy_pct"] > 0).mean()), 4)
            meta[f"{source}_mean_vs_spy_pct"] = round(float(matured["vs_spy_pct"].mean()), 4)
    meta["n_look_ahead"] = int(outcomes["look_ahead"].sum()) if "look_ahead" in outcomes else 0
    pending = outcomes[outcomes["status"] == "pending"]
    meta["earliest_pending_exit_close"] = str(pending["exit_close_utc"].dropna().min()) if len(pending) else "none"
    reasons = outcomes.loc[outcomes["status"].isin(["no_data", "no_call"]), "reason"].fillna("").value_counts().head(10)
    meta["no_call_or_data_reasons"] = dg.MetadataValue.md(
        "| reason | notes |\n| --- | --- |\n" + "".join(f"| {k} | {int(v)} |\n" for k, v in reasons.items())
        if len(reasons)
        else "none"
    )
    return meta
