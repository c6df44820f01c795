"""Do the A/B's labels hold their level? False "better"/"worse" rates under the null, and the power.

Each run simulates the policy and the base with no true difference: both draw their calls from one distribution (a
few symbols, the headline's own company half the time, sides that persist from day to day as stories do), on the
bundled closes (a random stretch of sessions) or on random walks (zero drift, a market factor, fat tails), with
books held 1 or 5 sessions, over 3 to 60 days. The real code labels them: `evaluation.ab.evaluate_day` (structure
score, judge win rate, hit rate, mean vs_spy_pct) and `evaluation.backtest.run_backtest` (mean daily excess vs the base, and vs
SPY on the random walks, where SPY has no drift and costs are 0 so policy vs SPY is a null too), and the share of calls
on the headline's company (each headline's title names its topic's ticker; each note's text states its call, as
"Trade Recommendation: Buy AAPL.", and `evaluation.ab.with_relevance` reads it back). The printed rate is
the share of runs labelled "better" or "worse"; at the nominal 5% it should be <= 0.05 (<= 0.06 allowing for
simulation error); "when labelled" is the same share among the runs that had enough data for a verdict. The power:
the same with a planted edge (the symbols the policy nets long rise `--edge` pp a session more than they would, those
it nets short fall as much; the base sees the same prices), over 40 days.

    python -m benchmarks.ab_calibration [--runs 960] [--power-runs 200] [--edge 0.3] [--seed 0]

The last line is JSON: {"metric": false-label rate, ...}.
"""

from __future__ import annotations

import argparse
import itertools
import time

import numpy as np
import pandas as pd

from benchmarks._results import add_record_argument, finish
from outcome_flywheel.daily_rl.evaluation.ab import evaluate_day
from outcome_flywheel.daily_rl.evaluation.ab_stats import BETTER, NOT_ENOUGH, WORSE
from outcome_flywheel.daily_rl.evaluation.backtest import EDGE_LABELS, run_backtest
from outcome_flywheel.market_data import BUNDLED_PRICES

DAYS = (3, 5, 10, 20, 40, 60)
HORIZONS = (1, 5)
SOURCES = ("bundled", "walk")
HEADLINES, NOTES, UNIVERSE = 12, 4, 4  # per day; a few symbols, as the two-symbols day
METRICS = (
    "structure_score",
    "judge_win_rate",
    "hit_rate",
    "mean_vs_spy_pct",
    "headline_company_share",
    "backtest_vs_base",
    "backtest_vs_spy",
)
# The random walks' symbols: real tickers, so a headline that names one is about a company the alias map knows.
WALK_SYMBOLS = ("AAPL", "MSFT", "NVDA", "JPM", "XOM", "PFE", "INTC", "ORCL")
DECIDED = {BETTER, WORSE, EDGE_LABELS[0], EDGE_LABELS[2]}
ENOUGH_WORDS = {NOT_ENOUGH, EDGE_LABELS[3]}


def bundled_closes() -> pd.DataFrame:
    """Sessions x symbols of the bundled closes (complete rows only)."""
    return pd.read_csv(BUNDLED_PRICES).pivot(index="date", columns="symbol", values="close").dropna().sort_index()


def random_walk(rng: np.random.Generator, sessions: int, symbols: list[str]) -> pd.DataFrame:
    """Zero-drift closes: SPY 1% a session, each stock 0.9 x SPY plus a fat-tailed (t, 4 df) 1.5% of its own."""
    spy = rng.normal(0.0, 0.01, sessions)
    own = rng.standard_t(4, (sessions, len(symbols))) * 0.015 / np.sqrt(2.0)
    logs = np.column_stack([spy, 0.9 * spy[:, None] + own])
    closes = 100.0 * np.exp(np.cumsum(np.vstack([np.zeros(logs.shape[1]), logs]), axis=0))
    dates = [f"s{i:04d}" for i in range(sessions + 1)]
    return pd.DataFrame(closes, index=dates, columns=["SPY", *symbols])


class Caller:
    """One model's calls: per headline a symbol and a side that persist from one day to the next with prob. 0.6."""

    def __init__(self, rng: np.random.Generator, universe: list[str]):
        self.rng, self.universe = rng, universe
        self.state: dict[int, tuple[str, int]] = {}

    def day(self, topics: list[str]) -> list[list[tuple[str | None, int]]]:
        out = []
        for h, topic in enumerate(topics):
            if h not in self.state or self.rng.random() > 0.6:
                symbol = topic if self.rng.random() < 0.5 else str(self.rng.choice(self.universe))
                self.state[h] = (symbol, 1 if self.rng.random() < 0.5 else -1)
            symbol, side = self.state[h]
            notes = []
            for _ in range(NOTES):
                u = self.rng.random()
                if u < 0.1:
                    notes.append((None, 0))  # no call
                else:
                    s = symbol if self.rng.random() < 0.75 else str(self.rng.choice(self.universe))
                    notes.append((s, side if self.rng.random() < 0.8 else -side))
            out.append(notes)
        return out


def simulate(rng: np.random.Generator, closes: pd.DataFrame, days: int, horizon: int, edge: float, cost_bps: float):
    """(rollouts, baseline, outcomes, preferences) of one run: `days` entry sessions from a random start."""
    # multi-letter tickers only: a one-letter one (C, T) is not read as a company in a title
    symbols = [c for c in closes.columns if c not in ("SPY", "QQQ") and len(c) > 1]
    universe = [str(s) for s in rng.choice(symbols, UNIVERSE, replace=False)]
    start = int(rng.integers(0, len(closes) - days - horizon + 1))
    callers = {"policy": Caller(rng, universe), "base": Caller(rng, universe)}
    rows = []
    for i in range(days):
        entry, exit_ = closes.index[start + i], closes.index[start + i + horizon]
        move = 100.0 * (closes.loc[exit_] / closes.loc[entry] - 1.0)
        topics = [str(rng.choice(universe)) for _ in range(HEADLINES)]
        calls = {source: caller.day(topics) for source, caller in callers.items()}
        if edge:  # the planted edge: what the policy nets long rises `edge` pp a session more, what it nets short falls
            net: dict[str, int] = {}
            for notes in calls["policy"]:
                for symbol, side in notes:
                    if symbol:
                        net[symbol] = net.get(symbol, 0) + side
            move = move.copy()
            for symbol, total in net.items():
                move[symbol] += np.sign(total) * edge * horizon
        for source in callers:
            for h, notes in enumerate(calls[source]):
                for k, (symbol, side) in enumerate(notes):
                    row = dict(
                        date=entry,
                        source=source,
                        headline_id=f"h{h}",
                        rollout_index=k,
                        symbol=symbol,
                        side={1: "long", -1: "short"}.get(side, "none"),
                        entry_date=entry,
                        exit_date=exit_,
                        horizon_sessions=horizon,
                        status="matured" if symbol else "no_call",
                    )
                    if symbol:
                        r = float(move[symbol])
                        row.update(
                            symbol_return_pct=r,
                            spy_return_pct=float(move["SPY"]),
                            vs_spy_pct=side * (r - float(move["SPY"])) - cost_bps / 100.0,
                        )
                    rows.append(row)
    outcomes = pd.DataFrame(rows)
    day = closes.index[start + days - 1]
    notes = pd.DataFrame(
        [
            dict(date=day, headline_id=f"h{h}", rollout_index=k, title=headline_title(topic), summary="")
            for h, topic in enumerate(topics)
            for k in range(NOTES)
        ]
    )
    level = np.repeat(rng.uniform(0.3, 0.9, HEADLINES), NOTES)  # a headline's prompt sets both sides' level
    score = lambda: np.clip(np.round(level + rng.normal(0, 0.15, level.size), 1), 0, 1)  # noqa: E731
    # the last day's notes: each one's text states its call, as the policy's and the base's notes do
    rollouts, baseline = (
        notes.assign(structure_score=score(), response=[note_text(*c) for h in calls[source] for c in h])
        for source in ("policy", "base")
    )
    winners = rng.choice(["policy", "base", "tie"], HEADLINES, p=[0.4, 0.4, 0.2])
    return rollouts, baseline, outcomes, pd.DataFrame({"winner": winners}), day


def headline_title(symbol: str) -> str:
    return f"{symbol} shares move after the company's update"


def note_text(symbol: str | None, side: int) -> str:
    """A note's text whose call `calls.parse_call` reads back as (symbol, side); no symbol: no trade."""
    if not symbol:
        return "Trade Recommendation: no trade today.\nRationale: nothing clear."
    return f"Trade Recommendation: {'Buy' if side > 0 else 'Sell'} {symbol}.\nTimeframe: 1 day"


def labels_of(rng, closes, days, horizon, edge, walk: bool) -> dict[str, str]:
    cost = 0.0 if walk else 10.0
    rollouts, baseline, outcomes, preferences, day = simulate(rng, closes, days, horizon, edge, cost)
    ev = evaluate_day(rollouts, baseline, outcomes, preferences, day=day).set_index("metric")["label"].to_dict()
    summary = run_backtest(outcomes, cost_bps_per_turnover=cost).summary
    ev["backtest_vs_base"] = summary["label_vs_base"]
    ev["backtest_vs_spy"] = summary["label_vs_spy"] if walk else None  # bundled: SPY's drift, not a null
    return ev


def calibrate(runs: int, seed: int) -> pd.DataFrame:
    """One row per run and metric: source, days, horizon, label."""
    rng = np.random.default_rng(seed)
    bundled = bundled_closes()
    cells = list(itertools.product(SOURCES, HORIZONS, DAYS))
    rows = []
    for r in range(runs):
        source, horizon, days = cells[r % len(cells)]
        walk = source == "walk"
        closes = random_walk(rng, days + horizon, list(WALK_SYMBOLS)) if walk else bundled
        for metric, label in labels_of(rng, closes, days, horizon, 0.0, walk).items():
            if label is not None:
                rows.append(dict(source=source, horizon=horizon, days=days, metric=metric, label=label))
    return pd.DataFrame(rows)


def power(runs: int, seed: int, edge: float, days: int = 40) -> pd.DataFrame:
    rng = np.random.default_rng(seed + 1)
    bundled = bundled_closes()
    rows = []
    for r in range(runs):
        source, horizon = list(itertools.product(SOURCES, HORIZONS))[r % 4]
        walk = source == "walk"
        closes = random_walk(rng, days + horizon, list(WALK_SYMBOLS)) if walk else bundled
        for metric, label in labels_of(rng, closes, days, horizon, edge, walk).items():
            if label is not None and metric not in ("structure_score", "judge_win_rate", "headline_company_share"):
                rows.append(dict(source=source, horizon=horizon, metric=metric, label=label))
    return pd.DataFrame(rows)


def _rates(frame: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    g = frame.assign(decided=frame["label"].isin(DECIDED), labelled=~frame["label"].isin(ENOUGH_WORDS))
    out = g.groupby(by).agg(
        runs=("label", "size"), labelled=("labelled", "sum"), rate=("decided", "mean"), decided=("decided", "sum")
    )
    out["when_labelled"] = out["decided"] / out["labelled"].where(out["labelled"] > 0)
    return out.drop(columns="decided")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=960, help="null runs (spread over source x horizon x days)")
    ap.add_argument("--power-runs", type=int, default=200)
    ap.add_argument("--edge", type=float, default=0.3, help="planted edge, pp per session held")
    ap.add_argument("--seed", type=int, default=0)
    add_record_argument(ap)
    args = ap.parse_args()
    t0 = time.perf_counter()
    null = calibrate(args.runs, args.seed)
    t1 = time.perf_counter()
    pd.set_option("display.width", 200)
    print(
        f"Null: {args.runs} runs in {t1 - t0:.0f} s (rate = share labelled better/worse; labelled = runs with a verdict)"
    )
    print(_rates(null, ["metric"]).round(3).to_string())
    print("\nBy days (rate per metric, sources and horizons pooled):")
    print(_rates(null, ["metric", "days"])["rate"].unstack("days").round(3).to_string())
    print("\nBy source and horizon:")
    print(_rates(null, ["metric", "source", "horizon"])["rate"].unstack(["source", "horizon"]).round(3).to_string())
    overall = _rates(null, ["metric"])
    # the last line: each metric's false-label rate under the null (as before), then the tables above
    result: dict = {m: round(float(overall.loc[m, "rate"]), 4) for m in METRICS if m in overall.index}
    result["when_labelled"] = _nested(overall["when_labelled"])
    by_source = _rates(null, ["metric", "source", "horizon"])["rate"]
    result["by_days"] = _nested(_rates(null, ["metric", "days"])["rate"])
    result["by_source_horizon"] = _nested(by_source)
    if args.power_runs:
        pw = power(args.power_runs, args.seed, args.edge)
        found = pw.assign(found=pw["label"].isin({BETTER, EDGE_LABELS[0]}))
        shares = found.groupby(["metric", "source", "horizon"])["found"].mean()
        print(
            f"\nPower: planted edge {args.edge} pp per session, 40 days, {args.power_runs} runs "
            f"({time.perf_counter() - t1:.0f} s): share labelled better"
        )
        print(shares.unstack(["source", "horizon"]).round(3).to_string())
        print("(5-session books over 40 days are 8 non-overlapping windows: below the 10 an interval needs)")
        result["power"] = dict(edge_pp=args.edge, days=40, runs=args.power_runs, share_labelled_better=_nested(shares))
    finish("ab_calibration", result, args.record)


def _nested(series: pd.Series) -> dict:
    """metric -> rate, or metric -> "level/level" -> rate for a deeper index (JSON keys are strings)."""
    out: dict = {}
    for key, value in series.items():
        if value != value:  # NaN: no run of that cell
            continue
        metric, *rest = key if isinstance(key, tuple) else (key,)
        if rest:
            out.setdefault(metric, {})["/".join(str(r) for r in rest)] = round(float(value), 4)
        else:
            out[metric] = round(float(value), 4)
    return out


if __name__ == "__main__":
    main()
