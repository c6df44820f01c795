"""Market data: offline files, the yfinance batch download with retries, and the price cache."""

from datetime import date

import pandas as pd
import pytest

from outcome_flywheel.market_data import MarketData, PriceCache, fetch_yfinance, read_price_file, yfinance_long


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


class _SplittingYahoo:
    """A fake `yf.download` whose AAPL has a 10:1 split (ex-date `split`) once `split_done` is set:
    like Yahoo's auto_adjust, a download after the split returns every earlier close divided by 10.
    True unadjusted closes: AAPL 200 before the split, 20 from it on (a 0% move); SPY 600."""

    def __init__(self, split="2025-06-12"):
        self.split, self.split_done, self.calls = split, False, []

    def close(self, symbol, day):
        if symbol != "AAPL":
            return 600.0
        raw = 200.0 if day < self.split else 20.0
        return raw / 10.0 if self.split_done and day < self.split else raw

    def __call__(self, symbols, start, end, **kw):
        self.calls.append((tuple(symbols), start, end))
        days = [d for d in pd.bdate_range(start, end, inclusive="left").strftime("%Y-%m-%d") if self.split_done or d < self.split]
        cols = pd.MultiIndex.from_product([["Close"], symbols], names=["Price", "Ticker"])
        data = [[self.close(s, d) for s in symbols] for d in days]
        return pd.DataFrame(data, index=pd.DatetimeIndex(days, name="Date"), columns=cols)


def _decisions(*ts_utc):
    orders = '[{"symbol": "AAPL", "side": "buy", "weight": 0.02}]'
    return pd.DataFrame([
        {"decision_id": f"d{i}", "decision_date": t[:10], "ts_utc": t, "proposal_orders_json": orders} for i, t in enumerate(ts_utc)
    ])


def test_a_split_between_two_downloads_changes_no_matured_outcome(tmp_path, monkeypatch):
    import yfinance

    from assets.preferences.outcomes import outcome_rows

    yahoo = _SplittingYahoo()
    monkeypatch.setattr(yfinance, "download", yahoo)
    md = MarketData(source="yfinance", data_dir=str(tmp_path))
    now = pd.Timestamp("2025-07-01", tz="UTC")
    a, b = "2025-06-02T15:00:00+00:00", "2025-06-06T15:00:00+00:00"  # windows 06-02..06-09 and 06-06..06-13
    # Download 1, before the split: the 06-02 partition caches AAPL 06-02..06-09 at 200.
    first, n1 = outcome_rows(_decisions(a), md, now)
    assert n1 == 1 and first["status"].tolist() == ["matured"] and first["return_pct"].tolist() == [0.0]
    yahoo.split_done = True
    # Download 2, after the split: the 06-06 partition needs closes up to 06-13.
    second, n2 = outcome_rows(_decisions(b), md, now)
    assert n2 == 1 and second["return_pct"].tolist() == pytest.approx([0.0])
    # Both partitions again (a backfill): d0's entry 06-02 was cached by download 1, its exit 06-09 by
    # download 2. Nothing new to download; the outcome must still be the true 0%, not -90%.
    out, n3 = outcome_rows(_decisions(a, b), md, now)
    assert n3 == 0 and len(yahoo.calls) == 2
    assert out["status"].tolist() == ["matured", "matured"]
    assert out["exit_date"].tolist() == ["2025-06-09", "2025-06-13"]
    assert out["return_pct"].tolist() == pytest.approx([0.0, 0.0])
    assert out["vs_spy_pct"].tolist() == pytest.approx([0.0, 0.0])


def test_price_cache_keeps_one_download_per_symbol(tmp_path):
    yahoo = _SplittingYahoo()
    fetch = lambda syms, s, e: fetch_yfinance(syms, s, e, download=yahoo, sleep=lambda _: None)  # noqa: E731
    cache = PriceCache(tmp_path / "market_data")
    today = date(2026, 3, 1)
    cache.get(["AAPL", "SPY"], "2025-06-02", "2025-06-09", fetch, today=today)
    cache.get(["NVDA"], "2025-06-02", "2025-06-09", fetch, today=today)
    first = cache.coverage()
    yahoo.split_done = True
    # AAPL is extended on both sides: ONE batched download of its whole union range replaces its rows.
    got, n = cache.get(["AAPL", "NVDA"], "2025-05-28", "2025-06-13", fetch, today=today)
    assert n == 1 and yahoo.calls[-1] == (("AAPL", "NVDA"), "2025-05-28", "2025-06-14")
    cov = cache.coverage()
    assert cov["AAPL"]["start"] == "2025-05-28" and cov["AAPL"]["end"] == "2025-06-13"
    assert cov["AAPL"]["downloaded_at"] > first["AAPL"]["downloaded_at"] and cov["NVDA"]["downloaded_at"] == cov["AAPL"]["downloaded_at"]
    assert cov["SPY"] == first["SPY"]  # not asked for: untouched, still one (older) download
    rows = pd.read_parquet(cache.prices_path)
    stamps = rows.groupby("symbol")["downloaded_at"].unique().to_dict()
    assert {s: list(v) for s, v in stamps.items()} == {s: [cov[s]["downloaded_at"]] for s in ("AAPL", "NVDA", "SPY")}
    assert set(got.loc[got["symbol"] == "AAPL", "close"]) == {20.0}  # one basis: all post-split adjusted
    assert list(got.columns) == ["date", "symbol", "close"]
    # Inside every symbol's range: nothing downloaded, even though SPY's rows are older than AAPL's.
    _, n = cache.get(["AAPL", "SPY"], "2025-06-02", "2025-06-09", fetch, today=today)
    assert n == 0 and len(yahoo.calls) == 3


def test_price_cache_keeps_old_rows_when_a_redownload_lacks_the_symbol(tmp_path):
    served = {"AAPL": 200.0, "SPY": 600.0}

    def fetch(symbols, start, end):
        days = pd.bdate_range(start, end).strftime("%Y-%m-%d")
        return pd.DataFrame([{"date": d, "symbol": s, "close": served[s]} for d in days for s in symbols if s in served])

    cache = PriceCache(tmp_path / "market_data")
    today = date(2026, 3, 1)
    cache.get(["AAPL", "SPY"], "2025-06-02", "2025-06-09", fetch, today=today)
    before = cache.coverage()
    del served["AAPL"]  # Yahoo fails this one ticker of the batch
    got, n = cache.get(["AAPL", "SPY"], "2025-06-02", "2025-06-13", fetch, today=today)
    assert n == 1 and cache.coverage()["AAPL"] == before["AAPL"]  # still its old, whole download; retried next time
    assert got.loc[got["symbol"] == "AAPL", "date"].max() == "2025-06-09"
    assert cache.coverage()["SPY"]["end"] == "2025-06-13"


def test_price_cache_redownloads_a_legacy_coverage_entry(tmp_path):
    calls = []

    def fetch(symbols, start, end):
        calls.append((tuple(symbols), start, end))
        return pd.DataFrame([{"date": d, "symbol": s, "close": 1.0} for d in pd.bdate_range(start, end).strftime("%Y-%m-%d") for s in symbols])

    folder = tmp_path / "market_data"
    folder.mkdir()
    # Written by the earlier cache: ranges without a download stamp, rows possibly from several downloads.
    (folder / "coverage.json").write_text('{"SPY": ["2025-06-02", "2025-06-09"]}')
    pd.DataFrame({"date": ["2025-06-02"], "symbol": ["SPY"], "close": [9.0]}).to_parquet(folder / "closes.parquet")
    cache = PriceCache(folder)
    got, n = cache.get(["SPY"], "2025-06-03", "2025-06-05", fetch, today=date(2026, 3, 1))
    assert n == 1 and calls == [(("SPY",), "2025-06-02", "2025-06-09")]
    assert set(got["close"]) == {1.0} and cache.coverage()["SPY"]["start"] == "2025-06-02"
