"""Feed ingestion: the bundled archive, feedparser's hostile test corpus, live fetching with replay."""

import csv
import http.server
import threading
from datetime import date, timedelta
from functools import partial
from pathlib import Path

import pandas as pd
import pytest

from outcome_flywheel.daily_rl.feeds.headlines import (
    FEED_LEVEL_REASONS,
    RawFeed,
    build_headlines,
    parse_feed,
    sha256_bytes,
)
from outcome_flywheel.daily_rl.feeds.source import FeedSource
from outcome_flywheel.settings import SAMPLE_DATA
from tests.conftest import shared_data

TZ = "America/New_York"
ARCHIVE = SAMPLE_DATA / "feeds_archive"


def _balanced(headlines: pd.DataFrame, quarantine: pd.DataFrame, sources: pd.DataFrame) -> bool:
    entry_rows = int((~quarantine["reason"].isin(FEED_LEVEL_REASONS)).sum())
    return int(sources["entries"].sum()) == len(headlines) + entry_rows


def test_bundled_archive_covers_three_weeks_of_november():
    days = sorted(p.name for p in ARCHIVE.iterdir() if p.is_dir())
    assert len(days) >= 21
    parsed = [date.fromisoformat(d) for d in days]
    assert all(b - a == timedelta(days=1) for a, b in zip(parsed, parsed[1:]))
    assert parsed[0].month == 11 and parsed[0].year == 2025


def test_bundled_archive_ingests_with_quarantine():
    source = FeedSource(archive_dir=str(ARCHIVE))
    reasons = set()
    follow_ups = 0
    for day in sorted(p.name for p in ARCHIVE.iterdir() if p.is_dir()):
        raws = source.fetch(day)
        assert 3 <= len([r for r in raws if r.name != "pressroom.xml"]) <= 4
        kept, quarantine, sources = build_headlines(raws, day, TZ, 30)
        assert 20 <= len(kept) <= 30
        assert kept["headline_id"].is_unique and kept["title"].str.len().gt(0).all()
        assert (kept["date"] == day).all()
        local_days = pd.to_datetime(kept["published_at"]).dt.tz_localize("UTC").dt.tz_convert(TZ).dt.date.astype(str)
        assert (local_days == day).all()
        assert _balanced(kept, quarantine, sources)
        reasons |= set(quarantine["reason"])
        follow_ups += kept["title"].str.contains("after the news|a day after").sum()
        assert sorted(set(sources["sha256"])) == sorted({sha256_bytes(r.data) for r in raws if r.data is not None})
    assert {"duplicate", "missing_title", "implausible_date", "missing_date", "not_on_day", "not_a_feed"} <= reasons
    assert follow_ups > 50


def test_rerun_gives_the_same_rows():
    raws = FeedSource(archive_dir=str(ARCHIVE)).fetch("2025-11-05")
    a = build_headlines(raws, "2025-11-05", TZ, 30)[0]
    b = build_headlines(list(reversed(raws)), "2025-11-05", TZ, 30)[0]
    pd.testing.assert_frame_equal(a, b)


def test_entry_level_problems_are_quarantined_with_reasons():
    rss = b"""<?xml version="1.0"?><rss version="2.0"><channel><title>T</title>
    <item><title>Good one</title><pubDate>Wed, 05 Nov 2025 10:00:00 -0500</pubDate></item>
    <item><title></title><pubDate>Wed, 05 Nov 2025 10:00:00 -0500</pubDate></item>
    <item><title>No date</title></item>
    <item><title>Future</title><pubDate>Fri, 01 Jan 2100 00:00:00 GMT</pubDate></item>
    <item><title>Late night UTC is still the 5th in New York</title><pubDate>Thu, 06 Nov 2025 03:00:00 GMT</pubDate></item>
    <item><title>Yesterday</title><pubDate>Tue, 04 Nov 2025 10:00:00 -0500</pubDate></item>
    </channel></rss>"""
    kept, quarantined, source = parse_feed(RawFeed("t.xml", rss), "2025-11-05", TZ)
    assert [k["title"] for k in kept] == ["Good one", "Late night UTC is still the 5th in New York"]
    assert [q["reason"] for q in quarantined] == ["missing_title", "missing_date", "implausible_date", "not_on_day"]
    assert source["entries"] == 6 == len(kept) + len(quarantined)


def test_feedparser_corpus_ingests_without_crash():
    corpus = shared_data("feeds_corpus")
    with open(corpus / "MANIFEST.csv", newline="") as fh:
        manifest = list(csv.DictReader(fh))
    raws = [RawFeed(row["path"], (corpus / row["path"]).read_bytes()) for row in manifest]
    assert len(raws) >= 80
    total_kept = 0
    for raw in raws:
        day = "2004-01-01"
        kept, quarantine, sources = build_headlines([raw], day, TZ, 1000)
        assert _balanced(kept, quarantine, sources)
        if sources["status"].iloc[0] != "ok":
            assert len(quarantine) >= 1 and quarantine["reason"].iloc[0] in FEED_LEVEL_REASONS
        total_kept += len(kept)
    # all of them through one call, as the asset does: no crash, accounting holds
    kept, quarantine, sources = build_headlines(raws, "2004-01-01", TZ, 1000)
    assert _balanced(kept, quarantine, sources)
    assert len(quarantine) > 0
    # feedparser's own verdict on each file (recorded in the manifest) is carried through
    expected_bozo = {row["path"]: row["fp6014_bozo"] == "1" for row in manifest if row["fp6014_bozo"] in ("0", "1")}
    ours = dict(zip(sources["feed_file"], sources["bozo"]))
    assert sum(expected_bozo.values()) > 5
    assert all(ours[path] == bozo for path, bozo in expected_bozo.items())


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture()
def feed_server(tmp_path):
    root = tmp_path / "www"
    root.mkdir()
    (root / "a.xml").write_bytes((ARCHIVE / "2025-11-05" / "market-wire.xml").read_bytes())
    (root / "big.xml").write_bytes(b"<rss>" + b"x" * 5000 + b"</rss>")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(_QuietHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", root
    server.shutdown()


def test_live_feeds_are_kept_with_sha256_and_replayed(feed_server, tmp_path):
    base, www = feed_server
    urls = f"{base}/a.xml,{base}/big.xml,{base}/missing.xml,ftp://nope"
    source = FeedSource(feed_urls=urls, data_dir=str(tmp_path / "data"), max_bytes=4000, timeout_s=5)
    raws = source.fetch("2025-11-05")
    by_name = {r.name: r for r in raws}
    good = by_name[f"{base}/a.xml"]
    assert good.data and Path(good.path).exists() and good.sha256 == sha256_bytes(Path(good.path).read_bytes())
    assert "cap" in by_name[f"{base}/big.xml"].error
    assert "404" in by_name[f"{base}/missing.xml"].error
    assert by_name["ftp://nope"].data is None
    assert (source.raw_dir("2025-11-05") / "manifest.json").exists()
    kept, quarantine, _ = build_headlines(raws, "2025-11-05", TZ, 30)
    assert len(kept) > 0 and (quarantine["reason"] == "fetch_failed").sum() == 3
    # the live feed changes; the day replays from the kept raw files
    (www / "a.xml").write_bytes(b"<rss version='2.0'><channel><title>changed</title></channel></rss>")
    replay = {r.name: r for r in source.fetch("2025-11-05")}
    assert replay[f"{base}/a.xml"].data == good.data


def test_a_file_url_is_not_read_in_live_mode(tmp_path):
    local = tmp_path / "feed.xml"
    local.write_bytes((ARCHIVE / "2025-11-05" / "market-wire.xml").read_bytes())
    source = FeedSource(feed_urls=local.as_uri(), data_dir=str(tmp_path / "data"))
    (raw,) = source.fetch("2025-11-05")
    assert raw.data is None
    assert "http(s)" in raw.error and "'file'" in raw.error and "FLYWHEEL_FEEDS_ARCHIVE" in raw.error
    kept, quarantine, sources = build_headlines([raw], "2025-11-05", TZ, 30)
    assert len(kept) == 0 and quarantine["reason"].tolist() == ["fetch_failed"] and quarantine["detail"][0] == raw.error
    assert _balanced(kept, quarantine, sources)


def test_a_rerun_fetches_again_only_the_feeds_that_failed(feed_server, tmp_path):
    base, www = feed_server
    source = FeedSource(feed_urls=f"{base}/a.xml,{base}/late.xml", data_dir=str(tmp_path / "data"), timeout_s=5)
    first = {r.name: r for r in source.fetch("2025-11-05")}
    assert first[f"{base}/a.xml"].data and "404" in first[f"{base}/late.xml"].error
    # The failed feed is back and the good one has moved on: the re-run fetches the first and
    # replays the second from its kept raw file.
    (www / "late.xml").write_bytes((ARCHIVE / "2025-11-05" / "market-wire.xml").read_bytes())
    (www / "a.xml").write_bytes(b"<rss version='2.0'><channel><title>changed</title></channel></rss>")
    second = {r.name: r for r in source.fetch("2025-11-05")}
    assert second[f"{base}/a.xml"].data == first[f"{base}/a.xml"].data
    assert second[f"{base}/late.xml"].data == (www / "late.xml").read_bytes() and not second[f"{base}/late.xml"].error
    # ... and the manifest now keeps both, so a third run replays both.
    (www / "late.xml").unlink()
    third = {r.name: r for r in source.fetch("2025-11-05")}
    assert third[f"{base}/late.xml"].data == second[f"{base}/late.xml"].data
