"""The relevance signal: is the call on a company the headline is about (daily_rl/notes/relevance.py)."""

import math

import pandas as pd
import pytest

from outcome_flywheel.daily_rl.notes.calls import calls_frame
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
    assert call_relevance("Apple beats estimates", "", "AAPL", "ok") == 1.0
    assert call_relevance("Apple beats estimates", "", "MSFT", "ok") == 0.0
    assert call_relevance("Apple beats estimates", "", None, "no_symbol") == 0.0
    assert call_relevance("Markets wait for the Fed", "Stocks were flat.", "AAPL", "ok") is None
    assert call_relevance("Berkshire Hathaway buys more shares", "", "BRK.B", "ok") == 1.0


@pytest.mark.parametrize(
    "note",
    [
        "Trade Recommendation: No trade on Apple; wait for the open.",
        "Trade Recommendation: Apple (AAPL), 2 days.",  # names the company, takes no side
    ],
)
def test_naming_the_company_without_a_side_is_not_a_call_on_it(note):
    """The parser keeps the symbol of a note that abstains ("No trade on Apple"), so relevance must read
    the status too: scoring it 1 paid abstaining on the company as much as calling it."""
    frame = calls_frame(pd.DataFrame({"response": [note, "Trade Recommendation: Long Apple (AAPL), 2 days."]}))
    assert frame["symbol"].tolist() == ["AAPL", "AAPL"] and frame["parse_status"].iloc[0] != "ok"
    assert call_relevance("Apple beats estimates", "", frame["symbol"][0], frame["parse_status"][0]) == 0.0
    col = relevance_column(frame.assign(title="Apple beats estimates", summary=""))
    assert col.tolist() == [0.0, 1.0]


def test_relevance_column_and_share():
    frame = pd.DataFrame(
        {
            "title": ["Apple beats estimates"] * 3 + ["Markets wait for the Fed"],
            "summary": ["", "", "", "Stocks were flat."],
            "symbol": ["AAPL", "MSFT", None, "AAPL"],
            "parse_status": ["ok", "ok", "no_trade", "ok"],
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
    with pytest.raises(ValueError, match="parse_status"):
        relevance_column(frame.drop(columns="parse_status"))
