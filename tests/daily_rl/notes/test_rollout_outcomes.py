"""Outcomes of the daily trade calls on XNYS sessions, priced from the bundled real closes.

Expected values are written by hand from sample_data/prices/daily_close.csv (the closes are quoted
next to each case); entry = first session strictly after the note's date, exit = `horizon` sessions
later; return_pct = 100*s*r - cost_bps/100, vs_spy_pct = 100*s*(r - r_SPY) - cost_bps/100.
"""

from pathlib import Path

import pandas as pd
import pytest

from outcome_flywheel.daily_rl.notes.outcomes import (
    OUTCOME_COLUMNS,
    OUTCOME_STATUSES,
    call_outcome,
    call_window,
    outcome_rows,
    pending_days_ready,
    price_range,
)
from outcome_flywheel.trading_sessions import PriceTable
from tests import PROJECT_ROOT

PRICES_CSV = PROJECT_ROOT / "sample_data" / "prices" / "daily_close.csv"
LATER = "2026-01-09T00:00:00Z"  # after every exit used here, and after the bundled data's end
APPROX = dict(abs=1e-6)


@pytest.fixture(scope="module")
def frame():
    return pd.read_csv(PRICES_CSV)


@pytest.fixture(scope="module")
def prices(frame):
    return PriceTable(frame)


def matured(out, entry_date, exit_date, entry_close, exit_close, sym_ret, spy_ret, ret, vs_spy):
    assert out["status"] == "matured", out["reason"]
    assert out["reason"] is None
    assert (out["entry_date"], out["exit_date"]) == (entry_date, exit_date)
    assert out["entry_close"] == pytest.approx(entry_close, **APPROX)
    assert out["exit_close"] == pytest.approx(exit_close, **APPROX)
    assert out["symbol_return_pct"] == pytest.approx(sym_ret, **APPROX)
    assert out["spy_return_pct"] == pytest.approx(spy_ret, **APPROX)
    assert out["return_pct"] == pytest.approx(ret, **APPROX)
    assert out["vs_spy_pct"] == pytest.approx(vs_spy, **APPROX)


# ---------------------------------------------------------------- windows


@pytest.mark.parametrize(
    "day, horizon, entry, exit_, exit_close_utc",
    [
        ("2025-12-04", 1, "2025-12-05", "2025-12-08", "2025-12-08T21:00:00+00:00"),  # Thursday -> Fri, Mon
        ("2025-12-05", 1, "2025-12-08", "2025-12-09", "2025-12-09T21:00:00+00:00"),  # Friday -> Mon, Tue
        ("2025-12-06", 1, "2025-12-08", "2025-12-09", "2025-12-09T21:00:00+00:00"),  # Saturday
        ("2025-11-26", 1, "2025-11-28", "2025-12-01", "2025-12-01T21:00:00+00:00"),  # Thanksgiving skipped
        ("2025-11-27", 1, "2025-11-28", "2025-12-01", "2025-12-01T21:00:00+00:00"),  # the holiday itself
        ("2025-11-26", 3, "2025-11-28", "2025-12-03", "2025-12-03T21:00:00+00:00"),
        ("2025-11-28", 1, "2025-12-01", "2025-12-02", "2025-12-02T21:00:00+00:00"),  # half day's own note
    ],
)
def test_call_window_enters_strictly_after_the_note_day(day, horizon, entry, exit_, exit_close_utc):
    w = call_window(day, horizon)
    assert (w.entry_date, w.exit_date) == (entry, exit_)
    assert w.exit_close_utc.isoformat() == exit_close_utc


def test_half_day_entry_closes_at_13_new_york():
    w = call_window("2025-11-26")
    assert w.entry_close_utc.isoformat() == "2025-11-28T18:00:00+00:00"


def test_price_range_spans_first_entry_to_last_exit():
    days = ["2025-12-04", "2025-11-26", "2025-12-06"]
    assert price_range(days, 1) == ("2025-11-28", "2025-12-09")
    assert price_range(days, 3) == ("2025-11-28", "2025-12-11")
    assert price_range(["1990-01-02", "2025-12-04"], 1) == ("2025-12-05", "2025-12-08")  # outside: skipped
    with pytest.raises(ValueError):
        price_range([], 1)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"horizon": 0}, "horizon"),
        ({"horizon": -2}, "horizon"),
        ({"cost_bps": -1.0}, "cost_bps"),
        ({"cost_bps": float("nan")}, "cost_bps"),
    ],
)
def test_bad_horizon_or_cost_raises(prices, kwargs, match):
    with pytest.raises(ValueError, match=match):
        call_outcome("2025-12-04", "AAPL", "long", prices, LATER, **kwargs)
    calls = pd.DataFrame(
        [{"date": "2025-12-04", "symbol": "AAPL", "side": "long", "parse_status": "ok", "parse_reason": None}]
    )
    with pytest.raises(ValueError, match=match):
        outcome_rows(calls, prices, LATER, **kwargs)
    if "horizon" in kwargs:
        with pytest.raises(ValueError, match="horizon"):
            call_window("2025-12-04", kwargs["horizon"])


# ---------------------------------------------------------------- matured calls


def test_thursday_note_enters_friday_exits_monday(prices):
    # AAPL 2025-12-05 278.779999 -> 2025-12-08 277.890015; SPY 683.669800 -> 681.615906
    out = call_outcome("2025-12-04", "AAPL", "long", prices, LATER)
    matured(out, "2025-12-05", "2025-12-08", 278.779999, 277.890015, -0.319242, -0.300422, -0.419242, -0.118820)
    assert out["horizon_sessions"] == 1 and out["cost_bps"] == 10.0
    assert out["exit_close_utc"] == "2025-12-08T21:00:00+00:00"
    assert out["computed_at"] == "2026-01-09T00:00:00+00:00"
    assert set(out) == set(OUTCOME_COLUMNS)


@pytest.mark.parametrize("day", ["2025-12-05", "2025-12-06"])  # Friday, Saturday
def test_friday_and_saturday_notes_enter_monday(prices, day):
    # NVDA 2025-12-08 185.550003 -> 2025-12-09 184.970001; SPY 681.615906 -> 681.027588
    out = call_outcome(day, "NVDA", "long", prices, LATER)
    matured(out, "2025-12-08", "2025-12-09", 185.550003, 184.970001, -0.312585, -0.086312, -0.412585, -0.326273)


@pytest.mark.parametrize("day", ["2025-11-26", "2025-11-27"])  # Wednesday before Thanksgiving, Thanksgiving
def test_thanksgiving_enters_the_half_day(prices, day):
    # AAPL 2025-11-28 278.850006 -> 2025-12-01 283.100006; SPY 681.376587 -> 678.265808
    out = call_outcome(day, "aapl", "long", prices, LATER)  # lower case symbol is accepted
    matured(out, "2025-11-28", "2025-12-01", 278.850006, 283.100006, 1.524117, -0.456543, 1.424117, 1.880660)


def test_horizon_three(prices):
    # AAPL 2025-11-28 278.850006 -> 2025-12-03 284.149994; SPY 681.376587 -> 681.875122
    out = call_outcome("2025-11-26", "AAPL", "long", prices, LATER, horizon=3)
    matured(out, "2025-11-28", "2025-12-03", 278.850006, 284.149994, 1.900659, 0.073166, 1.800659, 1.727493)
    assert out["horizon_sessions"] == 3


def test_short_call_flips_the_signs_but_not_the_raw_returns(prices):
    # NVDA 2025-12-05 182.410004 -> 2025-12-08 185.550003 (+1.721396 %); SPY -0.300422 %
    out = call_outcome("2025-12-04", "NVDA", "short", prices, LATER)
    matured(out, "2025-12-05", "2025-12-08", 182.410004, 185.550003, 1.721396, -0.300422, -1.821396, -2.121818)
    long_ = call_outcome("2025-12-04", "NVDA", "long", prices, LATER)
    assert long_["return_pct"] == pytest.approx(1.621396, **APPROX)
    assert long_["vs_spy_pct"] == pytest.approx(1.921818, **APPROX)


def test_cost_zero_versus_ten_bps(prices):
    free = call_outcome("2025-12-04", "NVDA", "short", prices, LATER, cost_bps=0)
    paid = call_outcome("2025-12-04", "NVDA", "short", prices, LATER, cost_bps=10)
    assert free["return_pct"] == pytest.approx(-1.721396, **APPROX)
    assert free["vs_spy_pct"] == pytest.approx(-2.021818, **APPROX)
    assert paid["return_pct"] == pytest.approx(free["return_pct"] - 0.1, abs=1e-12)
    assert paid["vs_spy_pct"] == pytest.approx(free["vs_spy_pct"] - 0.1, abs=1e-12)
    assert paid["symbol_return_pct"] == free["symbol_return_pct"]  # raw returns carry no cost
    assert (free["cost_bps"], paid["cost_bps"]) == (0.0, 10.0)


# ---------------------------------------------------------------- no_data / pending


def test_unknown_ticker_is_no_data_without_a_price(prices):
    out = call_outcome("2025-12-04", "ZZZZ", "long", prices, LATER)
    assert out["status"] == "no_data"
    assert "ZZZZ" in out["reason"] and "no prices" in out["reason"]
    for col in ("entry_close", "exit_close", "symbol_return_pct", "spy_return_pct", "return_pct", "vs_spy_pct"):
        assert pd.isna(out[col]), col


@pytest.mark.parametrize("drop_date", ["2025-12-05", "2025-12-08"])  # entry, exit
def test_missing_close_inside_the_range_is_no_data(frame, drop_date):
    gap = frame[~((frame["date"] == drop_date) & (frame["symbol"] == "AAPL"))].copy()
    assert len(gap) == len(frame) - 1
    out = call_outcome("2025-12-04", "AAPL", "long", PriceTable(gap), LATER)
    assert out["status"] == "no_data"
    assert "AAPL" in out["reason"] and drop_date in out["reason"]
    assert pd.isna(out["return_pct"]) and pd.isna(out["entry_close"])  # no fill from a neighbour day


def test_missing_spy_close_is_no_data(frame):
    gap = frame[~((frame["date"] == "2025-12-08") & (frame["symbol"] == "SPY"))].copy()
    out = call_outcome("2025-12-04", "AAPL", "long", PriceTable(gap), LATER)
    assert out["status"] == "no_data" and "SPY" in out["reason"] and "2025-12-08" in out["reason"]


def test_day_outside_the_calendar_is_no_data(prices):
    out = call_outcome("1990-01-02", "AAPL", "long", prices, LATER)
    assert out["status"] == "no_data" and "calendar" in out["reason"]
    assert out["exit_close_utc"] is None


def test_pending_call_matures_on_rerun(frame, prices):
    short = PriceTable(frame[frame["date"] <= "2025-12-05"])  # data ends before the exit (2025-12-08)
    first = call_outcome("2025-12-04", "AAPL", "long", short, LATER)
    assert first["status"] == "pending"
    assert "2025-12-05" in first["reason"] and "2025-12-08" in first["reason"]
    assert first["exit_close_utc"] == "2025-12-08T21:00:00+00:00"
    assert pd.isna(first["return_pct"])
    again = call_outcome("2025-12-04", "AAPL", "long", prices, LATER)
    assert again["status"] == "matured"
    assert again["return_pct"] == pytest.approx(-0.419242, **APPROX)


def test_spy_data_behind_is_pending(frame):
    behind = frame[~((frame["symbol"] == "SPY") & (frame["date"] > "2025-12-05"))]
    out = call_outcome("2025-12-04", "AAPL", "long", PriceTable(behind), LATER)
    assert out["status"] == "pending" and "SPY ends 2025-12-05" in out["reason"]


def test_now_before_the_exit_close_is_pending_even_with_prices(prices):
    # exit session 2025-12-08 closes at 21:00 UTC (16:00 New York)
    before = call_outcome("2025-12-04", "AAPL", "long", prices, "2025-12-08T20:59:00Z")
    assert before["status"] == "pending"
    assert "2025-12-08" in before["reason"] and "2025-12-08T21:00:00+00:00" in before["reason"]
    assert pd.isna(before["return_pct"]) and pd.isna(before["entry_close"])
    at_close = call_outcome(
        "2025-12-04", "AAPL", "long", prices, pd.Timestamp("2025-12-08 16:00", tz="America/New_York")
    )
    assert at_close["status"] == "matured"
    assert at_close["computed_at"] == "2025-12-08T21:00:00+00:00"


# ---------------------------------------------------------------- no_call and frames


def test_side_none_is_no_call(prices):
    out = call_outcome("2025-12-04", None, "none", prices, LATER)
    assert out["status"] == "no_call" and out["reason"] == "no trade"
    assert (out["entry_date"], out["exit_date"]) == ("2025-12-05", "2025-12-08")  # documented: filled
    assert pd.isna(out["return_pct"])


def calls_frame():
    return pd.DataFrame(
        {
            "date": ["2025-12-04", "2025-12-04", "2025-12-05", "2025-12-04", "2025-12-04", "2025-11-26"],
            "sample": [0, 1, 2, 3, 4, 5],
            "symbol": ["AAPL", "NVDA", None, "ZZZZ", "AAPL", "AAPL"],
            "side": ["long", "short", "none", "long", "long", "long"],
            "parse_status": ["ok", "ok", "ok", "ok", "no_ticker", "ok"],
            "parse_reason": [None, None, None, None, "no ticker in the note", None],
            "note": ["a", "b", "c", "d", "e", "f"],
        },
        index=[10, 11, 12, 13, 14, 15],
    )


def test_outcome_rows_keeps_rows_columns_and_dtypes(prices):
    calls = calls_frame()
    out = outcome_rows(calls, prices, LATER)
    assert list(out.columns) == list(calls.columns) + list(OUTCOME_COLUMNS)
    assert len(out) == len(calls) and list(out.index) == list(range(len(calls)))
    assert {c: str(out[c].dtype) for c in OUTCOME_COLUMNS} == OUTCOME_COLUMNS
    assert list(out["note"]) == list(calls["note"]) and list(out["sample"]) == list(calls["sample"])
    assert list(out["status"]) == ["matured", "matured", "no_call", "no_data", "no_call", "matured"]
    assert set(out["status"]) <= set(OUTCOME_STATUSES)
    assert out.loc[2, "reason"] == "no trade"
    assert out.loc[4, "reason"] == "no ticker in the note"
    assert out.loc[0, "return_pct"] == pytest.approx(-0.419242, **APPROX)
    assert out.loc[1, "return_pct"] == pytest.approx(-1.821396, **APPROX)
    assert out.loc[5, "vs_spy_pct"] == pytest.approx(1.880660, **APPROX)
    assert out["computed_at"].eq("2026-01-09T00:00:00+00:00").all()
    # A re-run on an outcomes frame replaces the outcome columns instead of duplicating them.
    again = outcome_rows(out, prices, LATER, cost_bps=0)
    assert list(again.columns) == list(out.columns)
    assert again.loc[0, "return_pct"] == pytest.approx(-0.319242, **APPROX)


def test_outcome_rows_empty_and_missing_columns(prices):
    empty = outcome_rows(calls_frame().iloc[:0], prices, LATER)
    assert len(empty) == 0 and {c: str(empty[c].dtype) for c in OUTCOME_COLUMNS} == OUTCOME_COLUMNS
    with pytest.raises(ValueError, match="parse_status"):
        outcome_rows(calls_frame().drop(columns=["parse_status"]), prices, LATER)


def test_pending_days_ready(frame, prices):
    calls = calls_frame()
    short = PriceTable(frame[frame["date"] <= "2025-12-05"])
    out = outcome_rows(calls, short, "2025-12-09T00:00:00Z")
    # 2025-12-04 calls exit 2025-12-08 (closed, data behind); 2025-12-05's is a no_call; 2025-11-26 matured.
    assert list(out["status"]) == ["pending", "pending", "no_call", "no_data", "no_call", "matured"]
    late = outcome_rows(calls.iloc[[0, 2]].assign(date="2025-12-08"), short, "2025-12-09T00:00:00Z")
    assert list(late["status"]) == ["pending", "no_call"]  # exit 2025-12-10 not yet closed
    both = pd.concat([out, late], ignore_index=True)
    assert pending_days_ready(both, "2025-12-09T00:00:00Z") == ["2025-12-04"]
    assert pending_days_ready(both, "2025-12-10T20:59:59Z") == ["2025-12-04"]
    assert pending_days_ready(both, "2025-12-10T21:00:00Z") == ["2025-12-04", "2025-12-08"]
    assert pending_days_ready(out[out["status"] != "pending"], LATER) == []


# ---------------------------------------------------------------- the asset: past the end of the prices


def _notes(day: str, version: str) -> pd.DataFrame:
    """Two notes of `day` with a usable call each (AAPL long, NVDA short), as daily_update writes them."""
    return pd.DataFrame(
        {
            "date": [day, day],
            "headline_id": ["h1", "h2"],
            "rollout_index": [0, 0],
            "policy_version": [version] * 2,
            "response": [
                "Trade Recommendation: Buy AAPL.\nTimeframe: 1 day.",
                "Trade Recommendation: Sell NVDA.\nTimeframe: 1 day.",
            ],
        }
    )


def _materialize_outcomes(tmp_path, day: str, prices_file: Path, monkeypatch) -> pd.DataFrame:
    import dagster as dg

    from assets.daily_rl.outcomes import rollout_outcomes
    from outcome_flywheel.market_data import MarketData
    from outcome_flywheel.storage import Warehouse

    monkeypatch.setenv("FLYWHEEL_DATA_DIR", str(tmp_path))
    warehouse = Warehouse(data_dir=str(tmp_path))
    warehouse.write("rollouts", _notes(day, f"{day}@base"), partition=day)
    warehouse.write("baseline_rollouts", _notes(day, "base:tiny-local"), partition=day)
    market_data = MarketData(data_dir=str(tmp_path), prices_file=str(prices_file))
    assert dg.materialize(
        [rollout_outcomes], partition_key=day, resources={"warehouse": warehouse, "market_data": market_data}
    ).success
    return warehouse.read("rollout_outcomes", day)


@pytest.mark.parametrize("day", ["2026-01-08", "2026-03-02"])  # the bundled data ends 2026-01-08
def test_a_window_past_the_end_of_the_bundled_prices_is_pending(day):
    from outcome_flywheel.market_data import MarketData

    start, end = price_range([day], 1)
    table, downloads = MarketData(prices_file=str(PRICES_CSV)).price_table(["AAPL", "SPY"], start, end)
    out = call_outcome(day, "AAPL", "long", table, "2026-11-24T12:00:00Z")
    assert downloads == 0 and out["status"] == "pending", out["reason"]
    assert "price data ends 2026-01-08" in out["reason"]
    # a symbol the data has never had stays final no_data
    assert call_outcome(day, "ZZZZ", "long", table, "2026-11-24T12:00:00Z")["status"] == "no_data"


def test_rollout_outcomes_past_the_end_of_the_prices_are_pending_and_mature_once_it_grows(tmp_path, monkeypatch, frame):
    short = tmp_path / "short.csv"
    frame[frame["date"] <= "2025-11-14"].to_csv(short, index=False)  # 2025-11-20's window is 11-21..11-24
    pending = _materialize_outcomes(tmp_path, "2025-11-20", short, monkeypatch)
    assert list(pending["status"]) == ["pending"] * 4, list(pending["reason"])
    assert pending["reason"].str.contains("price data ends 2025-11-14").all() and pending["return_pct"].isna().all()
    frame.to_csv(short, index=False)  # the file now reaches the exit: a re-run matures every call
    matured = _materialize_outcomes(tmp_path, "2025-11-20", short, monkeypatch)
    assert list(matured["status"]) == ["matured"] * 4
    closes = frame.set_index(["date", "symbol"])["close"]
    aapl = matured[(matured["source"] == "policy") & (matured["symbol"] == "AAPL")].iloc[0]
    assert aapl["return_pct"] == pytest.approx(
        100 * (closes[("2025-11-24", "AAPL")] / closes[("2025-11-21", "AAPL")] - 1) - 0.1, **APPROX
    )
