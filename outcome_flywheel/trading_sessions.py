"""NYSE (XNYS) sessions, price tables and outcome windows that both loops judge prices by.

Shared by the daily loop's call outcomes (`daily_rl/notes/outcomes.py`), the preference loop's T+5
decision outcomes (`preferences/windows.py`) and the market data (`market_data.py`): it sits below
those areas, beside the market data. Plain Python on `exchange_calendars`; never a filled price.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Iterable, Mapping

import exchange_calendars as xc
import pandas as pd


@lru_cache(maxsize=4)
def nyse_calendar(start: str = "2005-01-01") -> xc.ExchangeCalendar:
    return xc.get_calendar("XNYS", start=start)


@dataclass(frozen=True)
class Window:
    entry_date: str  # session label, YYYY-MM-DD
    exit_date: str
    entry_close_utc: pd.Timestamp
    exit_close_utc: pd.Timestamp


def last_closed_session(now: pd.Timestamp | str, calendar: xc.ExchangeCalendar | None = None) -> str | None:
    """The date (YYYY-MM-DD) of the latest XNYS session whose close is at or before `now` (half days
    close at 13:00 New York), or None before the calendar's first close. A naive `now` is UTC."""
    cal = calendar or nyse_calendar()
    now = pd.Timestamp(now)
    now = now.tz_localize("UTC") if now.tzinfo is None else now.tz_convert("UTC")
    if now < cal.closes.iloc[0]:
        return None
    closed = int(cal.closes.searchsorted(now, side="right"))  # closes are sorted UTC timestamps
    return cal.closes.index[closed - 1].date().isoformat()


def session_on_or_before(day: str, calendar: xc.ExchangeCalendar | None = None) -> str | None:
    """The latest XNYS session dated on or before `day` (YYYY-MM-DD), or None before the calendar's first."""
    cal = calendar or nyse_calendar()
    sessions = cal.sessions
    at = int(sessions.searchsorted(pd.Timestamp(day), side="right"))
    return sessions[at - 1].date().isoformat() if at else None


def normalize_prices(prices: pd.DataFrame, source: str = "price frame") -> pd.DataFrame:
    """`date` (YYYY-MM-DD), `symbol` (upper case), `close`; a clear error when a column is missing."""
    missing = {"date", "symbol", "close"} - set(prices.columns)
    if missing:
        raise ValueError(f"{source} lacks columns {sorted(missing)} (needs date, symbol, close)")
    df = prices[["date", "symbol", "close"]].copy()
    df["date"] = pd.to_datetime(df["date"]).dt.strftime("%Y-%m-%d")
    df["symbol"] = df["symbol"].astype(str).str.upper()
    return df


class PriceTable:
    """Closes by (date, symbol) with each symbol's first and last date, from a frame `date, symbol, close`.

    `spans` ({symbol: (first date, last date)}) says how far the source's data reaches when `prices`
    holds only the dates one request selected: a symbol whose data ends before the requested dates is
    then known (its outcomes are pending until the data reaches them), not "no prices at all".
    """

    def __init__(self, prices: pd.DataFrame, spans: Mapping[str, tuple[str, str]] | None = None):
        df = normalize_prices(prices)
        df = df.dropna(subset=["close"])
        df = df[df["close"] > 0]
        self.close: dict[tuple[str, str], float] = {
            (d, s): float(c) for d, s, c in zip(df["date"], df["symbol"], df["close"])
        }
        self.last_date: dict[str, str] = df.groupby("symbol")["date"].max().to_dict()
        self.first_date: dict[str, str] = df.groupby("symbol")["date"].min().to_dict()
        for symbol, (first, last) in (spans or {}).items():
            symbol = str(symbol).upper()
            self.first_date[symbol] = min(first, self.first_date.get(symbol, first))
            self.last_date[symbol] = max(last, self.last_date.get(symbol, last))

    def __contains__(self, symbol: str) -> bool:
        return symbol in self.last_date


def window_outcome(
    make_window: Callable[[], Window], symbols: Iterable[str], prices: PriceTable, now: pd.Timestamp
) -> tuple[Window | None, dict[str, tuple[float, float]], str | None, str | None]:
    """(window, closes, status, reason) of one outcome, in the order both loops judge it: a window the
    calendar cannot make is no_data; an exit not closed by `now` is pending, whatever the data; then
    the closes (`window_closes`). Status None: matured, every close known."""
    try:
        w = make_window()
    except ValueError as err:
        return None, {}, "no_data", str(err)
    pending = not_closed_yet(w, now)
    if pending:
        return w, {}, "pending", pending
    closes, status, reason = window_closes(symbols, w, prices)
    return w, closes, status, reason


def not_closed_yet(w: Window, now: pd.Timestamp) -> str | None:
    """Why the outcome is pending while the exit session has not closed by `now` (UTC); None once it has."""
    if w.exit_close_utc > now:
        return (
            f"exit session {w.exit_date} closes at {w.exit_close_utc.isoformat()}, not yet closed at {now.isoformat()}"
        )
    return None


def window_closes(
    symbols: Iterable[str], w: Window, prices: PriceTable
) -> tuple[dict[str, tuple[float, float]], str | None, str | None]:
    """(entry and exit close by symbol, status, reason). Status None: every close is known; "no_data": a
    symbol has no prices at all, none before the entry, or a close missing inside its data; "pending":
    the data does not reach the exit session yet. Never a filled or nearby price."""
    needed = list(dict.fromkeys(symbols))
    unknown = [s for s in needed if s not in prices]
    if unknown:
        return {}, "no_data", "no prices at all for " + ", ".join(unknown)
    behind = [s for s in needed if prices.last_date[s] < w.exit_date]
    if behind:
        last = min(prices.last_date[s] for s in behind)
        where = ", ".join(f"{s} ends {prices.last_date[s]}" for s in behind)
        return {}, "pending", f"price data ends {last}, before the exit session {w.exit_date} ({where})"
    closes: dict[str, tuple[float, float]] = {}
    gaps = []
    for s in needed:
        if prices.first_date[s] > w.entry_date:
            gaps.append(f"{s} has no prices before {prices.first_date[s]} (entry {w.entry_date})")
            continue
        entry, exit_ = prices.close.get((w.entry_date, s)), prices.close.get((w.exit_date, s))
        missing = [d for d, c in ((w.entry_date, entry), (w.exit_date, exit_)) if c is None]
        if missing:
            gaps.append(
                f"{s} has no close on {' and '.join(missing)} (inside its data {prices.first_date[s]}..{prices.last_date[s]})"
            )
            continue
        closes[s] = (entry, exit_)
    if gaps:
        return {}, "no_data", "; ".join(gaps)
    return closes, None, None
