"""Synthetic worlds (`outcome_flywheel/daily_rl/worlds/prices.py`, `flywheel make-world`): each world file has
the rule it claims, as the daily loop will see it (the loop's own price reader and call outcomes), and
nothing else; seeded; every option changes what it says."""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from outcome_flywheel.daily_rl.notes.outcomes import call_outcome, call_window
from outcome_flywheel.daily_rl.worlds.news import news_direction
from outcome_flywheel.daily_rl.worlds.prices import (
    WORLD_KINDS,
    WorldConfig,
    archive_events,
    judge_outcome_titles,
    make_world,
    manifest_path,
    planted_moves,
    price_csv,
    world_outcome_titles,
    write_world,
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
    prices, _ = MarketData(prices_file=str(path)).price_table(
        sorted(set(events["symbol"]) | {"SPY"}), "2025-10-01", "2026-01-08"
    )
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
    # The stock carries SPY's move (beta 1), so vs SPY a planted 2% stands against the company's own 1% noise,
    # net of 10 bps: P(hit) = Phi(1.9) = 0.97.
    assert hits[agrees].mean() >= 0.85, hits[agrees].mean()
    # Where a company's news cancels on one session (good + bad) or nets the other way, the call is a coin
    # flip or a loser: about 0.79 * 0.97 + 0.15 * 0.5 + 0.06 * 0.03 = 0.84 over all headlines.
    assert 0.72 <= hits.mean() <= 0.88, hits.mean()
    r = returns(path)
    planted = pd.DataFrame(manifest["planted"])
    # against SPY the move is the planted 2% plus the company's own 1% noise: its sign right with P = Phi(2) = 0.98
    moved = np.array([r.at[p.session, p.symbol] - r.at[p.session, "SPY"] for p in planted.itertuples()])
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
    assert (saved["kind"], saved["seed"], saved["move_pct"], saved["noise_pct"], saved["drift_pct"]) == (
        "news",
        5,
        2.0,
        1.0,
        0.0,
    )
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

    # noise: the daily standard deviation; drift: the daily mean (null: nothing planted on top).
    # Statistical bounds on a seeded draw of n = 7,904 daily returns: the sample std's standard
    # error is ~1/sqrt(2n) = 0.8% (rel 5% = 6 SE); the mean's is noise/sqrt(n) = 0.022 and 0.0056
    # (abs 0.05 and 0.02: 2.2 and 3.6 SE).
    r = walk_returns(WorldConfig("null", seed=2, noise_pct=2.0, drift_pct=0.3, market_beta=0.0))
    assert r.std() == pytest.approx(2.0, rel=0.05) and r.mean() == pytest.approx(0.3, abs=0.05)
    r = walk_returns(WorldConfig("null", seed=2, noise_pct=0.5, drift_pct=-0.2, market_beta=0.0))
    assert r.std() == pytest.approx(0.5, rel=0.05) and r.mean() == pytest.approx(-0.2, abs=0.02)
    # market_beta (default 1): a stock is SPY's noise plus its own, so its daily std is noise * sqrt(1 + beta^2)
    # and, against SPY, only its own noise is left (what a call's vs_spy sees); same 6-SE bound as above
    prices, _ = make_world(WorldConfig("null", seed=2, noise_pct=2.0))
    wide = (prices.pivot(index="date", columns="symbol", values="close").pct_change() * 100.0).iloc[1:]
    stocks = wide.drop(columns="SPY")
    assert stocks.stack().std() == pytest.approx(2.0 * math.sqrt(2.0), rel=0.05)
    assert stocks.sub(wide["SPY"], axis=0).stack().std() == pytest.approx(2.0, rel=0.05)
    # move: the planted moves' size; move 0 plants nothing (the news world is then the null world)
    planted = planted_moves(events, WorldConfig("news", move_pct=3.5))
    assert set(planted["move_pct"].abs()) == {3.5}
    assert planted_moves(events, WorldConfig("news", move_pct=0)).empty
    news0, _ = make_world(WorldConfig("news", seed=4, move_pct=0))
    null, _ = make_world(WorldConfig("null", seed=4))
    assert price_csv(news0) == price_csv(null)


@pytest.mark.parametrize(
    "bad, needle",
    [
        (dict(kind="bullish"), "kind"),
        (dict(move_pct=-1), ">= 0"),
        (dict(noise_pct=float("nan")), "finite"),
        (dict(drift_pct=-95), "zero or below"),
        (dict(noise_pct=True), "finite"),
    ],
)
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


# -- what the judge reads in a world: the world's own moves, never a close it cannot know yet ----------------


@pytest.fixture(scope="module")
def small_worlds(tmp_path_factory) -> dict:
    """A SYNTHETIC archive over Labor Day 2025 (12 days x 8) and its three worlds without noise, so every
    move is a planted one: {"archive": folder, kind: world file}."""
    from outcome_flywheel.daily_rl.worlds.synthetic_feeds import write_synthetic_archive

    folder = tmp_path_factory.mktemp("judge_worlds")
    out = {"archive": folder / "feeds"}
    write_synthetic_archive(out["archive"], days=12, per_day=8, seed=9, start="2025-08-27")
    for kind in WORLD_KINDS:
        prices, manifest = make_world(WorldConfig(kind, seed=9, noise_pct=0.0), archive_dir=out["archive"])
        write_world(folder / f"{kind}.csv", prices, manifest)
        out[kind] = folder / f"{kind}.csv"
    return out


def day_headlines(archive, day: str) -> pd.DataFrame:
    from outcome_flywheel.daily_rl.feeds.headlines import build_headlines
    from outcome_flywheel.daily_rl.feeds.source import FeedSource

    return build_headlines(FeedSource(archive_dir=str(archive)).fetch(day), day, "America/New_York", 99)[0]


def archive_days_of(archive) -> list[str]:
    return sorted(p.name for p in archive.iterdir() if p.is_dir())


def follow_up(titles: list[str], name: str) -> str:
    (found,) = [t for t in titles if t.startswith(f"{name} ")]
    return found


def test_a_real_price_file_keeps_the_archives_headlines(small_worlds):
    day = archive_days_of(small_worlds["archive"])[0]
    headlines = day_headlines(small_worlds["archive"], day)
    assert world_outcome_titles(BUNDLED_PRICES, headlines, day) is None
    assert world_outcome_titles(None, headlines, day) is None and judge_outcome_titles("", headlines, day) is None
    assert judge_outcome_titles(str(small_worlds["news"]), headlines, day) == world_outcome_titles(
        small_worlds["news"], headlines, day
    )
    assert world_outcome_titles(manifest_path(small_worlds["news"]), headlines, day) == world_outcome_titles(
        small_worlds["news"], headlines, day
    )


def test_follow_ups_state_the_worlds_move_with_the_rules_sign_once_the_window_closed(small_worlds):
    from outcome_flywheel.daily_rl.notes.relevance import headline_symbols
    from outcome_flywheel.daily_rl.worlds.synthetic_feeds import company_mention

    expected = {"news": ("rose", "fell"), "inverted": ("fell", "rose"), "null": ("were flat", "were flat")}
    checked = 0
    for day in archive_days_of(small_worlds["archive"]):
        headlines = day_headlines(small_worlds["archive"], day)
        exit_date = call_window(day, 1).exit_date
        for kind in WORLD_KINDS:
            titles = world_outcome_titles(small_worlds[kind], headlines, day, outcome_day=exit_date)
            assert len(titles) == len(headlines)  # one company each, none twice a day
            for h in headlines.itertuples(index=False):
                (symbol,) = headline_symbols(h.title, h.summary)
                said = follow_up(titles, company_mention(h.title, symbol))
                good, bad = expected[kind]
                assert (good if news_direction(h.title, h.summary) > 0 else bad) in said, said
                assert f"to the {exit_date} close, the call's window" in said and "SYNTHETIC" in said
                checked += 1
    assert checked == 3 * 12 * 8


def test_follow_ups_never_read_a_close_after_the_judges_morning(small_worlds, tmp_path):
    """The judge of D (the morning after D) scores D-1's notes: changing every close after D changes
    nothing it reads; D's own close is read when D is a session."""
    world = small_worlds["news"]
    closes = read_price_file(world)
    for day in archive_days_of(small_worlds["archive"]):
        headlines = day_headlines(small_worlds["archive"], day)
        judged = (pd.Timestamp(day) + pd.Timedelta(days=1)).date().isoformat()
        said = world_outcome_titles(world, headlines, day)
        for name, changed in (("after", closes["date"] > judged), ("at", closes["date"] == judged)):
            other = closes.assign(close=closes["close"].where(~changed, closes["close"] * 1.37))
            path = tmp_path / f"{name}-{day}.csv"
            write_world(path, other, {"kind": "news"})
            if name == "after" or not changed.any():
                assert world_outcome_titles(path, headlines, day) == said, day
            else:
                assert world_outcome_titles(path, headlines, day) != said, day
        window = call_window(day, 1)
        assert all(f"exit close ({window.exit_date}) is not in yet" in t or "no close yet" in t for t in said)
        if not (closes["date"] == judged).any():  # no session on D: nothing new to state
            assert all(f"no close yet since {day}" in t for t in said)


def test_the_judges_selection_puts_the_headlines_own_follow_up_first(small_worlds):
    from outcome_flywheel.daily_rl.judge.llm_judge import Judge
    from outcome_flywheel.daily_rl.notes.relevance import headline_symbols
    from outcome_flywheel.daily_rl.worlds.synthetic_feeds import company_mention

    judge = Judge()
    for day in archive_days_of(small_worlds["archive"])[:4]:
        headlines = day_headlines(small_worlds["archive"], day)
        titles = world_outcome_titles(small_worlds["inverted"], headlines, day)
        for h in headlines.itertuples(index=False):
            (symbol,) = headline_symbols(h.title, h.summary)
            shown = judge.outcome_context(h.title, titles)
            assert shown[0] == follow_up(titles, company_mention(h.title, symbol)), (h.title, shown)
        # A follow-up is about its company alone and is no news of its own.
        assert all(len(headline_symbols(t)) == 1 and news_direction(t) == 0 for t in titles)


def test_follow_ups_on_the_bundled_archive_name_the_company_as_the_headline_does(worlds):
    day = "2025-11-05"
    headlines = day_headlines("sample_data/feeds_archive", day)
    titles = world_outcome_titles(worlds["news"][0], headlines, day)
    assert titles and all("2025-11-06 session" in t and "(2025-11-07) is not in yet" in t for t in titles)
    assert any(t.startswith("Procter & Gamble (PG) shares ") for t in titles)
