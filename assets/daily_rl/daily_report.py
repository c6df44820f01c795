"""`daily_report`: the loop's per-day numbers and its figures (reward, KL, pass-through, policy vs base,
back-test, hit rate over days, the delayed price step)."""

import base64
import math

import dagster as dg
import pandas as pd

from assets.catalog import OWNERS, TABLE_KINDS, table_metadata
from assets.partitions import daily_rl_partitions
from assets.tracking_links import link_metadata
from outcome_flywheel.daily_rl.notes.outcomes import call_window
from outcome_flywheel.daily_rl.report.charts import (
    FIGURES,
    ab_figure,
    equity_figure,
    hit_rate_figure,
    off_policy_figure,
    price_reward_figure,
)
from outcome_flywheel.daily_rl.report.summary import (
    OVER_DAYS_COLUMNS,
    SUMMARY_COLUMNS,
    day_summary,
    hit_rate_by_day,
    over_days,
    prices_note,
)
from outcome_flywheel.market_data import BUNDLED_PRICES, MarketData
from outcome_flywheel.settings import resolve_path
from outcome_flywheel.storage import Warehouse, atomic_write_bytes
from outcome_flywheel.tracking import Tracker
from outcome_flywheel.tracking.records import numbers, record_figures

# Columns of the short table in the report (the last REPORT_DAYS days up to D), with their headers.
REPORT_COLUMNS = {
    "date": "day",
    "headlines": "headlines",
    "rollouts": "rollouts",
    "mean_structure": "structure",
    "usable_share": "pass-through",
    "reward_avg": "reward",
    "steps": "steps",
    "loss": "loss",
    "kl_to_base": "KL",
    "gate": "gate",
}
REPORT_DAYS = 7
FIGURE_TITLES = {
    "reward": "Reward and structure",
    "kl": "KL to the base model",
    "pass_through": "Judge pass-through",
    "ab": "Policy vs base",
    "equity": "Back-test equity",
    "hit_rate": "Hit rate of each day's calls, policy vs base",
    "price": "Price reward per training day",
    "off_policy": "Staleness and truncated IS ratio of the price step, clip fraction of the update",
}


@dg.asset(
    partitions_def=daily_rl_partitions,
    group_name="daily_rl",
    deps=["rollout_scores", "policy_checkpoint", "rollouts", "policy_eval", "backtest"],
    pool="duckdb",
    kinds=TABLE_KINDS,
    owners=OWNERS,
    metadata=table_metadata("daily_report", SUMMARY_COLUMNS),
)
def daily_report(
    context: dg.AssetExecutionContext,
    warehouse: dg.ResourceParam[Warehouse],
    market_data: dg.ResourceParam[MarketData],
    tracking: dg.ResourceParam[Tracker],
):
    """Day D's headlines, rollouts, pass-through (usable share), mean structure score, reward
    n/avg/min/max/negatives, training summary and the evaluation gate's verdict (table `daily_report`,
    one row per day); D's A/B against the base (`policy_eval`) and the back-test up to D (`backtest`);
    figures over every reported day up to D: reward curve, KL to base, pass-through, policy-vs-base
    intervals, back-test equity, the hit rate of each day's calls (policy vs base), and the delayed price
    step per training day (`price_training`: mean price reward, staleness, clip fraction, truncated IS
    ratio), with a table of those numbers and a line on which prices the outcomes come from. The `report`
    entry shows them inline; the PNGs are also written under reports/daily_rl/D/."""
    day = context.partition_key
    row = day_summary(
        day,
        warehouse.read("headlines", day),
        warehouse.read("rollouts", day),
        warehouse.read("rollout_scores", day),
        warehouse.read("policy_training", day),
    )
    warehouse.write("daily_report", pd.DataFrame([row], columns=SUMMARY_COLUMNS), partition=day)
    history = warehouse.read_all("daily_report")
    history = history[history["date"] <= day].sort_values("date").reset_index(drop=True)

    folder = warehouse.path("reports", "daily_rl", day)
    evals = warehouse.read_all("policy_eval")
    evals = evals[evals["date"] <= day] if len(evals) else evals
    backtest_daily = warehouse.read_all("backtest")
    # books are keyed by entry session: D's calls enter at the first session after D
    backtest_daily = (
        backtest_daily[backtest_daily["date"] <= call_window(day).entry_date] if len(backtest_daily) else backtest_daily
    )
    outcomes = warehouse.read_all("rollout_outcomes")
    hit_rates = hit_rate_by_day(outcomes[outcomes["date"] <= day] if len(outcomes) else outcomes)
    price = warehouse.read_all("price_training")  # written by daily_update's delayed price step
    price = price[price["date"] <= day] if len(price) else price
    makers = {
        **FIGURES,
        "ab": lambda _: ab_figure(evals),
        "equity": lambda _: equity_figure(backtest_daily),
        "hit_rate": lambda _: hit_rate_figure(hit_rates),
        "price": lambda _: price_reward_figure(price),
        "off_policy": lambda _: off_policy_figure(price),
    }
    figures = {}
    for name, make in makers.items():
        png = make(history)
        atomic_write_bytes(folder / f"{name}.png", png)
        figures[name] = png
    evaluation = evaluation_markdown(warehouse.read("policy_eval", day), warehouse.read("backtest_summary", day))
    bundled = market_data.source == "file" and resolve_path(market_data.prices_file) == BUNDLED_PRICES
    prices = prices_note(market_data.source, str(resolve_path(market_data.prices_file)), str(BUNDLED_PRICES))
    evaluation = "\n\n".join(p for p in (prices, over_days_markdown(over_days(price, hit_rates)), evaluation) if p)
    metadata: dict = {"report": dg.MetadataValue.md(report_markdown(day, history, figures, evaluation))}
    metadata["bundled_real_prices"] = bundled
    metadata.update(numeric_metadata(row))
    metadata["policy_version"] = row["policy_version"]
    metadata["gate"] = row["gate"] or "n/a"
    metadata["days_reported"] = len(history)
    metadata["figures_dir"] = dg.MetadataValue.path(str(folder))
    # the day's figures, the A/B's and back-test's with their intervals, and the charts: a run of the daily_rl experiment
    links = record_figures(
        tracking,
        "daily_rl",
        f"daily_report {day}",
        {
            "partition": day,
            "dagster_run_id": context.run_id,
            "asset_key": "daily_report",
            "policy_version": row["policy_version"],
        },
        {
            **numbers(row, "day"),
            **numbers(first_row(warehouse.read("policy_eval", day)), "ab"),
            **numbers(first_row(warehouse.read("backtest_summary", day)), "backtest"),
        },
        [folder / f"{name}.png" for name in figures],
        context.log.warning,
    )
    metadata.update(link_metadata(links))
    return dg.MaterializeResult(metadata=metadata)


def first_row(frame: pd.DataFrame) -> dict:
    return frame.iloc[0].to_dict() if len(frame) else {}


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


def over_days_markdown(frame: pd.DataFrame) -> str:
    """The last REPORT_DAYS days of the price step and of the calls' hit rate, as a table (– where a day has none)."""
    if frame.empty:
        return ""
    recent = frame.tail(REPORT_DAYS)
    header = "| " + " | ".join(OVER_DAYS_COLUMNS.values()) + " |\n|" + " --- |" * len(OVER_DAYS_COLUMNS) + "\n"
    rows = "".join("| " + " | ".join(_cell(r[c], c) for c in OVER_DAYS_COLUMNS) + " |\n" for _, r in recent.iterrows())
    return (
        "**Over days**: the price step of each training day (mean price reward of the notes it trained on price, "
        "staleness in policy updates, GSPO clip fraction of the day's update, share of IS ratios truncated at the cap) and the hit rate "
        "of each day's matured calls (a plain share; the A/B below pools sessions and gives the interval).\n\n"
        + header
        + rows
    )


def evaluation_markdown(evals: pd.DataFrame, summary: pd.DataFrame) -> str:
    """D's A/B labels and the back-test's figures up to D, as text beside the figures."""
    parts = []
    if len(evals):
        rows = "".join(
            f"| {r.metric} | {_cell(r.policy, '')} | {_cell(r.base, '')} | [{_cell(r.ci_low, '')}, {_cell(r.ci_high, '')}] | **{r.label}** | {r.status} |\n"
            for r in evals.itertuples(index=False)
        )
        parts.append(
            "**Policy vs base on D's headlines** (interval of policy - base; judge: of the win rate)\n\n"
            "| metric | policy | base | 95% interval | label | status |\n| --- | --- | --- | --- | --- | --- |\n" + rows
        )
        flagged = sorted({d for d in evals.get("look_ahead_days", pd.Series(dtype=str)).dropna() if d})
        if flagged:  # a policy trained on headlines after its notes' day
            parts.append("**Look-ahead notes** in the A/B's inputs: " + "; ".join(flagged))
    if len(summary):
        s = summary.iloc[0]
        parts.append(
            f"**Back-test over {int(s['days'])} matured day(s)**: policy book {_cell(s['policy_total_return_pct'], '')}% vs base "
            f"{_cell(s['base_total_return_pct'], '')}% vs SPY {_cell(s['spy_total_return_pct'], '')}% (net of "
            f"{_cell(float(s['cost_bps_per_turnover']), '')} bps per unit of turnover); mean daily excess over the base "
            f"{_cell(s['mean_excess_vs_base_pct'], '')} pp [{_cell(s['excess_vs_base_ci_low'], '')}, {_cell(s['excess_vs_base_ci_high'], '')}]: "
            f"**{s['label_vs_base']}**; over SPY: **{s['label_vs_spy']}**; Sharpe policy {_cell(s['policy_sharpe'], '')}, "
            f"base {_cell(s['base_sharpe'], '')}; max drawdown policy {_cell(s['policy_max_drawdown_pct'], '')}%."
        )
        look_ahead = int(s.get("look_ahead_days", 0) or 0)
        if look_ahead:
            parts.append(
                f"**Look-ahead**: {look_ahead} day(s) whose policy was trained on later headlines "
                f"{'included (run config include_look_ahead)' if s.get('look_ahead_included') else 'left out of the back-test'}."
            )
    return "\n\n".join(parts)


def report_markdown(day: str, history: pd.DataFrame, figures: dict[str, bytes], evaluation: str = "") -> str:
    """One markdown entry: the last days' numbers, the A/B and back-test, then each figure as an inline PNG (data URI)."""
    recent = history.tail(REPORT_DAYS)
    header = "| " + " | ".join(REPORT_COLUMNS.values()) + " |\n|" + " --- |" * len(REPORT_COLUMNS) + "\n"
    rows = "".join("| " + " | ".join(_cell(r[c], c) for c in REPORT_COLUMNS) + " |\n" for _, r in recent.iterrows())
    parts = [
        f"**Daily loop up to {day}** ({len(history)} day{'s' if len(history) != 1 else ''} reported; "
        f"the last {len(recent)} below). Pass-through = share of yesterday's notes the judge ranked; reward in [0, 1]; "
        "KL to the base in nats per token.",
        header + rows,
    ]
    if evaluation:
        parts.append(evaluation)
    for name, png in figures.items():  # each figure carries its own title
        parts.append(f"![{FIGURE_TITLES.get(name, name)}](data:image/png;base64,{base64.b64encode(png).decode()})")
    return "\n\n".join(parts)


COUNT_COLUMNS = {"price_notes_trained", "price_notes_waiting", "policy_calls", "staleness_max"}  # floats after a merge


def _cell(value, column: str) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "–"
        if column in COUNT_COLUMNS:
            return str(int(round(value)))
        return f"{value:.3g}" if column in ("loss", "kl_to_base") else f"{value:.3f}"
    return str(value)
