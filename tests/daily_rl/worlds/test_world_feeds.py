"""SYNTHETIC feed archives for the worlds (`outcome_flywheel/daily_rl/worlds/synthetic_feeds.py`, `flywheel make-world
--synthetic-days`): seeded, read whole by the loop's own feed parser, every headline's company and news as
planned, marked synthetic, no clashing news inside one call window; the split of days is ordered."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pandas as pd
import pytest

from outcome_flywheel.daily_rl.feeds.headlines import build_headlines
from outcome_flywheel.daily_rl.feeds.source import FeedSource
from outcome_flywheel.daily_rl.notes.outcomes import call_window
from outcome_flywheel.daily_rl.notes.relevance import headline_symbols
from outcome_flywheel.daily_rl.worlds.news import news_direction
from outcome_flywheel.daily_rl.worlds.prices import WorldConfig, make_world
from outcome_flywheel.daily_rl.worlds.synthetic_feeds import (
    MANIFEST_NAME,
    SLOT,
    archive_templates,
    plan_headlines,
    read_archive_manifest,
    split_days,
    synthetic_days,
    write_synthetic_archive,
)
from outcome_flywheel.market_data import BUNDLED_PRICES, read_price_file
from outcome_flywheel.settings import PROJECT_ROOT
from tests import PROJECT_ROOT

TZ = "America/New_York"


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    """60 days x 16 headlines, seed 3: (folder, manifest, every headline as the loop reads it)."""
    folder = tmp_path_factory.mktemp("synthetic") / "feeds"
    manifest = write_synthetic_archive(folder, days=60, per_day=16, seed=3)
    source, frames = FeedSource(archive_dir=str(folder)), []
    for day in synthetic_days(60, manifest["first_day"]):
        headlines, quarantine, _ = build_headlines(source.fetch(day), day, TZ, max_headlines=16)
        assert quarantine.empty, quarantine.to_dict(orient="records")
        frames.append(headlines)
    return folder, manifest, pd.concat(frames, ignore_index=True)


def test_templates_come_from_the_archive_with_a_company_slot():
    templates, names = archive_templates()
    assert all(t.title.count(SLOT) == 1 and t.news in (1, -1) for t in templates)
    events = {s: {t.event for t in templates if t.news == s} for s in (1, -1)}
    assert events[1] == {"beats", "announces", "raises", "regulators", "wins"}  # news.py's five good events
    assert events[-1] == {"misses", "cuts", "faces", "recalls", "chief"}  # and its five bad ones
    assert not any("Follow-up" in t.summary or "after the news" in t.title for t in templates)
    assert names["PG"] == "Procter & Gamble" and names["UPS"] == "UPS" and names["GE"] == "GE Aerospace"


def test_archive_is_read_whole_with_each_headlines_company_and_news(archive):
    folder, manifest, headlines = archive
    days = sorted(p.name for p in folder.iterdir() if p.is_dir())
    assert days == synthetic_days(60, manifest["first_day"]) and len(headlines) == 60 * 16
    assert headlines.groupby("date").size().eq(16).all()
    companies = [headline_symbols(t, s) for t, s in zip(headlines["title"], headlines["summary"])]
    assert all(len(c) == 1 for c in companies)
    news = [news_direction(t, s) for t, s in zip(headlines["title"], headlines["summary"])]
    assert set(news) == {1, -1}
    # news_direction reads the planned news on every headline: the plan is the same seed's.
    templates, names = archive_templates()
    plan = plan_headlines(days, 16, 3, templates, {s: names[s] for s in manifest["companies"]}, TZ)
    planned = {(d, t): (s, n) for d, t, s, n in zip(plan["date"], plan["title"], plan["symbol"], plan["news"])}
    for h, c, n in zip(headlines.itertuples(index=False), companies, news):
        assert planned[(h.date, h.title)] == (c[0], n), h.title
    # half good, half bad news every day; one headline per company a day
    assert (pd.Series(news).groupby(headlines["date"].to_numpy()).sum() == 0).all()
    per_company_day = Counter((d, c[0]) for d, c in zip(headlines["date"], companies))
    assert max(per_company_day.values()) == 1


def test_no_clashing_news_inside_one_call_window(archive):
    _, _, headlines = archive
    frame = pd.DataFrame(
        dict(
            window=[call_window(d, 1).exit_date for d in headlines["date"]],
            symbol=[headline_symbols(t, s)[0] for t, s in zip(headlines["title"], headlines["summary"])],
            news=[news_direction(t, s) for t, s in zip(headlines["title"], headlines["summary"])],
        )
    )
    assert frame.groupby(["window", "symbol"])["news"].nunique().eq(1).all()


def test_every_call_window_lies_inside_the_price_file(archive):
    _, manifest, _ = archive
    dates = read_price_file(BUNDLED_PRICES)["date"]
    for day in synthetic_days(60, manifest["first_day"]):
        w = call_window(day, 1)
        assert dates.min() < w.entry_date < w.exit_date <= dates.max()
    with pytest.raises(ValueError, match="not inside the price file"):
        write_synthetic_archive(PROJECT_ROOT / ".never-written", days=30, start="2025-12-20")
    with pytest.raises(ValueError, match="headlines per day"):
        write_synthetic_archive(PROJECT_ROOT / ".never-written", days=2, per_day=60)
    assert not (PROJECT_ROOT / ".never-written").exists()


def test_everything_is_marked_synthetic(archive):
    folder, manifest, headlines = archive
    # the feeds say so; the headline's words, which the policy reads, stay as the archive writes them
    assert (
        not headlines["title"].str.contains("SYNTHETIC").any()
        and not headlines["summary"].str.contains("SYNTHETIC").any()
    )
    assert headlines["source"].str.contains("SYNTHETIC").all()
    for xml in folder.glob("*/*.xml"):
        assert "<description>" in xml.read_text() and xml.read_text().count("SYNTHETIC") > 2
    saved = json.loads((folder / MANIFEST_NAME).read_text())
    assert saved == manifest == read_archive_manifest(folder)
    assert saved["synthetic"] is True and "SYNTHETIC" in saved["note"]
    assert (saved["seed"], saved["days"], saved["headlines_per_day"], saved["headlines"]) == (3, 60, 16, 960)
    assert saved["good_news"] == saved["bad_news"] == 480
    assert sum(t["uses"] for t in saved["templates"]) == 960 and all(SLOT in t["title"] for t in saved["templates"])
    assert read_archive_manifest(PROJECT_ROOT / "sample_data" / "feeds_archive") is None


def test_seeded_same_seed_same_archive_other_seed_other(tmp_path):
    def files(folder):
        return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*.xml"))}

    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        write_synthetic_archive(tmp_path / name, days=6, per_day=5, seed=seed, start="2025-09-05")
    assert files(tmp_path / "a") == files(tmp_path / "b")
    assert files(tmp_path / "a").keys() == files(tmp_path / "c").keys() and files(tmp_path / "a") != files(
        tmp_path / "c"
    )
    write_synthetic_archive(
        tmp_path / "a", days=3, per_day=5, seed=1, start="2025-09-05"
    )  # again, shorter: no stale day stays
    assert sorted(p.name for p in (tmp_path / "a").iterdir() if p.is_dir()) == synthetic_days(3, "2025-09-05")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not empty"):
        write_synthetic_archive(tmp_path / "other", days=3, per_day=5, seed=1, start="2025-09-05")
    source = FeedSource(archive_dir=str(tmp_path / "c"))
    odd = pd.concat([build_headlines(source.fetch(d), d, TZ, 99)[0] for d in synthetic_days(6, "2025-09-05")])
    assert odd.groupby("date").size().eq(5).all()  # an odd count: one extra of a drawn side
    assert pd.Series([news_direction(t) for t in odd["title"]]).groupby(odd["date"].to_numpy()).sum().abs().eq(1).all()


def test_a_world_over_the_synthetic_archive_says_so_and_plants_every_headline(archive):
    folder, manifest, headlines = archive
    prices, world = make_world(WorldConfig("news", seed=3), archive_dir=folder, max_headlines=16)
    assert world["synthetic"] is True and world["synthetic_headlines"] is True
    assert world["archive_manifest"] == {
        k: manifest[k] for k in ("seed", "days", "headlines_per_day", "first_day", "last_day")
    }
    assert world["headlines"] == world["headlines_with_news"] == 960
    assert world["not_planted"] == dict(cancelled=0, symbol_not_in_prices=0, session_not_in_prices=0)
    windows = {
        (call_window(d, 1).exit_date, headline_symbols(t, s)[0])
        for d, t, s in zip(headlines["date"], headlines["title"], headlines["summary"])
    }
    assert world["planted_moves"] == len(windows)
    _, real = make_world(WorldConfig("news", seed=3), max_headlines=8)
    assert real["synthetic_headlines"] is False and real["archive_manifest"] is None


def test_split_is_ordered_disjoint_and_keeps_a_call_window_whole(archive):
    folder, _, _ = archive
    train, validation, test = split_days(folder)
    days = synthetic_days(60, read_archive_manifest(folder)["first_day"])
    assert train + validation + test == days  # ordered, disjoint, all of them
    assert (
        10 <= len(validation) <= 14 and 10 <= len(test) <= 14 and train[-1] < validation[0] <= validation[-1] < test[0]
    )
    for before, after in ((train, validation), (validation, test)):
        assert call_window(before[-1], 1).exit_date != call_window(after[0], 1).exit_date
    assert split_days(days, validation=0.2, test=0.2) == (train, validation, test)
    assert split_days(days, 0, 0) == (days, [], [])
    with pytest.raises(ValueError, match="shares"):
        split_days(days, 0.6, 0.5)


def test_cli_writes_the_archive_and_the_world_over_it(tmp_path):
    out, feeds = tmp_path / "news.csv", tmp_path / "feeds"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "outcome_flywheel.cli",
            "make-world",
            "--kind",
            "news",
            "--seed",
            "4",
            "--synthetic-days",
            "5",
            "--headlines-per-day",
            "6",
            "--archive-out",
            str(feeds),
            "--out",
            str(out),
        ],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert "SYNTHETIC feeds" in run.stdout and "SYNTHETIC news world" in run.stdout
    world = json.loads((tmp_path / "news.csv.world.json").read_text())
    assert world["synthetic_headlines"] is True and world["archive"] == str(feeds) and world["headlines"] == 30
    assert read_archive_manifest(feeds)["seed"] == 4
    half = subprocess.run(
        [
            sys.executable,
            "-m",
            "outcome_flywheel.cli",
            "make-world",
            "--kind",
            "news",
            "--synthetic-days",
            "5",
            "--out",
            str(out),
        ],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert half.returncode == 2 and "--archive-out together" in half.stderr
