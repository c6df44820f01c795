"""The T+5 outcome window of a decision, on the NYSE calendar (exchange_calendars, XNYS).

Entry = the close of the first session closing at or after the decision time (a decision at
10:00 enters at that day's close; one after the close, or on a weekend or holiday, at the next
session's close; a half day closes at 13:00 New York and the calendar knows it). Exit = the close
`window_days` (5) sessions after the entry session.

The basket is equal-weighted over the proposal's orders. A sell order counts as a short leg, so
`return_pct = mean(sign_i * r_i)` and `vs_spy_pct = mean(sign_i * (r_i - r_SPY))` in percentage
points; for an all-buy proposal these are the plain basket return and basket minus SPY.

Status: `matured` (both closes known), `pending` (the exit session has not closed yet, or the
price data does not reach it yet) or `no_data` (with the reason: unknown symbol, a close missing
inside the data's range, no orders). A price is never invented: no forward fill, no nearest date.
The calendar, the price table and the checks both loops share live in `outcome_flywheel.trading_sessions`.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Iterable, Mapping

import exchange_calendars as xc
import pandas as pd

from outcome_flywheel.trading_sessions import PriceTable, Window, nyse_calendar, window_outcome

WINDOW_DAYS = 5
BENCHMARK = "SPY"


def t5_window(
    ts: datetime | pd.Timestamp | str, window_days: int = WINDOW_DAYS, calendar: xc.ExchangeCalendar | None = None
) -> Window:
    """Entry at the first session close at or after `ts`; exit `window_days` sessions later."""
    cal = calendar or nyse_calendar()
    ts = pd.Timestamp(ts)
    if ts.tzinfo is None:
        raise ValueError("ts must be timezone-aware")
    ts = ts.tz_convert("UTC")
    day = ts.tz_convert("America/New_York").normalize().tz_localize(None)
    if day < cal.first_session or day > cal.last_session:
        raise ValueError(
            f"{ts} is outside the XNYS calendar's range {cal.first_session.date()}..{cal.last_session.date()}"
        )
    sessions = cal.sessions_in_range(day - pd.Timedelta(days=1), min(day + pd.Timedelta(days=14), cal.last_session))
    closes = cal.closes.loc[sessions]
    after = sessions[(closes >= ts).values]  # closes are UTC timestamps (half days included)
    if len(after) == 0:
        raise ValueError(f"no session closes after {ts} inside the calendar")
    entry = after[0]
    exit_ = cal.session_offset(entry, window_days)
    return Window(
        entry_date=entry.date().isoformat(),
        exit_date=exit_.date().isoformat(),
        entry_close_utc=pd.Timestamp(cal.session_close(entry)),
        exit_close_utc=pd.Timestamp(cal.session_close(exit_)),
    )


OUTCOME_COLUMNS = {
    "decision_id": "string",
    "decision_date": "string",
    "status": "string",
    "reason": "string",
    "symbols": "string",
    "entry_date": "string",
    "exit_date": "string",
    "exit_close_utc": "string",
    "return_pct": "float64",
    "spy_return_pct": "float64",
    "vs_spy_pct": "float64",
    "window_days": "int64",
    "computed_at": "string",
}


def empty_outcomes() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in OUTCOME_COLUMNS.items()})


def compute_outcome(
    ts: datetime | pd.Timestamp | str,
    orders: Iterable[Mapping[str, Any]],
    prices: PriceTable,
    now: datetime | pd.Timestamp | None = None,
    window_days: int = WINDOW_DAYS,
    benchmark: str = BENCHMARK,
    calendar: xc.ExchangeCalendar | None = None,
) -> dict[str, Any]:
    """The outcome of one proposal: status, reason, window dates and the returns when matured."""
    now = pd.Timestamp(now or datetime.now(timezone.utc))
    now = now.tz_localize("UTC") if now.tzinfo is None else now.tz_convert("UTC")
    orders = list(orders)
    out: dict[str, Any] = {
        "status": "no_data",
        "reason": None,
        "symbols": ",".join(sorted({o["symbol"] for o in orders})),
        "entry_date": None,
        "exit_date": None,
        "exit_close_utc": None,
        "return_pct": float("nan"),
        "spy_return_pct": float("nan"),
        "vs_spy_pct": float("nan"),
        "window_days": window_days,
    }
    if not orders:
        out["reason"] = "the proposal has no orders"
        return out
    needed = sorted({o["symbol"] for o in orders} | {benchmark})
    w, closes, status, reason = window_outcome(lambda: t5_window(ts, window_days, calendar), needed, prices, now)
    if w is not None:
        out.update(entry_date=w.entry_date, exit_date=w.exit_date, exit_close_utc=w.exit_close_utc.isoformat())
    if status:
        out.update(status=status, reason=reason)
        return out

    def ret(symbol: str) -> float:
        entry, exit_ = closes[symbol]
        return (exit_ / entry - 1.0) * 100.0

    spy = ret(benchmark)
    signs = [1.0 if o["side"] == "buy" else -1.0 for o in orders]
    legs = [ret(o["symbol"]) for o in orders]
    out.update(
        status="matured",
        reason=None,
        return_pct=sum(g * r for g, r in zip(signs, legs)) / len(legs),
        spy_return_pct=spy,
        vs_spy_pct=sum(g * (r - spy) for g, r in zip(signs, legs)) / len(legs),
    )
    return out
