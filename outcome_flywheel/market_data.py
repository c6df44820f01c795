"""Daily closes for the flywheel's T+5 outcomes.

Two sources, one shape (a long frame `date, symbol, close`; `close` adjusted for splits and
dividends, which is what returns need):
  - `file` (default): an offline CSV or Parquet with columns `date, symbol, close`
    (FLYWHEEL_PRICES_FILE; default the bundled real prices in `sample_data/prices/`, see the
    PROVENANCE.md there).
  - `yfinance`: Yahoo Finance, one batched `yf.download` for every symbol and date the run needs,
    retried with exponential backoff. Downloads go to a cache under
    `$FLYWHEEL_DATA_DIR/market_data/`, with the range each symbol is known for, so a re-run over
    the same decisions downloads nothing. All of a symbol's cached closes come from one download
    (one adjustment basis): a symbol whose range grows is downloaded again over its whole range.
    A session's row is never stored or served before that session has closed on the XNYS calendar
    (half days at 13:00 New York): Yahoo's bar of a session still trading is a price, not a close.
A missing close stays missing: nothing here fills, interpolates or invents a price. `price_table` also
says how far each symbol's data reaches, so a window past the end of the data is pending, not no_data.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import Callable, Sequence

import pandas as pd

from outcome_flywheel.settings import SAMPLE_DATA, resolve_path
from outcome_flywheel.storage import atomic_write_bytes
from outcome_flywheel.trading_sessions import PriceTable, last_closed_session, normalize_prices, session_on_or_before

BUNDLED_PRICES = SAMPLE_DATA / "prices" / "daily_close.csv"
SOURCES = ("file", "yfinance")

FetchFn = Callable[[list[str], str, str], pd.DataFrame]  # (symbols, start, end inclusive) -> long frame
CACHE_COLUMNS = ["date", "symbol", "close", "downloaded_at"]
Clock = datetime | pd.Timestamp | str | None  # None: the current time


def utc_now(now: Clock = None) -> pd.Timestamp:
    """`now` as a UTC timestamp (a naive one is taken as UTC); the current time when None."""
    ts = pd.Timestamp.now(tz="UTC") if now is None else pd.Timestamp(now)
    return ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")


def date_spans(prices: pd.DataFrame) -> dict[str, tuple[str, str]]:
    """{symbol: (first date, last date)} of a long frame `date, symbol, close`."""
    if prices.empty:
        return {}
    grouped = prices.groupby("symbol")["date"]
    return {s: (lo, hi) for s, lo, hi in zip(grouped.min().index, grouped.min(), grouped.max())}


def read_price_file(path: str | Path) -> pd.DataFrame:
    """A CSV or Parquet with at least `date, symbol, close`; a clear error otherwise."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"price file {path} does not exist (FLYWHEEL_PRICES_FILE)")
    df = pd.read_parquet(path) if path.suffix.lower() in (".parquet", ".pq") else pd.read_csv(path)
    return normalize_prices(df, f"price file {path}")


def yfinance_long(raw: pd.DataFrame, symbols: Sequence[str]) -> pd.DataFrame:
    """`yf.download(...)` output (wide, columns (field, ticker) or flat) -> long `date, symbol, close`."""
    if raw is None or raw.empty:
        return pd.DataFrame(columns=["date", "symbol", "close"])
    if isinstance(raw.columns, pd.MultiIndex):
        level = 0 if "Close" in raw.columns.get_level_values(0) else 1
        close = raw.xs("Close", axis=1, level=level)
    else:
        close = raw[["Close"]].rename(columns={"Close": symbols[0]})
    close.index = pd.to_datetime(close.index).strftime("%Y-%m-%d")
    long = close.stack(future_stack=True).rename("close").reset_index()
    long.columns = ["date", "symbol", "close"]
    return long.dropna(subset=["close"]).reset_index(drop=True)


def fetch_yfinance(
    symbols: list[str],
    start: str,
    end: str,
    retries: int = 4,
    backoff_s: float = 2.0,
    download: Callable | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> pd.DataFrame:
    """One batched download of all `symbols` over [start, end], retried with exponential backoff."""
    if download is None:
        import yfinance as yf

        download = yf.download
    end_exclusive = (date.fromisoformat(end) + timedelta(days=1)).isoformat()  # yfinance's end is exclusive
    last_error: Exception | None = None
    for attempt in range(retries):
        try:
            raw = download(
                symbols,
                start=start,
                end=end_exclusive,
                auto_adjust=True,
                progress=False,
                group_by="column",
                threads=False,
            )
            if raw is not None and not raw.empty:
                return yfinance_long(raw, symbols)
            last_error = RuntimeError("yfinance returned no rows")
        except Exception as err:  # network errors, rate limits: retry
            last_error = err
        if attempt < retries - 1:
            sleep(backoff_s * 2**attempt)
    raise RuntimeError(
        f"yfinance download of {len(symbols)} symbols {start}..{end} failed after {retries} tries: {last_error}"
    )


class PriceCache:
    """Closes already downloaded (`closes.parquet`, each row stamped with its `downloaded_at`) and, per
    symbol, the range it is known for and the one download all its rows come from (`coverage.json`:
    `{symbol: {start, end, downloaded_at}}`). A symbol whose range is already known is not fetched
    again; one whose range must grow is fetched again over its whole (union) range and all its rows
    replaced. Only closed sessions count: nothing is downloaded, stored or served after the last XNYS
    session closed by `now`, and a range is only known up to that session, so the day's close is
    downloaded once the session has closed, never taken from a bar of the session still trading.
    A symbol is only known up to the last close it got (a close Yahoo has not published yet is
    asked for again next time)."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.prices_path = self.folder / "closes.parquet"
        self.coverage_path = self.folder / "coverage.json"

    def coverage(self) -> dict[str, dict[str, str]]:
        """Per symbol: {start, end, downloaded_at}. An entry in the earlier `[start, end]` form (rows
        possibly from several downloads) has downloaded_at None: that symbol is downloaded again whole."""
        raw = json.loads(self.coverage_path.read_text()) if self.coverage_path.exists() else {}
        return {
            s: v if isinstance(v, dict) else {"start": v[0], "end": v[1], "downloaded_at": None} for s, v in raw.items()
        }

    def _prices(self) -> pd.DataFrame:
        df = pd.read_parquet(self.prices_path) if self.prices_path.exists() else pd.DataFrame(columns=CACHE_COLUMNS)
        return df.reindex(columns=CACHE_COLUMNS)  # an earlier cache has no downloaded_at

    def missing(self, symbols: Sequence[str], start: str, end: str) -> list[str]:
        cov = self.coverage()
        return sorted(
            s
            for s in set(symbols)
            if s not in cov or cov[s]["downloaded_at"] is None or cov[s]["start"] > start or cov[s]["end"] < end
        )

    def served(self, symbols: Sequence[str], now: Clock = None) -> pd.DataFrame:
        """Every cached row of `symbols` inside its symbol's known range and closed by `now` (a row an
        earlier cache stored beyond its range, such as a bar of a session still trading, is left out)."""
        prices, cov, closed = self._prices(), self.coverage(), last_closed_session(utc_now(now)) or ""
        prices = prices[prices["symbol"].isin(set(symbols)) & (prices["date"] <= closed)]
        end = prices["symbol"].map(lambda s: cov[s]["end"] if s in cov else "")
        return prices[prices["date"] <= end][["date", "symbol", "close"]].reset_index(drop=True)

    def get(
        self, symbols: Sequence[str], start: str, end: str, fetch: FetchFn, now: Clock = None
    ) -> tuple[pd.DataFrame, int]:
        """(closes `date, symbol, close` for symbols over [start, end], number of downloads made: 0 or 1)."""
        now = utc_now(now)
        # The range ends at its last session closed by `now` (a weekend or holiday end would never
        # get a row, and the range would look short on every run).
        closed = last_closed_session(now)
        end = session_on_or_before(min(end, closed)) if closed else None
        if end is None or end < start:  # no session of the range has closed: nothing to download
            return pd.DataFrame(columns=["date", "symbol", "close"]), 0
        need = self.missing(symbols, start, end)
        prices = self._prices()
        downloads = 0
        # Returns are per symbol (exit / entry of one symbol; vs SPY is a difference of such returns),
        # so symbols may come from different downloads: a call that needs no new range downloads
        # nothing, even where one symbol's rows are older than another's. Within a symbol, though,
        # every close must come from ONE download: Yahoo's auto_adjust rescales all earlier closes
        # after a split or dividend, and an entry close from one download against an exit close from
        # a later one is wrong (a 10:1 split turns a flat price into -90%).
        if need:
            cov = self.coverage()
            fetch_start = min([start] + [cov[s]["start"] for s in need if s in cov])
            fetch_end = max([end] + [cov[s]["end"] for s in need if s in cov])
            fresh = fetch(need, fetch_start, fetch_end)
            fresh = fresh[fresh["date"] <= fetch_end]  # a bar of a session not closed yet is not a close
            downloads = 1
            stamp = datetime.now(timezone.utc).isoformat(timespec="microseconds")
            # A symbol the batch returned nothing for (one failed ticker) keeps its old rows and range
            # whole, and is asked for again next time; one never seen is recorded, so an unknown
            # ticker is not downloaded on every run.
            cached = set(prices["symbol"])
            got = set(fresh["symbol"]) if len(fresh) else set()
            replaced = {s for s in need if s in got or s not in cached}
            fresh = fresh[fresh["symbol"].isin(replaced)].assign(downloaded_at=stamp)[CACHE_COLUMNS]
            kept = prices[~prices["symbol"].isin(replaced)]
            prices = pd.concat([kept, fresh], ignore_index=True) if len(kept) else fresh.reset_index(drop=True)
            prices = prices.sort_values(["symbol", "date"]).reset_index(drop=True)
            atomic_write_bytes(self.prices_path, prices.to_parquet(index=False))
            last_row = fresh.groupby("symbol")["date"].max().to_dict() if len(fresh) else {}
            for s in replaced:  # known up to its last close: one Yahoo has not published yet is asked for again
                cov[s] = {"start": fetch_start, "end": last_row.get(s, fetch_end), "downloaded_at": stamp}
            atomic_write_bytes(self.coverage_path, json.dumps(cov, sort_keys=True, indent=1).encode())
        sel = self.served(symbols, now)
        return sel[(sel["date"] >= start) & (sel["date"] <= end)].reset_index(drop=True), downloads


@dataclass
class MarketData:
    """Daily adjusted closes: an offline file (default: the bundled real prices) or yfinance."""

    source: str = field(default="file", metadata={"help": "FLYWHEEL_MARKET_DATA: file | yfinance."})
    prices_file: str = field(
        default=str(BUNDLED_PRICES), metadata={"help": "FLYWHEEL_PRICES_FILE: CSV or Parquet with date, symbol, close."}
    )
    data_dir: str = field(
        default="./data", metadata={"help": "FLYWHEEL_DATA_DIR; the yfinance cache lives in market_data/ under it."}
    )
    retries: int = field(default=4, metadata={"help": "yfinance download attempts."})
    backoff_seconds: float = field(default=2.0, metadata={"help": "First retry wait; doubles each attempt."})

    def cache(self) -> PriceCache:
        return PriceCache(resolve_path(self.data_dir) / "market_data")

    def describe(self) -> str:
        return (
            f"yfinance (cache {self.cache().folder})"
            if self.source == "yfinance"
            else f"file {resolve_path(self.prices_file)}"
        )

    def universe(self) -> set[str] | None:
        """The symbols there are prices for: the file's symbols; None for yfinance (any ticker may
        exist there: an unknown one gets no prices, and its outcome says so)."""
        if self.source == "file":
            return set(read_price_file(resolve_path(self.prices_file))["symbol"])
        if self.source == "yfinance":
            return None
        raise ValueError(f"FLYWHEEL_MARKET_DATA must be one of {SOURCES}, got {self.source!r}")

    def closes(self, symbols: Sequence[str], start: str, end: str, now: Clock = None) -> tuple[pd.DataFrame, int]:
        """(long frame of closes for `symbols` over [start, end], downloads made). `now` (default: the
        current time) decides which yfinance sessions have closed; the file is taken as it is."""
        symbols = sorted({s.upper() for s in symbols})
        if self.source == "file":
            df = read_price_file(resolve_path(self.prices_file))
            sel = df[df["symbol"].isin(symbols) & (df["date"] >= start) & (df["date"] <= end)]
            return sel.reset_index(drop=True), 0
        if self.source == "yfinance":
            fetch = lambda syms, s, e: fetch_yfinance(syms, s, e, retries=self.retries, backoff_s=self.backoff_seconds)  # noqa: E731
            return self.cache().get(symbols, start, end, fetch, now)
        raise ValueError(f"FLYWHEEL_MARKET_DATA must be one of {SOURCES}, got {self.source!r}")

    def price_table(self, symbols: Sequence[str], start: str, end: str, now: Clock = None) -> tuple[PriceTable, int]:
        """(the closes of `closes` as a PriceTable that also knows each symbol's whole span in the
        source, downloads made). A symbol whose data ends before `start` is then known and its
        outcome is pending until the data reaches the exit, not "no prices at all" (final)."""
        prices, downloads = self.closes(symbols, start, end, now)
        symbols = sorted({s.upper() for s in symbols})
        if self.source == "file":
            df = read_price_file(resolve_path(self.prices_file))
            spans = date_spans(df[df["symbol"].isin(symbols) & df["close"].notna() & (df["close"] > 0)])
        else:
            spans = date_spans(self.cache().served(symbols, now))
        return PriceTable(prices, spans), downloads
