"""The realised outcome of each day's trade call, on NYSE (XNYS) sessions. Plain Python.

A note of day D is written after D's news (the run for D starts the next morning), so no price at
or before D's close is used:

- entry = the close of the first XNYS session strictly after the calendar date D (a Friday note
  enters on Monday; a holiday is skipped; a half day counts as a session);
- exit = the close `horizon` sessions after the entry session (default 1).

With s = +1 (long) or -1 (short), r = exit/entry - 1 and r_SPY the same for SPY over the same two
sessions, in percentage points: `return_pct = 100*s*r - cost_bps/100` and
`vs_spy_pct = 100*s*(r - r_SPY) - cost_bps/100` (`cost_bps` is a round trip, default 10);
`symbol_return_pct = 100*r` and `spy_return_pct = 100*r_SPY` are kept unsigned and without cost.

Status (one of OUTCOME_STATUSES), with a reason for every status except `matured`:
- `no_call`: the parse did not give a usable call, or the side is "none" (reason: the parse
  reason, or "no trade"). The window fields are still filled when the day has one (harmless, for
  display); a scheduler must key on `status`, as `pending_days_ready` does.
- `pending`: the exit session has not closed by `now`, or the price data of the symbol or SPY does
  not reach the exit session yet. `exit_close_utc` says when to re-run.
- `no_data`: the symbol (or SPY) has no prices at all, a close is missing inside the data's range,
  or the day is outside the calendar. A price is never invented: no forward fill, no
  interpolation, no nearest date.
- `matured`: the entry and exit closes of the symbol and SPY are known.
Closes and returns are only filled on matured rows. Checks run in this order: calendar, `now`
against the exit close, unknown symbols, data ending before the exit, missing closes.
"""

from __future__ import annotations

import operator
from datetime import datetime
from typing import Any, Iterable

import exchange_calendars as xc
import pandas as pd

from outcome_flywheel.trading_sessions import PriceTable, Window, nyse_calendar, window_outcome

DEFAULT_HORIZON = 1
DEFAULT_COST_BPS = 10.0
BENCHMARK = "SPY"
OUTCOME_STATUSES = ("matured", "pending", "no_data", "no_call")
SIDES = {"long": 1.0, "short": -1.0}
CALL_COLUMNS = ("date", "symbol", "side", "parse_status", "parse_reason")

OUTCOME_COLUMNS: dict[str, str] = {
    "status": "string",
    "reason": "string",
    "entry_date": "string",
    "exit_date": "string",
    "exit_close_utc": "string",
    "horizon_sessions": "int64",
    "entry_close": "float64",
    "exit_close": "float64",
    "symbol_return_pct": "float64",
    "spy_return_pct": "float64",
    "return_pct": "float64",
    "vs_spy_pct": "float64",
    "cost_bps": "float64",
    "computed_at": "string",
}

Now = datetime | pd.Timestamp | str


def _check_horizon(horizon: int) -> int:
    if isinstance(horizon, bool):
        raise ValueError(f"horizon must be a whole number of sessions >= 1, got {horizon!r}")
    try:
        h = operator.index(horizon)
    except TypeError:
        raise ValueError(f"horizon must be a whole number of sessions >= 1, got {horizon!r}") from None
    if h < 1:
        raise ValueError(f"horizon must be >= 1 session (exit after the entry session), got {h}")
    return h


def _check_cost(cost_bps: float) -> float:
    cost = float(cost_bps)
    if not cost >= 0:  # also rejects NaN
        raise ValueError(f"cost_bps must be >= 0 (a round-trip cost in basis points), got {cost_bps!r}")
    return cost


def _utc(now: Now) -> pd.Timestamp:
    """`now` as a UTC timestamp; a naive one is taken as UTC (as windows.compute_outcome does)."""
    ts = pd.Timestamp(now)
    return ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")


def _day(day: Any) -> pd.Timestamp:
    try:
        ts = pd.Timestamp(day)
    except (TypeError, ValueError):
        raise ValueError(f"day {day!r} is not a date (YYYY-MM-DD)") from None
    if ts is pd.NaT:
        raise ValueError(f"day {day!r} is not a date (YYYY-MM-DD)")
    return pd.Timestamp(ts.date())


def call_window(day: str, horizon: int = DEFAULT_HORIZON, calendar: xc.ExchangeCalendar | None = None) -> Window:
    """Entry at the close of the first session strictly after the date `day`; exit `horizon` sessions later."""
    h = _check_horizon(horizon)
    cal = calendar or nyse_calendar()
    d = _day(day)
    try:
        entry = cal.date_to_session(d + pd.Timedelta(days=1), direction="next")
        exit_ = cal.session_offset(entry, h)
    except ValueError:
        raise ValueError(
            f"day {d.date()} with a {h}-session horizon falls outside the XNYS calendar's range "
            f"{cal.first_session.date()}..{cal.last_session.date()}"
        ) from None
    return Window(
        entry_date=entry.date().isoformat(),
        exit_date=exit_.date().isoformat(),
        entry_close_utc=pd.Timestamp(cal.session_close(entry)),
        exit_close_utc=pd.Timestamp(cal.session_close(exit_)),
    )


def price_range(days: Iterable[str], horizon: int, calendar: xc.ExchangeCalendar | None = None) -> tuple[str, str]:
    """(first entry date, last exit date) of the closes these days' calls need, for one price request.

    Days outside the calendar are skipped (their calls are `no_data` anyway); ValueError when none is
    left. The last date may lie in the future: the calls of those days will be `pending`.
    """
    h = _check_horizon(horizon)
    windows = []
    for day in days:
        try:
            windows.append(call_window(day, h, calendar))
        except ValueError:
            continue
    if not windows:
        raise ValueError("no day with a window inside the XNYS calendar: no prices needed")
    return min(w.entry_date for w in windows), max(w.exit_date for w in windows)


def _blank(h: int, cost: float, now: pd.Timestamp) -> dict[str, Any]:
    nan = float("nan")
    return {
        "status": "no_data",
        "reason": None,
        "entry_date": None,
        "exit_date": None,
        "exit_close_utc": None,
        "horizon_sessions": h,
        "entry_close": nan,
        "exit_close": nan,
        "symbol_return_pct": nan,
        "spy_return_pct": nan,
        "return_pct": nan,
        "vs_spy_pct": nan,
        "cost_bps": cost,
        "computed_at": now.isoformat(),
    }


def _no_call(day: Any, reason: str, h: int, cost: float, now: pd.Timestamp, calendar) -> dict[str, Any]:
    out = _blank(h, cost, now)
    out.update(status="no_call", reason=reason)
    try:
        w = call_window(day, h, calendar)
    except ValueError:
        return out
    out.update(entry_date=w.entry_date, exit_date=w.exit_date, exit_close_utc=w.exit_close_utc.isoformat())
    return out


def call_outcome(
    day: str,
    symbol: str | None,
    side: str,
    prices: PriceTable,
    now: Now,
    horizon: int = DEFAULT_HORIZON,
    cost_bps: float = DEFAULT_COST_BPS,
    benchmark: str = BENCHMARK,
    calendar: xc.ExchangeCalendar | None = None,
) -> dict[str, Any]:
    """The outcome of one call: a dict with exactly the keys of OUTCOME_COLUMNS.

    A side of "none", a missing symbol or an unknown side give `no_call` (the row is kept, not raised).
    """
    h, cost, now = _check_horizon(horizon), _check_cost(cost_bps), _utc(now)
    side = str(side).strip().lower() if isinstance(side, str) else side
    if side == "none" or side is None:
        return _no_call(day, "no trade", h, cost, now, calendar)
    if side not in SIDES:
        return _no_call(day, f"unknown side {side!r} (expected long, short or none)", h, cost, now, calendar)
    if not isinstance(symbol, str) or not symbol.strip():
        return _no_call(day, f"a {side} call without a symbol", h, cost, now, calendar)
    symbol, benchmark = symbol.strip().upper(), benchmark.upper()

    out = _blank(h, cost, now)
    w, closes, status, reason = window_outcome(lambda: call_window(day, h, calendar), [symbol, benchmark], prices, now)
    if w is not None:
        out.update(entry_date=w.entry_date, exit_date=w.exit_date, exit_close_utc=w.exit_close_utc.isoformat())
    if status:
        out.update(status=status, reason=reason)
        return out

    sign = SIDES[side]
    entry, exit_ = closes[symbol]
    r = exit_ / entry - 1.0
    r_spy = closes[benchmark][1] / closes[benchmark][0] - 1.0
    out.update(
        status="matured",
        reason=None,
        entry_close=entry,
        exit_close=exit_,
        symbol_return_pct=100.0 * r,
        spy_return_pct=100.0 * r_spy,
        return_pct=100.0 * sign * r - cost / 100.0,
        vs_spy_pct=100.0 * sign * (r - r_spy) - cost / 100.0,
    )
    return out


def _text(value: Any) -> str | None:
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return None
    text = str(value).strip()
    return text or None


def outcome_rows(
    calls: pd.DataFrame,
    prices: PriceTable,
    now: Now,
    horizon: int = DEFAULT_HORIZON,
    cost_bps: float = DEFAULT_COST_BPS,
    calendar: xc.ExchangeCalendar | None = None,
) -> pd.DataFrame:
    """`calls` (date, symbol, side, parse_status, parse_reason, ...) with OUTCOME_COLUMNS added.

    Every row and every other column is kept, in order, with the index reset. Outcome columns that
    `calls` already has (a re-run on an outcomes frame) are replaced and placed at the end.
    """
    h, cost, now = _check_horizon(horizon), _check_cost(cost_bps), _utc(now)
    missing = [c for c in CALL_COLUMNS if c not in calls.columns]
    if missing:
        raise ValueError(f"calls lack columns {missing} (needs {', '.join(CALL_COLUMNS)})")
    base = calls.drop(columns=[c for c in OUTCOME_COLUMNS if c in calls.columns]).reset_index(drop=True)
    rows = []
    for rec in base[list(CALL_COLUMNS)].itertuples(index=False):
        status, side, reason = _text(rec.parse_status), _text(rec.side), _text(rec.parse_reason)
        if status != "ok":
            rows.append(_no_call(rec.date, reason or f"parse status {status or 'missing'}", h, cost, now, calendar))
        elif side is None or side.lower() == "none":
            rows.append(_no_call(rec.date, reason or "no trade", h, cost, now, calendar))
        else:
            rows.append(call_outcome(rec.date, _text(rec.symbol), side, prices, now, h, cost, calendar=calendar))
    out = pd.DataFrame(rows, columns=list(OUTCOME_COLUMNS)) if rows else pd.DataFrame(columns=list(OUTCOME_COLUMNS))
    out = out.astype(OUTCOME_COLUMNS)
    return pd.concat([base, out], axis=1)


def pending_days_ready(outcomes: pd.DataFrame, now: Now) -> list[str]:
    """Sorted dates (YYYY-MM-DD) holding a pending row whose exit session has closed by `now`.

    A pending row without `exit_close_utc` (not written by this module) counts as ready.
    """
    now = _utc(now)
    pending = outcomes[outcomes["status"].astype("string").eq("pending").fillna(False).astype(bool)]
    days = set()
    for day, close in zip(pending["date"], pending["exit_close_utc"]):
        if _text(close) is None or _utc(close) <= now:
            days.add(_day(day).date().isoformat())
    return sorted(days)
