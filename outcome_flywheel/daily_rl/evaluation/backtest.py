"""Back-test of the trade calls of the trained policy and of its base model (plain Python, no Dagster).

Each source ("policy", "base") runs a daily long/short book that follows its own calls. A book is one entry
session: every prediction day whose calls enter at that close joins it (a Friday's, Saturday's and Sunday's notes
all enter at Monday's close, so they make Monday's book, each headline of each day voting once); `date` below is
that session (`run_backtest` rekeys the outcome rows so; `daily_books` and `counted_dates` take rows as given):

* Vote. For each (date, source, headline_id) the notes' matured calls with side long/short vote. The headline's
  position is on the modal symbol among those calls (a tie between symbols goes to the one called first in
  rollout_index order); its side is the sign of (#long - #short) among the calls on that symbol; zero -> no
  position for that headline.
* Weights. Equal weight per headline with a position: w = +-1/n_positions on that day (gross exposure 1). Two
  headlines on the same symbol net out (a long and a short cancel: that symbol's weight is 0, exposure < 1).
* Holding. The book of day D is held from its entry close to its exit close (the outcome rows' entry_date and
  exit_date; all rows of a day share them). Gross return = sum_i w_i * symbol_return_i (unsigned symbol returns).
  With horizon 1 consecutive books meet exactly (day D's exit close is day D+1's entry close) and the series is a
  plain daily return series. With horizon h > 1 the books overlap (day D's book is still open when day D+1's is
  entered): the series is a sequence of overlapping h-session books, not a tradable compounding account, and the
  Sharpe ratio is annualised with sqrt(252 / h).
* Cost. cost_bps_per_turnover (default 10) bps x turnover, turnover = sum over symbols |w_D - w_prev|, w_prev the
  previous counted day's book of the same source. The first book pays its entry; a day with no positions is a flat
  book (return 0) that still pays the turnover of closing the previous one.
* Benchmark. SPY's return over the same window (the mean spy_return_pct of the day's matured rows).

Which dates count: a date counts when at least one source has a matured row on it and each source is either
*matured* (has matured rows; its pending rows, if any, do not vote) or *flat* (it has rows, none matured or pending:
only no_call / no_data, so it holds nothing). A source with pending rows and no matured row, or with no rows at all,
makes its book unknown and the date is left out (not counted as a zero); so is a date with only pending rows.

Summary statistics: the mean daily excess (policy - base, policy - SPY) with a 95% t-interval over the books
(`ab_stats.session_mean_interval`: books are entry sessions, which ride one market move each, so the book is the
unit; with h-session books the interval is the overlap-robust bound over the h non-overlapping sub-series), its
p-value and a label read off that interval. Fewer than `MIN_SESSIONS` x h books -> NaN interval and "not enough data"
(a bootstrap of a handful of days undercovers badly: 29% false labels at 3 days). A zero-spread series (e.g.
identical books) gets a zero-width interval at the mean and "no detectable edge" when that mean is 0.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .ab_stats import LABELS, MIN_SESSIONS, label_for, session_mean_interval

SOURCES = ("policy", "base")
BOOK_COLUMNS = ["date", "source", "symbol", "weight", "positions", "symbol_return_pct"]
DAILY_COLUMNS = [
    "date",
    "entry_date",
    "exit_date",
    "policy_return_pct",
    "base_return_pct",
    "spy_return_pct",
    "policy_turnover",
    "base_turnover",
    "policy_positions",
    "base_positions",
    "excess_vs_base_pct",
    "excess_vs_spy_pct",
    "policy_equity",
    "base_equity",
    "spy_equity",
]
EDGE_LABELS = ("policy book better", "no detectable edge", "policy book worse", "not enough data")
EDGE_WORDS = dict(zip(LABELS, EDGE_LABELS))  # ab_stats' label -> the back-test's words
TRADING_DAYS = 252


@dataclass
class BacktestResult:
    daily: pd.DataFrame  # one row per counted date, DAILY_COLUMNS
    summary: dict = field(default_factory=dict)


def _headline_position(calls: list[tuple[str, str]]) -> tuple[str, int] | None:
    """(symbol, +1 | -1) of one headline's (symbol, side) calls in rollout_index order, or None (no calls, or as
    many longs as shorts on the symbol)."""
    if not calls:
        return None
    counts = Counter(symbol for symbol, _ in calls)
    top = max(counts.values())
    symbol = next(s for s, _ in calls if counts[s] == top)  # first in rollout_index order among the modal ones
    net = sum({"long": 1, "short": -1}.get(side, 0) for s, side in calls if s == symbol)
    return (symbol, 1 if net > 0 else -1) if net else None


def _votes(outcomes: pd.DataFrame) -> pd.DataFrame:
    """The matured long/short calls with a symbol and a symbol return: the ones that vote."""
    o = outcomes
    m = (o["status"] == "matured") & o["side"].isin(["long", "short"]) & o["symbol"].notna()
    m &= pd.to_numeric(o["symbol_return_pct"], errors="coerce").notna()
    return o[m]


def daily_books(outcomes: pd.DataFrame) -> pd.DataFrame:
    """Per (date, source, symbol): the book's weight (netted over headlines), `positions` (the number of headlines
    with a position that day, the same on every row of the (date, source)) and the symbol's return over the
    window (mean of its matured rows). Matured rows only; a (date, source) with no position has no row. A symbol
    whose headlines net out keeps a row with weight 0."""
    votes = _votes(outcomes).sort_values(["date", "source", "headline_id", "rollout_index"], kind="stable")
    rows = []
    for (date, source), day in votes.groupby(["date", "source"], sort=True):
        calls: dict[str, list[tuple[str, str]]] = {}  # plain lists: a pandas group per headline is slow
        for headline, symbol, side in zip(day["headline_id"], day["symbol"], day["side"]):
            calls.setdefault(headline, []).append((symbol, side))
        picks = [p for h in sorted(calls) if (p := _headline_position(calls[h])) is not None]
        if not picks:
            continue
        n = len(picks)
        weights: dict[str, float] = {}
        for symbol, sign in picks:
            weights[symbol] = weights.get(symbol, 0.0) + sign / n
        rets = pd.to_numeric(day["symbol_return_pct"]).groupby(day["symbol"]).mean()
        for symbol, w in weights.items():
            rows.append(
                dict(
                    date=date,
                    source=source,
                    symbol=symbol,
                    weight=float(w),
                    positions=n,
                    symbol_return_pct=float(rets[symbol]),
                )
            )
    return pd.DataFrame(rows, columns=BOOK_COLUMNS)


def counted_dates(outcomes: pd.DataFrame) -> list:
    """The dates that enter the back-test (see the module docstring), sorted."""
    out = []
    for date, day in outcomes.groupby("date", sort=True):
        states = []
        for s in SOURCES:
            st = day.loc[day["source"] == s, "status"]
            if (st == "matured").any():
                states.append("matured")
            elif len(st) and not (st == "pending").any():
                states.append("flat")
            else:
                states.append("unknown")
        if "unknown" not in states and "matured" in states:
            out.append(date)
    return out


def _first(values: pd.Series):
    v = values.dropna()
    return v.iloc[0] if len(v) else None


def sharpe(returns_pct, horizon: int = 1) -> float:
    """Annualised Sharpe ratio of a per-book return series: mean / std (ddof 1) * sqrt(252 / horizon). NaN with
    fewer than 2 values or zero spread."""
    r = np.asarray(returns_pct, dtype=float)
    r = r[~np.isnan(r)]
    if r.size < 2:
        return math.nan
    sd = float(r.std(ddof=1))
    return float(r.mean() / sd * math.sqrt(TRADING_DAYS / horizon)) if sd > 0 else math.nan


def max_drawdown_pct(returns_pct) -> float:
    """Largest fall from a running peak of the compounded equity (starting at 1.0), in percent (>= 0)."""
    r = np.asarray(returns_pct, dtype=float)
    if r.size == 0:
        return math.nan
    equity = np.concatenate([[1.0], np.cumprod(1.0 + r / 100.0)])
    peak = np.maximum.accumulate(equity)
    return float(100.0 * np.max(1.0 - equity / peak))


def edge_label(ci_low: float, ci_high: float) -> str:
    """The back-test's words for `ab_stats.label_for` of the interval (the one place labels are read): "policy book
    better" (interval above 0) / "policy book worse" (below) / "no detectable edge" (covers 0) / "not enough data"
    (a NaN interval: too few books)."""
    return EDGE_WORDS[label_for(ci_low, ci_high)]


def by_entry_session(outcomes: pd.DataFrame) -> pd.DataFrame:
    """Rows keyed by their book: `date` = the entry session (the prediction day where there is none), and
    `headline_id` = prediction day | headline, so each day's headline still votes on its own. Without this a
    weekend's three prediction days would be three books over the same Monday-to-Tuesday window, counted thrice."""
    if outcomes.empty or "entry_date" not in outcomes.columns:
        return outcomes
    out = outcomes.copy()
    out["headline_id"] = out["date"].astype(str) + "|" + out["headline_id"].astype(str)
    entry = out["entry_date"].astype("string")
    out["date"] = entry.where(entry.notna() & (entry != ""), out["date"].astype("string")).astype(str)
    return out


def run_backtest(outcomes: pd.DataFrame, cost_bps_per_turnover: float = 10.0) -> BacktestResult:
    """Daily books of both sources, their net returns, SPY's over the same windows, equity curves and a summary."""
    outcomes = by_entry_session(outcomes)
    books = daily_books(outcomes)
    dates = counted_dates(outcomes) if len(outcomes) else []
    prev: dict[str, dict[str, float]] = {s: {} for s in SOURCES}
    rows = []
    matured_by_date = dict(tuple(outcomes[outcomes["status"] == "matured"].groupby("date"))) if dates else {}
    books_by = {key: b for key, b in books.groupby(["date", "source"])}
    for date in dates:
        matured = matured_by_date[date]
        row = dict(
            date=date,
            entry_date=_first(matured["entry_date"]),
            exit_date=_first(matured["exit_date"]),
            spy_return_pct=float(pd.to_numeric(matured["spy_return_pct"], errors="coerce").mean()),
        )
        for s in SOURCES:
            b = books_by.get((date, s), books.iloc[0:0])
            w = dict(zip(b["symbol"], b["weight"]))
            gross = float(sum(b["weight"] * b["symbol_return_pct"]))
            turnover = float(sum(abs(w.get(k, 0.0) - prev[s].get(k, 0.0)) for k in set(w) | set(prev[s])))
            row[f"{s}_return_pct"] = gross - cost_bps_per_turnover / 100.0 * turnover  # bps -> percent
            row[f"{s}_turnover"] = turnover
            row[f"{s}_positions"] = int(b["positions"].iloc[0]) if len(b) else 0
            prev[s] = w
        rows.append(row)
    daily = pd.DataFrame(rows, columns=DAILY_COLUMNS[:10])  # up to base_positions; the rest is derived below
    daily["excess_vs_base_pct"] = daily["policy_return_pct"] - daily["base_return_pct"]
    daily["excess_vs_spy_pct"] = daily["policy_return_pct"] - daily["spy_return_pct"]
    for s in (*SOURCES, "spy"):
        daily[f"{s}_equity"] = (1.0 + daily[f"{s}_return_pct"].astype(float) / 100.0).cumprod()
    daily = daily[DAILY_COLUMNS].reset_index(drop=True)
    return BacktestResult(daily=daily, summary=_summary(outcomes, daily, cost_bps_per_turnover))


def _horizon(outcomes: pd.DataFrame) -> int:
    if "horizon_sessions" not in outcomes or outcomes.empty:
        return 1
    h = pd.to_numeric(outcomes.loc[outcomes["status"] == "matured", "horizon_sessions"], errors="coerce").dropna()
    return int(h.mode().iloc[0]) if len(h) else 1


def _summary(outcomes: pd.DataFrame, daily: pd.DataFrame, cost_bps: float) -> dict:
    days = int(len(daily))
    horizon = _horizon(outcomes)
    out: dict = dict(
        days=days,
        horizon_sessions=horizon,
        cost_bps_per_turnover=float(cost_bps),
        sharpe_annualisation=f"sqrt(252 / {horizon})",
    )
    for s in (*SOURCES, "spy"):
        r = daily[f"{s}_return_pct"].astype(float)
        out[f"{s}_mean_return_pct"] = float(r.mean()) if days else math.nan
        out[f"{s}_hit_rate"] = float((r > 0).mean()) if days else math.nan
        out[f"{s}_sharpe"] = sharpe(r, horizon)
        out[f"{s}_max_drawdown_pct"] = max_drawdown_pct(r)
        out[f"{s}_total_return_pct"] = float(100.0 * (daily[f"{s}_equity"].iloc[-1] - 1.0)) if days else math.nan
    methods = []
    for name in ("base", "spy"):
        x = daily[f"excess_vs_{name}_pct"].astype(float).to_numpy()
        low, high, p, method = session_mean_interval(x, horizon)
        out[f"mean_excess_vs_{name}_pct"] = float(x.mean()) if days else math.nan
        out[f"excess_vs_{name}_ci_low"], out[f"excess_vs_{name}_ci_high"] = low, high
        out[f"excess_vs_{name}_p_value"] = p
        out[f"label_vs_{name}"] = edge_label(low, high)
        methods.append(f"vs {name}: {method}")
    out.update(interval_method="; ".join(methods), confidence=0.95, min_books=MIN_SESSIONS * horizon)
    return out
