"""Trade calls parsed from trading notes: toy-model notes, Qwen-style markdown, numbers, and the frame."""

import pandas as pd
import pytest

from outcome_flywheel.daily_rl.notes.calls import CALL_COLUMNS, TradeCall, calls_frame, parse_call
from outcome_flywheel.daily_rl.notes.companies import COMPANY_TICKERS
from outcome_flywheel.settings import PROJECT_ROOT

UNIVERSE = sorted(pd.read_csv(PROJECT_ROOT / "sample_data" / "prices" / "daily_close.csv")["symbol"].unique())

TOY_SELL = (
    "Trade Recommendation: Sell META.\n"
    "Rationale: The headline matters because the news hurts near-term earnings; sentiment is turning.\n"
    "Risk Factors: Valuation is stretched; the macro backdrop is weak.\n"
    "Timeframe: Next few sessions.\n"
    "Position Size: 4% of the portfolio.\n"
    "Stop Loss: 8% above entry."
)
TOY_BUY = (
    "Trade Recommendation: Buy AAPL.\nTimeframe: 1-2 weeks.\nPosition Size: 1% of the portfolio.\n"
    "Stop Loss: 5% below entry."
)


def call(note, universe=UNIVERSE):
    return parse_call(note, universe)


def test_toy_sell_note_reads_every_field():
    assert call(TOY_SELL) == TradeCall(
        symbol="META",
        side="short",
        timeframe="Next few sessions",
        timeframe_days=3.0,
        position_size_pct=4.0,
        stop_loss_pct=8.0,
        stop_loss_price=None,
        parse_status="ok",
        parse_reason=None,
    )


def test_toy_buy_note_and_its_variants():
    c = call(TOY_BUY)
    assert (c.symbol, c.side, c.timeframe, c.timeframe_days) == ("AAPL", "long", "1-2 weeks", 10.5)
    assert (c.position_size_pct, c.stop_loss_pct, c.parse_status) == (1.0, 5.0, "ok")
    assert call("Trade Recommendation: Buy GE.\nTimeframe: 2-4 weeks.").timeframe_days == 21.0
    assert call("Trade Recommendation: Sell XOM.\nTimeframe: 1-3 months.").timeframe_days == 60.0


def test_truncated_toy_note_keeps_what_it_has():
    c = call(
        "Trade Recommendation: Buy NVDA.\nRationale: The headline matters because momentum is impro\nTimeframe: 1-2 we"
    )
    assert (c.symbol, c.side, c.parse_status) == ("NVDA", "long", "ok")
    assert c.timeframe == "1-2 we" and c.timeframe_days is None
    cut = call("Trade Recommendation: Sell ME")  # cut inside "META": the stub is no universe symbol
    assert (cut.symbol, cut.side, cut.parse_status) == ("ME", "short", "unknown_symbol")


def test_toy_note_without_recommendation_has_no_side_and_no_symbol():
    c = call(
        "Rationale: The headline matters because estimates are moving higher; sentiment is turning.\n"
        "Timeframe: 1-3 months.\nStop Loss: 4% below entry."
    )
    assert (c.side, c.symbol, c.parse_status) == ("none", None, "no_side")
    assert "no buy / sell" in c.parse_reason and "names no ticker" in c.parse_reason
    assert (c.timeframe, c.stop_loss_pct) == ("1-3 months", 4.0)


def test_toy_prose_note_names_the_symbol_but_takes_no_side():
    c = call(
        "We are constructive on AAPL after this news. Momentum is improving, but rates may stay higher. "
        "We would wait for the open before acting."
    )
    assert (c.symbol, c.side, c.parse_status) == ("AAPL", "none", "no_side")


def test_first_sentence_gives_the_side_when_there_is_no_section():
    c = call("Go long NVDA. Demand is strong; set a stop at 7% below entry.")
    assert (c.symbol, c.side, c.stop_loss_pct, c.parse_status) == ("NVDA", "long", 7.0, "ok")
    # only the first sentence: a later "sell" does not count
    assert call("We like the setup in Nvidia. Sell NVDA into strength.").parse_status == "no_side"


def test_qwen_markdown_headers_and_bold():
    note = (
        "# Trading Note: Energy\n\n## Trade Recommendation\n**Long Chevron (CVX)**\n\n## Rationale\n"
        "Exxon Mobil (XOM) lags on refining.\n\n## Timeframe\n3-6 months\n\n## Position Size\n"
        "- 2-3% of portfolio\n\n## Stop Loss\nStop loss: $185"
    )
    c = call(note)
    assert (c.symbol, c.side, c.timeframe, c.timeframe_days) == ("CVX", "long", "3-6 months", 135.0)
    assert (c.position_size_pct, c.stop_loss_price, c.stop_loss_pct, c.parse_status) == (2.5, 185.0, None, "ok")


def test_qwen_bold_label_short_by_company_name():
    note = (
        "**Trade Recommendation:** Short Exxon Mobil (XOM)\n**Timeframe:** 2 weeks\n"
        "**Position size:** 2% to 3% of portfolio\n**Stop loss:** 118.50 (about 5% above entry)"
    )
    c = call(note)
    assert (c.symbol, c.side, c.timeframe_days, c.position_size_pct) == ("XOM", "short", 14.0, 2.5)
    assert (c.stop_loss_pct, c.stop_loss_price) == (5.0, 118.5)


def test_bullets_with_side_and_ticker_lines():
    note = "## Trade Recommendation\n- **Side:** Short\n- **Ticker:** NYSE: XOM\n- **Entry:** $110\n"
    assert (call(note).side, call(note).symbol, call(note).parse_status) == ("short", "XOM", "ok")
    dash = "- **Trade Recommendation**: Go long $NOW\n- **Timeframe**: intraday\n- Position size: 0.5%"
    c = call(dash)
    assert (c.symbol, c.side, c.timeframe_days, c.position_size_pct) == ("NOW", "long", 0.5, 0.5)
    # a bold label ends the section above it: an upside price is not the stop
    assert (
        call("**Trade Recommendation:** Buy NVDA\n**Stop Loss:** see risks\n**Upside:** $150").stop_loss_price is None
    )


@pytest.mark.parametrize(
    "note, reason_part",
    [
        ("**Trade Recommendation:** No trade — wait for confirmation before buying NVDA.", "No trade"),
        ("Recommendation: Hold / stay on the sidelines on Apple.", "Hold"),
        ("**Trade Recommendation:** Avoid Nvidia until the print.", "Avoid"),
    ],
)
def test_no_trade_recommendations(note, reason_part):
    c = call(note)
    assert (c.side, c.parse_status) == ("none", "no_trade")
    assert reason_part in c.parse_reason


def test_negation_is_not_a_long():
    c = call("**Trade Recommendation:** Do not buy Nvidia (NVDA) into the print.")
    assert (c.side, c.symbol, c.parse_status) == ("none", "NVDA", "no_trade")
    assert call("Trade Recommendation: Don't short Citigroup; buy it on dips.").side == "long"


def test_ambiguous_and_clear_first_calls():
    c = call("**Trade Recommendation:** Buy or sell AAPL depending on the open")
    assert (c.side, c.parse_status) == ("none", "ambiguous")
    assert call("Trade Recommendation: Long CVX, short XOM").side == "long"  # the first clause decides
    # "short-term" / "long-term" take no side
    assert call("Trade Recommendation: Short-term buy on Microsoft; long-term risks").side == "long"
    assert call("Trade Recommendation: Buy XOM puts").side == "short"


def test_symbol_outside_the_universe():
    c = call("**Trade Recommendation:** Buy Tesla (TSLA)")
    assert (c.symbol, c.side, c.parse_status) == ("TSLA", "long", "unknown_symbol")
    assert c.parse_reason == "names TSLA, not in the market-data universe"
    # without a universe any well-formed ticker counts
    assert parse_call("**Trade Recommendation:** Buy Tesla (TSLA)").parse_status == "ok"


def test_company_name_only_note():
    c = call("Trade Recommendation: Underweight Procter & Gamble ahead of the CPI print.")
    assert (c.symbol, c.side, c.parse_status) == ("PG", "short", "ok")
    assert call("Recommendation: accumulate McDonald’s on weakness").symbol == "MCD"
    assert call("Trade Recommendation: Buy GE Vernova").symbol == "GEV"  # not GE
    assert call("Trade Recommendation: Buy the stock\nRationale: Alphabet ad sales beat.").symbol == "GOOGL"


def test_common_words_and_acronyms_are_not_tickers():
    c = call("Trade Recommendation: BUY NOW, IT is the CEO and EPS story of the year; USD weak.")
    assert (c.symbol, c.parse_status) == (None, "no_symbol")
    assert call("Trade Recommendation: Sell AT&T (T)").symbol == "T"
    assert call("Trade Recommendation: Buy $C").symbol == "C"
    assert call("Trade Recommendation: Buy Citi").symbol == "C"
    # the recommendation's symbol wins over earlier mentions elsewhere
    assert call("Context: Apple fell.\nTrade Recommendation: Buy MSFT").symbol == "MSFT"


def test_empty_notes():
    for note in ("", "   \n\t", None):
        c = parse_call(note, UNIVERSE)
        assert (c.parse_status, c.side, c.symbol) == ("empty", "none", None)


@pytest.mark.parametrize(
    "text, days",
    [
        ("2 weeks", 14.0),
        ("3-6 months", 135.0),
        ("next few sessions", 3.0),
        ("intraday", 0.5),
        ("1 week to 1 month", 18.5),
        ("a couple of weeks", 14.0),
        ("two to four weeks", 21.0),
        ("long-term", None),
    ],
)
def test_timeframe_days(text, days):
    assert call(f"Trade Recommendation: Buy AAPL\nTimeframe: {text}").timeframe_days == days


@pytest.mark.parametrize(
    "stop, pct, price",
    [
        ("5% below entry", 5.0, None),
        ("$185", None, 185.0),
        ("185.50", None, 185.5),
        ("$1,250", None, 1250.0),
        ("5-7% below entry", 6.0, None),
        ("a close below the 50-day moving average", None, None),
        ("1.5x ATR below entry", None, None),
    ],
)
def test_stop_loss_numbers(stop, pct, price):
    c = call(f"Trade Recommendation: Buy AAPL\nStop Loss: {stop}")
    assert (c.stop_loss_pct, c.stop_loss_price) == (pct, price)


def test_company_tickers_cover_the_universe():
    assert set(UNIVERSE) <= set(COMPANY_TICKERS.values())
    assert all(k == k.lower() for k in COMPANY_TICKERS)
    for name, ticker in [
        ("exxonmobil", "XOM"),
        ("j&j", "JNJ"),
        ("p&g", "PG"),
        ("general electric", "GE"),
        ("facebook", "META"),
        ("google", "GOOGL"),
        ("spdr s&p 500 etf", "SPY"),
    ]:
        assert COMPANY_TICKERS[name] == ticker


def test_calls_frame_keeps_rows_index_and_columns():
    notes = pd.DataFrame({"headline_id": ["h1", "h2", "h3"], "response": [TOY_SELL, "", TOY_BUY]}, index=[10, 20, 30])
    out = calls_frame(notes, UNIVERSE)
    assert list(out.index) == [10, 20, 30]
    assert list(out.columns) == ["headline_id", "response"] + CALL_COLUMNS
    assert CALL_COLUMNS == [
        "symbol",
        "side",
        "timeframe",
        "timeframe_days",
        "position_size_pct",
        "stop_loss_pct",
        "stop_loss_price",
        "parse_status",
        "parse_reason",
    ]
    assert list(out["symbol"]) == ["META", None, "AAPL"]
    assert list(out["parse_status"]) == ["ok", "empty", "ok"]
    assert out["position_size_pct"].dtype == float and pd.isna(out.loc[20, "position_size_pct"])
    assert list(notes.columns) == ["headline_id", "response"]  # the input is not changed
    other = calls_frame(notes.rename(columns={"response": "note"}), text_column="note")
    assert list(other["side"]) == ["short", "none", "long"]
    assert calls_frame(notes.iloc[:0]).columns.tolist()[-len(CALL_COLUMNS) :] == CALL_COLUMNS
