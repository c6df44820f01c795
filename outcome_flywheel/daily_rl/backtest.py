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

Summary statistics: the mean daily excess (policy - base, policy - SPY) with a seeded bootstrap 95% interval
(`scipy.stats.bootstrap`, BCa, percentile when BCa is degenerate); fewer than 3 days -> NaN interval and
"not enough data"; a zero-spread series (e.g. identical books) gets a zero-width interval and "no detectable edge".
"""

from __future__ import annotations

import inspect
import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import stats

from .ab_stats import zero_spread

SOURCES = ("policy", "base")
BOOK_COLUMNS = ["date", "source", "symbol", "weight", "positions", "symbol_return_pct"]
DAILY_COLUMNS = [
    "date", "entry_date", "exit_date", "policy_return_pct", "base_return_pct", "spy_return_pct", "policy_turnover",
    "base_turnover", "policy_positions", "base_positions", "excess_vs_base_pct", "excess_vs_spy_pct", "policy_equity",
    "base_equity", "spy_equity",
]
EDGE_LABELS = ("policy book better", "no detectable edge", "policy book worse", "not enough data")
MIN_DAYS = 3
TRADING_DAYS = 252


@dataclass
class BacktestResult:
    daily: pd.DataFrame  # one row per counted date, DAILY_COLUMNS
    summary: dict = field(default_factory=dict)


def _headline_position(calls: pd.DataFrame) -> tuple[str, int] | None:
    """(symbol, +1 | -1) of one headline's calls, or None (no calls, or as many longs as shorts on the symbol)."""
    calls = calls.sort_values("rollout_index", kind="stable")
    symbols = calls["symbol"].tolist()
    if not symbols:
        return None
    counts = Counter(symbols)
    top = max(counts.values())
    symbol = next(s for s in symbols if counts[s] == top)  # first in rollout_index order among the modal ones
    sides = calls.loc[calls["symbol"] == symbol, "side"]
    net = int((sides == "long").sum()) - int((sides == "short").sum())
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
    votes = _votes(outcomes)
    rows = []
    for (date, source), day in votes.groupby(["date", "source"], sort=True):
        picks = [p for _, g in day.groupby("headline_id", sort=True) if (p := _headline_position(g)) is not None]
        if not picks:
            continue
        n = len(picks)
        weights: dict[str, float] = {}
        for symbol, sign in picks:
            weights[symbol] = weights.get(symbol, 0.0) + sign / n
        rets = pd.to_numeric(day["symbol_return_pct"]).groupby(day["symbol"]).mean()
        for symbol, w in weights.items():
            rows.append(dict(date=date, source=source, symbol=symbol, weight=float(w), positions=n,
                             symbol_return_pct=float(rets[symbol])))
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


def bootstrap_mean_ci(values, n_resamples: int = 10_000, seed: int = 0, confidence: float = 0.95
                      ) -> tuple[float, float, str]:
    """Bootstrap interval of the mean: (low, high, method). Fewer than 3 values -> NaN; zero spread -> the mean."""
    x = np.asarray(values, dtype=float)
    x = x[~np.isnan(x)]
    if x.size < MIN_DAYS:
        return math.nan, math.nan, "none (fewer than 3 days)"
    if zero_spread(x):
        return float(x.mean()), float(x.mean()), "none (zero spread: interval at the mean)"
    kw = "rng" if "rng" in inspect.signature(stats.bootstrap).parameters else "random_state"
    for method in ("BCa", "percentile"):
        res = stats.bootstrap((x,), np.mean, n_resamples=n_resamples, confidence_level=confidence, method=method,
                              **{kw: np.random.default_rng(seed)})
        low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
        if math.isfinite(low) and math.isfinite(high):
            return low, high, f"scipy.stats.bootstrap {method} of the mean daily excess"
    return math.nan, math.nan, "bootstrap failed"


def edge_label(ci_low: float, ci_high: float, days: int, degenerate: bool = False) -> str:
    """"policy book better" (interval above 0) / "policy book worse" (below) / "no detectable edge" (covers 0,
    or zero spread) / "not enough data" (fewer than 3 days or a NaN interval)."""
    if days < MIN_DAYS or not (math.isfinite(ci_low) and math.isfinite(ci_high)):
        return EDGE_LABELS[3]
    if degenerate:
        return EDGE_LABELS[1]
    if ci_low > 0:
        return EDGE_LABELS[0]
    if ci_high < 0:
        return EDGE_LABELS[2]
    return EDGE_LABELS[1]


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


def run_backtest(outcomes: pd.DataFrame, cost_bps_per_turnover: float = 10.0, n_resamples: int = 10_000,
                 seed: int = 0) -> BacktestResult:
    """Daily books of both sources, their net returns, SPY's over the same windows, equity curves and a summary."""
    outcomes = by_entry_session(outcomes)
    books = daily_books(outcomes)
    dates = counted_dates(outcomes) if len(outcomes) else []
    prev: dict[str, dict[str, float]] = {s: {} for s in SOURCES}
    rows = []
    for date in dates:
        day = outcomes[outcomes["date"] == date]
        matured = day[day["status"] == "matured"]
        row = dict(date=date, entry_date=_first(matured["entry_date"]), exit_date=_first(matured["exit_date"]),
                   spy_return_pct=float(pd.to_numeric(matured["spy_return_pct"], errors="coerce").mean()))
        for s in SOURCES:
            b = books[(books["date"] == date) & (books["source"] == s)]
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
    return BacktestResult(daily=daily, summary=_summary(outcomes, daily, cost_bps_per_turnover, n_resamples, seed))


def _horizon(outcomes: pd.DataFrame) -> int:
    if "horizon_sessions" not in outcomes or outcomes.empty:
        return 1
    h = pd.to_numeric(outcomes.loc[outcomes["status"] == "matured", "horizon_sessions"], errors="coerce").dropna()
    return int(h.mode().iloc[0]) if len(h) else 1


def _summary(outcomes: pd.DataFrame, daily: pd.DataFrame, cost_bps: float, n_resamples: int, seed: int) -> dict:
    days = int(len(daily))
    horizon = _horizon(outcomes)
    out: dict = dict(days=days, horizon_sessions=horizon, cost_bps_per_turnover=float(cost_bps),
                     sharpe_annualisation=f"sqrt(252 / {horizon})")
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
        low, high, method = bootstrap_mean_ci(x, n_resamples, seed)
        flat = x.size >= MIN_DAYS and zero_spread(x)
        out[f"mean_excess_vs_{name}_pct"] = float(x.mean()) if days else math.nan
        out[f"excess_vs_{name}_ci_low"], out[f"excess_vs_{name}_ci_high"] = low, high
        out[f"label_vs_{name}"] = edge_label(low, high, days, degenerate=flat)
        methods.append(f"vs {name}: {method}")
    out.update(bootstrap_method="; ".join(methods), confidence=0.95, n_resamples=int(n_resamples), seed=int(seed))
    return out
