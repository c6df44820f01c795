"""The relevance signal: is the call on a company the headline is about (daily_rl/notes/relevance.py)."""

import math

import pandas as pd
import pytest

from outcome_flywheel.daily_rl.notes.relevance import (
    call_relevance,
    headline_symbols,
    relevance_column,
    share_on_headline_company,
)


def test_headline_companies_come_from_the_title_by_name_or_ticker():
    assert headline_symbols("Apple beats estimates as iPhone sales jump", "") == ("AAPL",)
    assert headline_symbols("Shares of $NVDA slide after export curbs", None) == ("NVDA",)
    assert headline_symbols("JPMorgan and Goldman Sachs lift trading revenue", "") == ("JPM", "GS")


def test_the_summary_counts_only_when_the_title_names_no_company():
    assert headline_symbols("Chipmaker raises guidance", "Intel said on Tuesday ...") == ("INTC",)
    assert headline_symbols("Microsoft wins cloud deal", "beating Amazon and Google") == ("MSFT",)


def test_capitalised_jargon_is_not_a_company():
    assert headline_symbols("FDA and SEC rules: what the CEO said about AI", "GDP and CPI data") == ()


def test_call_relevance_values():
    assert call_relevance("Apple beats estimates", "", "AAPL") == 1.0
    assert call_relevance("Apple beats estimates", "", "MSFT") == 0.0
    assert call_relevance("Apple beats estimates", "", None) == 0.0  # no_trade / unparseable
    assert call_relevance("Markets wait for the Fed", "Stocks were flat.", "AAPL") is None
    assert call_relevance("Berkshire Hathaway buys more shares", "", "BRK.B") == 1.0


def test_relevance_column_and_share():
    frame = pd.DataFrame(
        {
            "title": ["Apple beats estimates"] * 3 + ["Markets wait for the Fed"],
            "summary": ["", "", "", "Stocks were flat."],
            "symbol": ["AAPL", "MSFT", None, "AAPL"],
        },
        index=[10, 11, 12, 13],
    )
    col = relevance_column(frame)
    assert list(col.index) == [10, 11, 12, 13]
    assert col.iloc[:3].tolist() == [1.0, 0.0, 0.0] and math.isnan(col.iloc[3])
    share, n = share_on_headline_company(frame)
    assert n == 3 and share == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="symbol"):
        relevance_column(frame.drop(columns="symbol"))
