"""Synthetic worlds (`outcome_flywheel/daily_rl/worlds.py`, `flywheel make-world`): each world file has
the rule it claims, as the daily loop will see it (the loop's own price reader and call outcomes), and
nothing else; seeded; every option changes what it says."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from outcome_flywheel.daily_rl.news import news_direction
from outcome_flywheel.daily_rl.outcomes import call_outcome, call_window
from outcome_flywheel.daily_rl.worlds import (
    WorldConfig, archive_events, make_world, manifest_path, planted_moves, price_csv, write_world,
)
from outcome_flywheel.market_data import BUNDLED_PRICES, MarketData, read_price_file
from scripts.make_tiny_local_corpus import NEGATIVE, POSITIVE

NOW = "2030-01-01"  # every window of the archive has closed


@pytest.fixture(scope="module")
def events() -> pd.DataFrame:
    return archive_events()


@pytest.fixture(scope="module")
def worlds(tmp_path_factory) -> dict[str, tuple]:
    """The three kinds of seed 5 written to disk: {kind: (path, manifest)}."""
    folder = tmp_path_factory.mktemp("worlds")
    out = {}
    for kind in ("news", "inverted", "null"):
        prices, manifest = make_world(WorldConfig(kind=kind, seed=5))
        path = folder / f"{kind}.csv"
        out[kind] = (path, write_world(path, prices, manifest))
    return out


def returns(path) -> pd.DataFrame:
    """Each symbol's close-to-close return in percent, a date x symbol frame (first date NaN)."""
    wide = read_price_file(path).pivot(index="date", columns="symbol", values="close")
    return wide.pct_change() * 100.0


def net_agrees(events: pd.DataFrame) -> np.ndarray:
    """Per headline with news: does the summed news of its company on its landing session have its sign?
    (Not where good and bad news of one company share a window, e.g. over a weekend.)"""
    news = events[events["news"] != 0]
    net = news.groupby(["move_session", "symbol"])["news"].transform("sum")
    return (np.sign(net) == news["news"]).to_numpy()


def news_calls_hit(path, events: pd.DataFrame) -> np.ndarray:
    """For every archive headline with news: did a call on its company on the news' side (long on good,
    short on bad) beat SPY net of cost, through the loop's own price reader and outcome function?"""
    prices, _ = MarketData(prices_file=str(path)).price_table(sorted(set(events["symbol"]) | {"SPY"}), "2025-10-01", "2026-01-08")
    hits = []
    for e in events[events["news"] != 0].itertuples(index=False):
        out = call_outcome(e.date, e.symbol, "long" if e.news > 0 else "short", prices, NOW)
        assert out["status"] == "matured", out
        hits.append(out["vs_spy_pct"] > 0)
    return np.array(hits)


# -- what counts as good or bad news -----------------------------------------------------------------


def test_every_corpus_event_template_reads_as_its_news():
    fill = dict(co="Apple", seg="cloud", pct=7, n=12)
    for title, summary in POSITIVE:
        assert news_direction(title.format(**fill), summary.format(**fill)) == 1, title
    for title, summary in NEGATIVE:
        assert news_direction(title.format(**fill), summary.format(**fill)) == -1, title


def test_a_follow_up_is_its_event_again_and_plain_text_is_no_news():
    # A follow-up's title states a past move (not news); its summary names the event.
    assert news_direction("AAPL shares rise 1.3% after the news", "Follow-up: Apple cuts outlook.") == -1
    assert news_direction("Apple shares slide a day after Apple beats quarterly estimates", "") == 1
    assert news_direction("Apple names new board member", "A routine appointment.") == 0
    assert news_direction("Apple beats estimates, then cuts outlook", None) == 0  # reads both ways
    assert news_direction(None, None) == 0


def test_every_archive_headline_names_one_company_and_carries_news(events):
    per_headline = events.groupby(["date", "headline_id"])
    assert per_headline.size().eq(1).all()  # one company per headline
    assert (events["news"] != 0).mean() == 1.0
    assert 0.4 < (events["news"] > 0).mean() < 0.6  # good and bad news both common
    # The move lands where the note's call can see it: inside the call's window, after its entry close.
    for e in events.sample(40, random_state=0).itertuples(index=False):
        w = call_window(e.date, 1)
        assert e.move_session == w.exit_date and e.move_session > w.entry_date > e.date


# -- the rule each world claims, as the loop sees it ----------------------------------------------------


def test_news_world_moves_the_company_with_its_news(worlds, events):
    path, manifest = worlds["news"]
    hits, agrees = news_calls_hit(path, events), net_agrees(events)
    # A planted 2% against SPY's and the company's 1% noise, net of 10 bps: P(hit) = Phi(1.9 / 1.41) = 0.91.
    assert hits[agrees].mean() >= 0.85, hits[agrees].mean()
    # Where a company's news cancels on one session (good + bad) or nets the other way, the call is a coin
    # flip or a loser: about 0.79 * 0.91 + 0.15 * 0.5 + 0.06 * 0.09 = 0.80 over all headlines.
    assert 0.72 <= hits.mean() <= 0.88, hits.mean()
    r = returns(path)
    planted = pd.DataFrame(manifest["planted"])
    moved = np.array([r.at[p.session, p.symbol] for p in planted.itertuples()])
    assert (np.sign(moved) == planted["direction"].to_numpy()).mean() >= 0.95


def test_inverted_world_moves_the_company_against_its_news(worlds, events):
    hits, agrees = news_calls_hit(worlds["inverted"][0], events), net_agrees(events)
    assert hits[agrees].mean() <= 0.15, hits[agrees].mean()
    assert 0.12 <= hits.mean() <= 0.28, hits.mean()


def test_null_world_has_no_relation_between_news_and_moves(worlds, events):
    path, manifest = worlds["null"]
    assert manifest["planted_moves"] == 0 and manifest["planted"] == []
    hits = news_calls_hit(path, events)
    assert stats.binomtest(int(hits.sum()), len(hits), 0.5).pvalue > 0.01, hits.mean()
    assert 0.42 < hits.mean() < 0.58


def test_one_seed_draws_the_same_walks_in_every_kind(worlds):
    r = {kind: returns(path) for kind, (path, _) in worlds.items()}
    planted = pd.DataFrame(worlds["news"][1]["planted"])
    diff = (r["news"] - r["null"]).stack()
    diff = diff[diff.abs() > 1e-3]  # the rounding of six decimals aside
    assert len(diff) == len(planted) == worlds["inverted"][1]["planted_moves"]
    assert not (r["news"] - r["inverted"]).stack().abs().lt(1e-6).all()


# -- the file, the seed, the options ------------------------------------------------------------------------


def test_world_file_is_the_bundled_format_over_its_dates_and_symbols(worlds):
    path, manifest = worlds["news"]
    bundled, world = read_price_file(BUNDLED_PRICES), read_price_file(path)
    assert path.read_text().splitlines()[0] == BUNDLED_PRICES.read_text().splitlines()[0] == "date,symbol,close"
    assert sorted(zip(world["date"], world["symbol"])) == sorted(zip(bundled["date"], bundled["symbol"]))
    assert (world["close"] > 0).all()
    assert all(len(line.rsplit(".", 1)[1]) == 6 for line in path.read_text().splitlines()[1:4])
    saved = json.loads(manifest_path(path).read_text())
    assert saved["synthetic"] is True and "SYNTHETIC" in saved["note"]
    assert saved["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert (saved["kind"], saved["seed"], saved["move_pct"], saved["noise_pct"], saved["drift_pct"]) == ("news", 5, 2.0, 1.0, 0.0)
    assert saved["planted_moves"] == len(saved["planted"]) > 300


def test_max_headlines_plants_only_what_the_loop_reads(events):
    capped = archive_events(max_headlines=8)
    assert capped.groupby("date").size().max() == 8 and len(capped) < len(events)
    assert set(capped["headline_id"]) <= set(events["headline_id"])
    _, manifest = make_world(WorldConfig("news", seed=5), max_headlines=8)
    planted = {(p["session"], p["symbol"]) for p in manifest["planted"]}
    assert planted == {(p.session, p.symbol) for p in planted_moves(capped, WorldConfig("news")).itertuples()}
    assert manifest["max_headlines"] == 8 and manifest["headlines"] == capped["headline_id"].nunique()


def test_seeded_same_seed_same_file_other_seed_other_file():
    a, _ = make_world(WorldConfig("news", seed=11))
    b, _ = make_world(WorldConfig("news", seed=11))
    c, _ = make_world(WorldConfig("news", seed=12))
    assert price_csv(a) == price_csv(b)
    assert price_csv(a) != price_csv(c)


def test_options_change_what_they_say(events):
    def walk_returns(config: WorldConfig) -> pd.Series:
        prices, _ = make_world(config)
        wide = prices.pivot(index="date", columns="symbol", values="close")
        return (wide.pct_change() * 100.0).iloc[1:].stack()

    # noise: the daily standard deviation; drift: the daily mean (null: nothing planted on top)
    r = walk_returns(WorldConfig("null", seed=2, noise_pct=2.0, drift_pct=0.3))
    assert r.std() == pytest.approx(2.0, rel=0.05) and r.mean() == pytest.approx(0.3, abs=0.05)
    r = walk_returns(WorldConfig("null", seed=2, noise_pct=0.5, drift_pct=-0.2))
    assert r.std() == pytest.approx(0.5, rel=0.05) and r.mean() == pytest.approx(-0.2, abs=0.02)
    # move: the planted moves' size; move 0 plants nothing (the news world is then the null world)
    planted = planted_moves(events, WorldConfig("news", move_pct=3.5))
    assert set(planted["move_pct"].abs()) == {3.5}
    assert planted_moves(events, WorldConfig("news", move_pct=0)).empty
    news0, _ = make_world(WorldConfig("news", seed=4, move_pct=0))
    null, _ = make_world(WorldConfig("null", seed=4))
    assert price_csv(news0) == price_csv(null)


@pytest.mark.parametrize("bad, needle", [
    (dict(kind="bullish"), "kind"), (dict(move_pct=-1), ">= 0"), (dict(noise_pct=float("nan")), "finite"),
    (dict(drift_pct=-95), "zero or below"), (dict(noise_pct=True), "finite"),
])
def test_bad_options_are_refused_with_the_reason(bad, needle):
    with pytest.raises(ValueError, match=needle):
        WorldConfig(**bad)


def test_benchmark_counts_opposite_sides_per_headline():
    from benchmarks.outcome_learning import opposite_share

    keys = dict(date=["d"] * 5, headline_id=list("abcde"), names_company=[True, True, True, True, False])
    news = pd.DataFrame(dict(keys, policy_side=[1, -1, 1, 0, 1]))
    inverted = pd.DataFrame(dict(keys, policy_side=[-1, 1, 1, -1, -1]))
    out = opposite_share(news, inverted)
    # e names no company: left out; a and b are opposite, c the same side, d one policy takes no side.
    assert out == dict(share=0.5, headlines=4, share_where_both_take_a_side=round(2 / 3, 4), both_take_a_side=3)
