"""Market data: offline files, the yfinance batch download with retries, and the price cache."""

import pandas as pd
import pytest

from outcome_flywheel.market_data import (
    BUNDLED_PRICES,
    MarketData,
    PriceCache,
    fetch_yfinance,
    read_price_file,
    yfinance_long,
)

NOW = "2026-03-01T12:00:00Z"  # a Sunday: the last closed session is Friday 2026-02-27


def _wide(symbols, dates):
    cols = pd.MultiIndex.from_product([["Close", "Volume"], symbols], names=["Price", "Ticker"])
    data = [[100.0 + i + j for j in range(len(symbols))] + [1.0] * len(symbols) for i in range(len(dates))]
    return pd.DataFrame(data, index=pd.DatetimeIndex(dates, name="Date"), columns=cols)


def test_file_source_csv_and_parquet(tmp_path):
    df = pd.DataFrame(
        {"date": ["2025-11-26", "2025-11-28"], "symbol": ["spy", "spy"], "close": [600.0, 601.0], "volume": [1, 2]}
    )
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

    out = fetch_yfinance(
        ["AAPL", "SPY"], "2025-11-26", "2025-11-28", retries=4, backoff_s=1.0, download=flaky, sleep=sleeps.append
    )
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
    a, n1 = cache.get(["AAPL", "SPY"], "2025-11-20", "2025-12-10", fetch, now=NOW)
    b, n2 = cache.get(["SPY", "AAPL"], "2025-11-25", "2025-12-05", fetch, now=NOW)
    assert (n1, n2) == (1, 0) and len(fetched) == 1
    assert len(b) < len(a) and set(b["symbol"]) == {"AAPL", "SPY"}
    # A new symbol: one batched download of only what is missing.
    _, n3 = cache.get(["AAPL", "SPY", "NVDA"], "2025-11-25", "2025-12-05", fetch, now=NOW)
    assert n3 == 1 and fetched[-1][0] == ("NVDA",)
    # A range ending after the last session closed by now (Friday 02-27; now is Sunday) is known up to
    # that session: asking for the weekend again downloads nothing.
    _, n4 = cache.get(["SPY"], "2026-02-20", "2026-03-01", fetch, now=NOW)
    _, n5 = cache.get(["SPY"], "2026-02-20", "2026-02-28", fetch, now=NOW)
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
        days = [
            d
            for d in pd.bdate_range(start, end, inclusive="left").strftime("%Y-%m-%d")
            if self.split_done or d < self.split
        ]
        cols = pd.MultiIndex.from_product([["Close"], symbols], names=["Price", "Ticker"])
        data = [[self.close(s, d) for s in symbols] for d in days]
        return pd.DataFrame(data, index=pd.DatetimeIndex(days, name="Date"), columns=cols)


def _decisions(*ts_utc):
    orders = '[{"symbol": "AAPL", "side": "buy", "weight": 0.02}]'
    return pd.DataFrame(
        [
            {"decision_id": f"d{i}", "decision_date": t[:10], "ts_utc": t, "proposal_orders_json": orders}
            for i, t in enumerate(ts_utc)
        ]
    )


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
    cache.get(["AAPL", "SPY"], "2025-06-02", "2025-06-09", fetch, now=NOW)
    cache.get(["NVDA"], "2025-06-02", "2025-06-09", fetch, now=NOW)
    first = cache.coverage()
    yahoo.split_done = True
    # AAPL is extended on both sides: ONE batched download of its whole union range replaces its rows.
    got, n = cache.get(["AAPL", "NVDA"], "2025-05-28", "2025-06-13", fetch, now=NOW)
    assert n == 1 and yahoo.calls[-1] == (("AAPL", "NVDA"), "2025-05-28", "2025-06-14")
    cov = cache.coverage()
    assert cov["AAPL"]["start"] == "2025-05-28" and cov["AAPL"]["end"] == "2025-06-13"
    assert (
        cov["AAPL"]["downloaded_at"] > first["AAPL"]["downloaded_at"]
        and cov["NVDA"]["downloaded_at"] == cov["AAPL"]["downloaded_at"]
    )
    assert cov["SPY"] == first["SPY"]  # not asked for: untouched, still one (older) download
    rows = pd.read_parquet(cache.prices_path)
    stamps = rows.groupby("symbol")["downloaded_at"].unique().to_dict()
    assert {s: list(v) for s, v in stamps.items()} == {s: [cov[s]["downloaded_at"]] for s in ("AAPL", "NVDA", "SPY")}
    assert set(got.loc[got["symbol"] == "AAPL", "close"]) == {20.0}  # one basis: all post-split adjusted
    assert list(got.columns) == ["date", "symbol", "close"]
    # Inside every symbol's range: nothing downloaded, even though SPY's rows are older than AAPL's.
    _, n = cache.get(["AAPL", "SPY"], "2025-06-02", "2025-06-09", fetch, now=NOW)
    assert n == 0 and len(yahoo.calls) == 3


def test_price_cache_keeps_old_rows_when_a_redownload_lacks_the_symbol(tmp_path):
    served = {"AAPL": 200.0, "SPY": 600.0}

    def fetch(symbols, start, end):
        days = pd.bdate_range(start, end).strftime("%Y-%m-%d")
        return pd.DataFrame(
            [{"date": d, "symbol": s, "close": served[s]} for d in days for s in symbols if s in served]
        )

    cache = PriceCache(tmp_path / "market_data")
    cache.get(["AAPL", "SPY"], "2025-06-02", "2025-06-09", fetch, now=NOW)
    before = cache.coverage()
    del served["AAPL"]  # Yahoo fails this one ticker of the batch
    got, n = cache.get(["AAPL", "SPY"], "2025-06-02", "2025-06-13", fetch, now=NOW)
    assert n == 1 and cache.coverage()["AAPL"] == before["AAPL"]  # still its old, whole download; retried next time
    assert got.loc[got["symbol"] == "AAPL", "date"].max() == "2025-06-09"
    assert cache.coverage()["SPY"]["end"] == "2025-06-13"


def test_price_cache_redownloads_a_legacy_coverage_entry(tmp_path):
    calls = []

    def fetch(symbols, start, end):
        calls.append((tuple(symbols), start, end))
        return pd.DataFrame(
            [
                {"date": d, "symbol": s, "close": 1.0}
                for d in pd.bdate_range(start, end).strftime("%Y-%m-%d")
                for s in symbols
            ]
        )

    folder = tmp_path / "market_data"
    folder.mkdir()
    # Written by the earlier cache: ranges without a download stamp, rows possibly from several downloads.
    (folder / "coverage.json").write_text('{"SPY": ["2025-06-02", "2025-06-09"]}')
    pd.DataFrame({"date": ["2025-06-02"], "symbol": ["SPY"], "close": [9.0]}).to_parquet(folder / "closes.parquet")
    cache = PriceCache(folder)
    got, n = cache.get(["SPY"], "2025-06-03", "2025-06-05", fetch, now=NOW)
    assert n == 1 and calls == [(("SPY",), "2025-06-02", "2025-06-09")]
    assert set(got["close"]) == {1.0} and cache.coverage()["SPY"]["start"] == "2025-06-02"


def test_decision_outcomes_past_the_end_of_the_price_file_are_pending(tmp_path):
    from assets.preferences.outcomes import outcome_rows

    prices = read_price_file(BUNDLED_PRICES)
    short = tmp_path / "short.csv"
    prices[prices["date"] <= "2025-06-06"].to_csv(short, index=False)
    md = MarketData(source="file", prices_file=str(short), data_dir=str(tmp_path))
    out, _ = outcome_rows(_decisions("2025-06-10T15:00:00+00:00"), md, pd.Timestamp("2025-07-01", tz="UTC"))
    assert out["status"].tolist() == ["pending"] and "price data ends 2025-06-06" in out["reason"].iloc[0]


class _TradingYahoo:
    """A fake `yf.download` that answers as Yahoo does at `now`: one row per weekday session up to now's
    date, where the row of a session still trading holds the last trade (MID), not the close."""

    MID = 555.0

    def __init__(self, now):
        self.now, self.calls = pd.Timestamp(now), []

    def close(self, day):
        return 100.0 + pd.Timestamp(day).dayofyear / 10.0

    def __call__(self, symbols, start, end, **kw):
        self.calls.append((tuple(symbols), start, end))
        today = self.now.tz_convert("America/New_York").strftime("%Y-%m-%d")
        closes_at = {"2025-11-28": "13:00"}  # the day after Thanksgiving is a half day
        days = [d for d in pd.bdate_range(start, end, inclusive="left").strftime("%Y-%m-%d") if d <= today]

        def price(d):
            close_time = pd.Timestamp(f"{d} {closes_at.get(d, '16:00')}", tz="America/New_York")
            return self.MID if d == today and self.now < close_time else self.close(d)

        cols = pd.MultiIndex.from_product([["Close"], symbols], names=["Price", "Ticker"])
        return pd.DataFrame(
            [[price(d)] * len(symbols) for d in days], index=pd.DatetimeIndex(days, name="Date"), columns=cols
        )


def _fetch(yahoo):
    return lambda syms, s, e: fetch_yfinance(syms, s, e, download=yahoo, sleep=lambda _: None)


@pytest.mark.parametrize(
    "day, mid_session, after_close",
    [
        ("2025-06-10", "2025-06-10T15:00:00Z", "2025-06-10T21:30:00Z"),  # a Tuesday: closes 16:00 New York (20:00 UTC)
        ("2025-11-28", "2025-11-28T17:30:00Z", "2025-11-28T18:05:00Z"),  # a half day: closes 13:00 New York (18:00 UTC)
    ],
)
def test_price_cache_never_stores_or_serves_a_session_still_trading(tmp_path, day, mid_session, after_close):
    cache = PriceCache(tmp_path / "market_data")
    start = (pd.Timestamp(day) - pd.Timedelta(days=8)).strftime("%Y-%m-%d")
    morning = _TradingYahoo(mid_session)
    got, n = cache.get(["AAPL", "SPY"], start, day, _fetch(morning), now=mid_session)
    assert n == 1 and got["date"].max() < day and _TradingYahoo.MID not in set(got["close"])
    stored = pd.read_parquet(cache.prices_path)
    assert stored["date"].max() < day and _TradingYahoo.MID not in set(stored["close"])
    assert cache.coverage()["SPY"]["end"] < day
    # Later the same day, once the session has closed: its close is downloaded, not the morning's price.
    evening = _TradingYahoo(after_close)
    got, n = cache.get(["AAPL", "SPY"], start, day, _fetch(evening), now=after_close)
    assert n == 1 and len(evening.calls) == 1
    closes = got[got["date"] == day].set_index("symbol")["close"].to_dict()
    assert closes == {"AAPL": evening.close(day), "SPY": evening.close(day)}
    assert cache.coverage()["SPY"]["end"] == day
    # and asking again downloads nothing
    _, n = cache.get(["AAPL", "SPY"], start, day, _fetch(evening), now=after_close)
    assert n == 0 and len(evening.calls) == 1


def test_a_partial_bar_in_an_older_cache_is_never_served(tmp_path):
    folder = tmp_path / "market_data"
    folder.mkdir()
    stamp = "2025-06-10T15:00:00.000000+00:00"
    # What the earlier cache wrote at 11:00 New York on 06-10: the 06-10 bar stored, the range only to 06-09.
    rows = [{"date": d, "symbol": "SPY", "close": 600.0, "downloaded_at": stamp} for d in ("2025-06-06", "2025-06-09")]
    rows.append({"date": "2025-06-10", "symbol": "SPY", "close": _TradingYahoo.MID, "downloaded_at": stamp})
    pd.DataFrame(rows).to_parquet(folder / "closes.parquet")
    (folder / "coverage.json").write_text(
        '{"SPY": {"start": "2025-06-06", "end": "2025-06-09", "downloaded_at": "%s"}}' % stamp
    )
    cache = PriceCache(folder)
    got, n = cache.get(
        ["SPY"], "2025-06-06", "2025-06-09", _fetch(_TradingYahoo("2025-06-10T21:30:00Z")), now="2025-06-10T21:30:00Z"
    )
    assert n == 0 and got["date"].tolist() == ["2025-06-06", "2025-06-09"]
    assert cache.served(["SPY"], "2025-06-10T21:30:00Z")["close"].tolist() == [600.0, 600.0]


def test_a_close_yahoo_has_not_published_yet_is_asked_for_again(tmp_path):
    cache = PriceCache(tmp_path / "market_data")
    late = _TradingYahoo("2025-06-09T23:00:00Z")  # Yahoo still lacks Tuesday's bar at 17:05 New York
    got, n = cache.get(["SPY"], "2025-06-02", "2025-06-10", _fetch(late), now="2025-06-10T21:05:00Z")
    assert n == 1 and got["date"].max() == "2025-06-09" and cache.coverage()["SPY"]["end"] == "2025-06-09"
    published = _TradingYahoo("2025-06-10T21:30:00Z")
    got, n = cache.get(["SPY"], "2025-06-02", "2025-06-10", _fetch(published), now="2025-06-10T21:30:00Z")
    assert n == 1 and got["date"].max() == "2025-06-10"


def test_yfinance_outcome_computed_mid_session_then_after_the_close(tmp_path, monkeypatch):
    """The issue's sequence: a morning run downloads while the exit session trades; the 17:30 run must
    price the exit at that session's close, not at the morning's price."""
    import yfinance

    from outcome_flywheel.daily_rl.notes.outcomes import call_outcome, price_range

    md = MarketData(source="yfinance", data_dir=str(tmp_path))
    start, end = price_range(["2025-06-06"], 1)  # a Friday's call: entry Monday 06-09, exit Tuesday 06-10
    for now, status in (("2025-06-10T15:00:00Z", "pending"), ("2025-06-10T21:30:00Z", "matured")):
        yahoo = _TradingYahoo(now)
        monkeypatch.setattr(yfinance, "download", yahoo)
        table, downloads = md.price_table(["AAPL", "SPY"], start, end, now)
        out = call_outcome("2025-06-06", "AAPL", "long", table, now)
        assert downloads == 1 and out["status"] == status, out["reason"]
    assert out["exit_close"] == yahoo.close("2025-06-10") != _TradingYahoo.MID
