"""`backtest`: the policy's and the base's calls as daily long/short books, against each other and SPY."""

import base64
import math

import dagster as dg
import pandas as pd

from assets.catalog import OWNERS, TABLE_KINDS, table_metadata
from assets.daily_rl.policy_eval import LookAheadConfig
from assets.partitions import daily_rl_partitions
from outcome_flywheel.daily_rl.evaluation.backtest import DAILY_COLUMNS, run_backtest
from outcome_flywheel.daily_rl.evaluation.look_ahead import look_ahead_days, without_days
from outcome_flywheel.daily_rl.notes.outcomes import call_window
from outcome_flywheel.daily_rl.report.charts import equity_figure
from outcome_flywheel.storage import Warehouse, atomic_write_bytes

SUMMARY_TABLE = "backtest_summary"
BOOK_COLUMNS = DAILY_COLUMNS + ["look_ahead"]


@dg.asset(
    partitions_def=daily_rl_partitions,
    group_name="daily_rl",
    deps=["rollout_outcomes", "policy_eval"],
    pool="duckdb",
    kinds=TABLE_KINDS,
    owners=OWNERS,
    metadata=table_metadata("backtest", BOOK_COLUMNS),
)
def backtest(context: dg.AssetExecutionContext, config: LookAheadConfig, warehouse: dg.ResourceParam[Warehouse]):
    """Over every matured day up to D: for each policy (the trained one, the base) a daily long/short
    book that follows its calls (per headline, the symbol and side its notes vote for; equal weight per
    headline), 10 bps per unit of turnover, against the other book and SPY: equity curves, mean daily
    excess with a 95% t-interval over the books (overlap-robust for books held h > 1 sessions; "not enough
    data" below 10 x h books), hit rate (days > 0), Sharpe, max drawdown. When the interval covers zero
    the label says there is no detectable edge. A book is one entry session (a
    Friday's, Saturday's and Sunday's notes all enter at Monday's close: one book). Table `backtest` holds
    one row per book, stored under its entry session (every book up to D is rewritten, so a weekend's
    days fill Monday's book in turn and nothing is duplicated); `backtest_summary` the figures up to D.
    Days whose policy notes are look-ahead (trained on headlines after the notes' day; rule in
    outcome_flywheel.daily_rl.evaluation.look_ahead) are left out, both books, unless run config
    `include_look_ahead` (then their books are flagged `look_ahead`); a book left with no day is removed."""
    day = context.partition_key
    outcomes = warehouse.read_all("rollout_outcomes")
    outcomes = outcomes[outcomes["date"] <= day] if len(outcomes) else outcomes
    flagged = look_ahead_days(outcomes, warehouse.read_all("policy_training"))
    used = outcomes if config.include_look_ahead else without_days(outcomes, flagged)
    result = run_backtest(used) if len(used) else run_backtest(pd.DataFrame(columns=["date", "source", "status"]))
    kept_flagged = used[used["date"].isin(set(flagged))] if len(used) else used  # only when included
    daily = result.daily.assign(
        look_ahead=lambda d: d["date"].isin(set(kept_flagged.get("entry_date", pd.Series(dtype=str)).dropna()))
    )
    for session, book in daily.groupby("date", sort=True):  # keyed by entry session, not by D (see above)
        warehouse.write("backtest", book[BOOK_COLUMNS].reset_index(drop=True), partition=session)
    last_book = call_window(day).entry_date  # every book up to D's is rewritten: a book no day is left in goes
    for session in set(warehouse.partitions("backtest")) - set(daily["date"]):
        if session <= last_book:
            warehouse.delete("backtest", session)
    summary = {
        "date": day,
        **result.summary,
        "look_ahead_days": len(flagged),
        "look_ahead_included": bool(config.include_look_ahead),
    }
    warehouse.write(SUMMARY_TABLE, pd.DataFrame([summary]), partition=day)
    png = equity_figure(daily)
    atomic_write_bytes(warehouse.path("reports", "daily_rl", day) / "equity.png", png)
    numbers = {
        k: round(float(v), 4)
        for k, v in result.summary.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))
    }
    return dg.MaterializeResult(
        metadata={
            **numbers,
            "label_vs_base": str(result.summary.get("label_vs_base")),
            "label_vs_spy": str(result.summary.get("label_vs_spy")),
            "interval": str(result.summary.get("interval_method")),
            "equity": dg.MetadataValue.md(
                f"![Back-test equity](data:image/png;base64,{base64.b64encode(png).decode()})"
            ),
        }
    )
