"""Is a note's call on a company the headline is about? The `relevance` reward signal and the
evaluation's "share of calls on the headline's company" both read it from here.

The headline's companies are read with the trade-call parser's alias map (`calls.COMPANY_TICKERS`: every
bundled company's names and ticker, plus ticker forms such as "$AAPL" or "(NYSE: C)"): the title's
companies, or the summary's when the title names none (a summary often names rivals and peers as
well, the title names the subject). Only symbols the alias map knows count, so jargon in capitals
("CEO", "FDA") never makes a headline "about" something.

relevance = 1.0  the note calls a side (parse_status "ok") on one of the headline's companies
          = 0.0  the call is on another symbol, or the note takes no side: "No trade on Pfizer" names the
                 headline's company but is not a call on it, so it scores 0 like an unparseable note (were
                 it 1, the signal would pay abstaining on the company as much as calling it)
          = None the headline names no company the map knows: there is no right company to call,
                 so the signal is undefined and drops out of the reward like any sparse signal
"""

from __future__ import annotations

import math

import pandas as pd

from outcome_flywheel.daily_rl.notes.companies import COMPANY_TICKERS, _candidates

KNOWN_SYMBOLS: frozenset[str] = frozenset(COMPANY_TICKERS.values())


def _named(text: object) -> tuple[str, ...]:
    if not isinstance(text, str) or not text.strip():
        return ()
    found = []
    for _, symbol, known, _strong in _candidates(text, set(KNOWN_SYMBOLS)):
        if known and symbol not in found:
            found.append(symbol)
    return tuple(found)


def headline_symbols(title: object, summary: object = None) -> tuple[str, ...]:
    """The known symbols the headline is about, in order of appearance: the title's, else the summary's."""
    return _named(title) or _named(summary)


def _on(companies: tuple[str, ...], symbol: object, status: object) -> float:
    if status != "ok" or not isinstance(symbol, str) or not symbol:
        return 0.0  # no side taken (no_trade, no_side) or no call read: not a call on anything
    return 1.0 if symbol.upper().replace(".", "-") in companies else 0.0


def call_relevance(
    headline_title: object, headline_summary: object, call_symbol: object, parse_status: object
) -> float | None:
    """1.0 if the call (its symbol and `parse_status`, as `calls.parse_call` reads them) takes a side on one
    of the headline's companies, 0.0 if it is on another or takes none, None if the headline names no
    company the alias map knows."""
    companies = headline_symbols(headline_title, headline_summary)
    return _on(companies, call_symbol, parse_status) if companies else None


def relevance_column(
    frame: pd.DataFrame,
    title: str = "title",
    summary: str = "summary",
    symbol: str = "symbol",
    status: str = "parse_status",
) -> pd.Series:
    """`call_relevance` of each row as floats (NaN where the headline names no known company), on the
    frame's index. The frame needs the headline's title and summary and the parsed call's symbol and
    status (`calls.calls_frame` adds both)."""
    missing = [c for c in (title, summary, symbol, status) if c not in frame.columns]
    if missing:
        raise ValueError(f"relevance needs columns {missing}; the frame has {list(frame.columns)}")
    cache: dict[tuple, tuple[str, ...]] = {}  # eight notes share each headline
    values = []
    for t, s, sym, st in zip(frame[title], frame[summary], frame[symbol], frame[status]):
        key = (t if isinstance(t, str) else None, s if isinstance(s, str) else None)
        companies = cache.setdefault(key, headline_symbols(*key))
        values.append(_on(companies, sym, st) if companies else math.nan)
    return pd.Series(values, index=frame.index, dtype=float, name="relevance")


def share_on_headline_company(frame: pd.DataFrame, **columns: str) -> tuple[float, int]:
    """(share of calls on the headline's company, number of notes it is over): the mean relevance over
    notes whose headline names a known company; (nan, 0) when none does."""
    values = relevance_column(frame, **columns).dropna()
    return (float(values.mean()) if len(values) else math.nan), int(len(values))
