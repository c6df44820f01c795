"""Market data: offline files, the yfinance batch download with retries, and the price cache."""

from datetime import date

import pandas as pd
import pytest

from resources.market_data import MarketData, PriceCache, fetch_yfinance, read_price_file, yfinance_long


def _wide(symbols, dates):
    cols = pd.MultiIndex.from_product([["Close", "Volume"], symbols], names=["Price", "Ticker"])
    data = [[100.0 + i + j for j in range(len(symbols))] + [1.0] * len(symbols) for i in range(len(dates))]
    return pd.DataFrame(data, index=pd.DatetimeIndex(dates, name="Date"), columns=cols)


def test_file_source_csv_and_parquet(tmp_path):
    df = pd.DataFrame({"date": ["2025-11-26", "2025-11-28"], "symbol": ["spy", "spy"], "close": [600.0, 601.0], "volume": [1, 2]})
    df.to_csv(tmp_path / "p.csv", index=False)
    df.to_parquet(tmp_path / "p.parquet")
    for name in ("p.csv", "p.parquet"):
        md = MarketData(source="file", prices_file=str(tmp_path / name), data_dir=str(tmp_path))
        out, downloads = md.closes(["SPY"], "2025-11-27", "2025-12-31")
        assert downloads == 0 and out.to_dict("records") == [{"date": "2025-11-28", "symbol": "SPY", "close": 601.0}]


def test_file_without_the_columns_is_a_clear_error(tmp_path):
    pd.DataFrame({"day": ["2025-11-26"], "ticker": ["SPY"], "px": [1.0]}).to_csv(tmp_path / "bad.csv", index=False)
    with pytest.raises(ValueError, match="date, symbol, close"):
        read_price_file(tmp_path / "bad.csv")
    with pytest.raises(FileNotFoundError):
        read_price_file(tmp_path / "absent.csv")


def test_yfinance_batched_download_with_retries():
    calls, sleeps = [], []

    def flaky(symbols, **kw):
        calls.append((tuple(symbols), kw["start"], kw["end"], kw["auto_adjust"]))
        if len(calls) < 3:
            raise ConnectionError("rate limited")
        return _wide(symbols, ["2025-11-26", "2025-11-28"])

    out = fetch_yfinance(["AAPL", "SPY"], "2025-11-26", "2025-11-28", retries=4, backoff_s=1.0, download=flaky, sleep=sleeps.append)
    assert len(calls) == 3 and sleeps == [1.0, 2.0]
    assert calls[0] == (("AAPL", "SPY"), "2025-11-26", "2025-11-29", True)  # one batch; end made inclusive
    assert len(out) == 4 and set(out["symbol"]) == {"AAPL", "SPY"}

    def dead(symbols, **kw):
        raise ConnectionError("down")

    with pytest.raises(RuntimeError, match="failed after 2 tries"):
        fetch_yfinance(["SPY"], "2025-11-26", "2025-11-28", retries=2, download=dead, sleep=lambda s: None)


def test_yfinance_long_drops_missing_closes():
    wide = _wide(["AAPL", "SPY"], ["2025-11-26", "2025-11-28"])
    wide.loc[pd.Timestamp("2025-11-28"), ("Close", "AAPL")] = float("nan")
    long = yfinance_long(wide, ["AAPL", "SPY"])
    assert len(long) == 3 and long["date"].tolist()[0] == "2025-11-26"


def test_price_cache_downloads_nothing_new_on_a_rerun(tmp_path):
    fetched = []

    def fetch(symbols, start, end):
        fetched.append((tuple(symbols), start, end))
        dates = pd.bdate_range(start, end).strftime("%Y-%m-%d")
        return pd.DataFrame([{"date": d, "symbol": s, "close": 10.0} for d in dates for s in symbols])

    cache = PriceCache(tmp_path / "market_data")
    today = date(2026, 3, 1)
    a, n1 = cache.get(["AAPL", "SPY"], "2025-11-20", "2025-12-10", fetch, today=today)
    b, n2 = cache.get(["SPY", "AAPL"], "2025-11-25", "2025-12-05", fetch, today=today)
    assert (n1, n2) == (1, 0) and len(fetched) == 1
    assert len(b) < len(a) and set(b["symbol"]) == {"AAPL", "SPY"}
    # A new symbol: one batched download of only what is missing.
    _, n3 = cache.get(["AAPL", "SPY", "NVDA"], "2025-11-25", "2025-12-05", fetch, today=today)
    assert n3 == 1 and fetched[-1][0] == ("NVDA",)
    # A window ending today is only covered up to yesterday: asking again later re-fetches.
    _, n4 = cache.get(["SPY"], "2026-02-20", "2026-03-01", fetch, today=today)
    _, n5 = cache.get(["SPY"], "2026-02-20", "2026-02-28", fetch, today=today)
    assert (n4, n5) == (1, 0)
