"""tiny-local behaves like a base model: its notes call the headline's company, on either side whatever the news."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from benchmarks.tiny_local_calls import archive_headlines, call_stats, sample_notes
from outcome_flywheel.daily_rl.notes.calls import parse_call
from outcome_flywheel.daily_rl.notes.relevance import KNOWN_SYMBOLS, headline_symbols
from outcome_flywheel.daily_rl.worlds.news import news_direction
from outcome_flywheel.models.provision.tiny_local import CORPUS, load_corpus
from scripts.make_tiny_local_corpus import make_notes


@pytest.fixture(scope="module")
def corpus() -> pd.DataFrame:
    return pd.DataFrame(load_corpus())


def test_bundled_corpus_is_what_the_script_writes():
    lines = CORPUS.read_text().splitlines()
    assert [json.loads(line) for line in lines] == make_notes()


def test_corpus_calls_the_headlines_company(corpus):
    # The model realises less than its corpus (before any training it must still call the headline's
    # company in at least half its notes), so the corpus itself holds a margin.
    figures = call_stats(corpus)
    assert figures["notes"] == len(corpus) >= 500
    assert figures["on_company"]["share"] >= 0.8, figures["on_company"]


def test_corpus_side_is_not_tied_to_the_news(corpus):
    figures = call_stats(corpus)
    for key in ("long_on_good", "long_on_bad"):
        assert figures[key]["n"] >= 200, figures[key]
        assert 0.45 <= figures[key]["share"] <= 0.55, (key, figures[key])


def test_corpus_rows_carry_their_news_and_side(corpus):
    # Good and bad news as `news_direction` reads them; every row is one or the other, follow-ups included.
    assert (corpus["news"] == [news_direction(t, s) for t, s in zip(corpus["title"], corpus["summary"])]).all()
    assert set(corpus["news"]) == {1, -1}
    assert corpus["title"].str.contains("shares").sum() >= 100  # follow-ups, worded as the archive's
    for row in corpus.itertuples():
        assert headline_symbols(row.title, row.summary)[0] == row.ticker, row.title
        call = parse_call(row.note, KNOWN_SYMBOLS)
        if row.side in ("long", "short") and call.parse_status == "ok":
            assert call.side == row.side and call.symbol == row.ticker, row.note
    # some notes take no trade, some are prose, some miss sections: room for the daily loop
    assert 0.03 < (corpus["side"] == "none").mean() < 0.1
    assert 0.3 < corpus["note"].str.contains("Stop Loss:").mean() < 0.8


def test_call_stats_counts_calls_on_the_headlines_company():
    notes = pd.DataFrame(
        [
            ("Apple beats quarterly estimates on strong cloud demand", "", "Trade Recommendation: Buy Apple."),
            ("Apple beats quarterly estimates on strong cloud demand", "", "Trade Recommendation: Sell AAPL."),
            ("Intel recalls products in consumer line", "", "Trade Recommendation: Sell Intel."),
            ("Intel recalls products in consumer line", "", "Trade Recommendation: Buy Nvidia."),  # another company
            ("Intel recalls products in consumer line", "", "Trade Recommendation: No trade on Intel."),
            (
                "INTC shares rise 2.0% after the news",
                "Follow-up: Intel recalls products in consumer line.",
                "Buy INTC.",
            ),
        ],
        columns=["title", "summary", "note"],
    )
    figures = call_stats(notes)
    assert figures["notes"] == 6
    assert (figures["on_company"]["k"], figures["on_company"]["share"]) == (4, round(4 / 6, 3))
    assert (figures["long_on_good"]["k"], figures["long_on_good"]["n"]) == (1, 2)
    assert (figures["long_on_bad"]["k"], figures["long_on_bad"]["n"]) == (1, 2)  # a follow-up carries its event's news
    lo, hi = figures["on_company"]["ci95"]
    assert lo < 4 / 6 < hi


def test_base_tiny_local_calls_the_headlines_company(tiny_model_dir):
    """The built base model, before any training, on archive headlines spread over all days."""
    headlines = archive_headlines()
    headlines = headlines.iloc[:: max(1, len(headlines) // 40)]
    figures = call_stats(sample_notes(tiny_model_dir, headlines, samples=2))
    assert figures["on_company"]["share"] >= 0.5, figures
    good, bad = figures["long_on_good"], figures["long_on_bad"]
    assert good["n"] >= 10 and bad["n"] >= 10, figures
    # no side tied to the news yet (the old corpus's model: 0.97 long on good news, 0.07 on bad)
    assert 0.2 <= good["share"] <= 0.8 and 0.2 <= bad["share"] <= 0.8, figures
