"""T+5 windows on the XNYS calendar, and outcomes: matured, pending, no_data; never invent a price."""

import pandas as pd
import pytest

from outcome_flywheel.market_data import BUNDLED_PRICES, read_price_file
from outcome_flywheel.preferences.windows import compute_outcome, t5_window
from outcome_flywheel.trading_sessions import PriceTable


@pytest.fixture(scope="module")
def prices():
    return PriceTable(read_price_file(BUNDLED_PRICES))


@pytest.mark.parametrize(
    "ts, entry, exit_",
    [
        # The example: Thanksgiving (27th) is closed, the 28th is a half day; 5 sessions later is Dec 4.
        ("2025-11-26T10:00:00-05:00", "2025-11-26", "2025-12-04"),
        # Exactly at the close counts as "at or after".
        ("2025-11-26T16:00:00-05:00", "2025-11-26", "2025-12-04"),
        # After the close: the next session (Thanksgiving skipped) is the half day of the 28th.
        ("2025-11-26T16:01:00-05:00", "2025-11-28", "2025-12-05"),
        # On the half day, after its 13:00 close: next session.
        ("2025-11-28T13:30:00-05:00", "2025-12-01", "2025-12-08"),
        ("2025-11-28T12:59:00-05:00", "2025-11-28", "2025-12-05"),
        # On a holiday (Thanksgiving) and a weekend.
        ("2025-11-27T11:00:00-05:00", "2025-11-28", "2025-12-05"),
        ("2025-12-06T11:00:00-05:00", "2025-12-08", "2025-12-15"),
        # Christmas Eve half day, across Christmas and New Year's Day.
        ("2025-12-24T14:00:00-05:00", "2025-12-26", "2026-01-05"),
        # Juneteenth and July 3rd (a half day) / July 4th.
        ("2025-06-18T17:00:00-04:00", "2025-06-20", "2025-06-27"),
        ("2025-07-02T10:00:00-04:00", "2025-07-02", "2025-07-10"),
    ],
)
def test_t5_window_across_holidays_and_half_days(ts, entry, exit_):
    w = t5_window(ts)
    assert (w.entry_date, w.exit_date) == (entry, exit_)


def test_half_day_close_time_comes_from_the_calendar():
    assert t5_window("2025-11-28T09:45:00-05:00").entry_close_utc == pd.Timestamp("2025-11-28T18:00:00Z")


def test_naive_time_is_refused():
    with pytest.raises(ValueError):
        t5_window("2025-11-26T10:00:00")


BUY_NVDA_AAPL = [{"symbol": "NVDA", "side": "buy", "weight": 0.05}, {"symbol": "AAPL", "side": "buy", "weight": 0.02}]


def test_matured_returns_are_the_price_file_figures(prices):
    out = compute_outcome("2025-11-26T10:00:00-05:00", BUY_NVDA_AAPL, prices, now="2026-06-01T00:00:00Z")
    assert out["status"] == "matured" and out["reason"] is None
    c = prices.close
    r = {s: (c[("2025-12-04", s)] / c[("2025-11-26", s)] - 1) * 100 for s in ("NVDA", "AAPL", "SPY")}
    assert out["return_pct"] == pytest.approx((r["NVDA"] + r["AAPL"]) / 2)
    assert out["spy_return_pct"] == pytest.approx(r["SPY"])
    assert out["vs_spy_pct"] == pytest.approx((r["NVDA"] + r["AAPL"]) / 2 - r["SPY"])
    assert out["window_days"] == 5


def test_a_sell_leg_counts_as_short(prices):
    buy = compute_outcome(
        "2025-11-26T10:00:00-05:00",
        [{"symbol": "XOM", "side": "buy", "weight": 0.05}],
        prices,
        now="2026-06-01T00:00:00Z",
    )
    sell = compute_outcome(
        "2025-11-26T10:00:00-05:00",
        [{"symbol": "XOM", "side": "sell", "weight": 0.05}],
        prices,
        now="2026-06-01T00:00:00Z",
    )
    assert sell["return_pct"] == pytest.approx(-buy["return_pct"])
    assert sell["vs_spy_pct"] == pytest.approx(-buy["vs_spy_pct"])


def test_pending_when_the_exit_has_not_closed(prices):
    out = compute_outcome("2025-11-26T10:00:00-05:00", BUY_NVDA_AAPL, prices, now="2025-12-04T20:59:00Z")
    assert out["status"] == "pending" and "not yet closed" in out["reason"]
    assert out["exit_date"] == "2025-12-04" and pd.isna(out["return_pct"])


def test_pending_when_the_prices_do_not_reach_the_exit_yet(prices):
    out = compute_outcome("2026-01-06T10:00:00-05:00", BUY_NVDA_AAPL, prices, now="2026-06-01T00:00:00Z")
    assert out["status"] == "pending" and "price data ends 2026-01-08" in out["reason"]


def test_no_data_for_an_unknown_symbol(prices):
    out = compute_outcome(
        "2025-11-26T10:00:00-05:00",
        [{"symbol": "TSLA", "side": "buy", "weight": 0.02}],
        prices,
        now="2026-06-01T00:00:00Z",
    )
    assert out["status"] == "no_data" and "TSLA" in out["reason"]


def test_a_missing_close_is_never_filled():
    # NVDA lacks the exit day's close inside the data's range: no_data, not the nearest close.
    rows = []
    for d in ["2025-11-26", "2025-11-28", "2025-12-01", "2025-12-02", "2025-12-03", "2025-12-04", "2025-12-05"]:
        rows.append({"date": d, "symbol": "SPY", "close": 600.0})
        if d != "2025-12-04":
            rows.append({"date": d, "symbol": "NVDA", "close": 180.0})
    out = compute_outcome(
        "2025-11-26T10:00:00-05:00",
        [{"symbol": "NVDA", "side": "buy", "weight": 0.05}],
        PriceTable(pd.DataFrame(rows)),
        now="2026-06-01T00:00:00Z",
    )
    assert out["status"] == "no_data" and "NVDA has no close on 2025-12-04" in out["reason"]


def test_no_orders_is_no_data(prices):
    out = compute_outcome("2025-11-26T10:00:00-05:00", [], prices)
    assert out["status"] == "no_data"
