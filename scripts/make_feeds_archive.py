"""Write the bundled feed archive `sample_data/feeds_archive/YYYY-MM-DD/*.xml`.

26 consecutive days (2025-11-03 .. 2025-11-28, inside the bundled price data), four feeds a day
(two RSS 2.0, two Atom; one is missing on some days), 25-40 entries a day. Fictional events
about real tickers, built from the templates the tiny-local corpus uses; about a quarter of each
day's entries follow up on the previous day's events ("AAPL shares rise 4% after ..."), so the
judge has something to compare the notes against. Deliberate damage, as live feeds have it:
cross-feed duplicates, yesterday's items repeated, entries with no title, absurd or unparseable
dates, a truncated (ill-formed) feed, and an HTML error page where a feed should be.
Deterministic (seeded).

    python -m scripts.make_feeds_archive
"""

from __future__ import annotations

import random
import shutil
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from xml.sax.saxutils import escape
from zoneinfo import ZoneInfo

from scripts.make_tiny_local_corpus import COMPANIES, NEGATIVE, POSITIVE, SEGMENTS

OUT = Path(__file__).resolve().parent.parent / "sample_data" / "feeds_archive"
FIRST_DAY = date(2025, 11, 3)
DAYS = 26
TZ = ZoneInfo("America/New_York")
FEEDS = (
    ("market-wire", "Market Wire", "rss"),
    ("street-desk", "Street Desk", "atom"),
    ("sector-brief", "Sector Brief", "rss"),
    ("ticker-tape", "Ticker Tape", "atom"),
)
FOLLOW_UP_UP = [
    "{ticker} shares rise {pct}% after the news",
    "{co} shares extend gains a day after {event}",
    "Analysts lift {co} targets; {ticker} shares rise {pct}% after the news",
]
FOLLOW_UP_DOWN = [
    "{ticker} shares fall {pct}% after the news",
    "{co} shares slide a day after {event}",
    "Analysts cut {co} targets; {ticker} shares fall {pct}% after the news",
]


@dataclass
class Event:
    ticker: str
    company: str
    positive: bool
    title: str
    summary: str
    published: datetime


def _events(rng: random.Random, day: date, n: int) -> list[Event]:
    out = []
    for ticker, company in rng.sample(sorted(COMPANIES.items()), n):
        positive = rng.random() < 0.5
        title_t, summary_t = rng.choice(POSITIVE if positive else NEGATIVE)
        fill = dict(co=company, seg=rng.choice(SEGMENTS), pct=rng.randint(2, 19), n=rng.randint(2, 60))
        published = datetime(day.year, day.month, day.day, rng.randint(6, 20), rng.randint(0, 59), tzinfo=TZ)
        out.append(Event(ticker, company, positive, title_t.format(**fill), summary_t.format(**fill), published))
    return out


def _follow_ups(rng: random.Random, day: date, previous: list[Event], n: int) -> list[Event]:
    out = []
    for ev in rng.sample(previous, min(n, len(previous))):
        # the market mostly agrees with the news, not always
        up = ev.positive if rng.random() < 0.8 else not ev.positive
        template = rng.choice(FOLLOW_UP_UP if up else FOLLOW_UP_DOWN)
        event = ev.title[0].lower() + ev.title[1:]
        title = template.format(ticker=ev.ticker, co=ev.company, pct=rng.randint(1, 9), event=event)
        summary = f"Follow-up: {ev.title}."
        published = datetime(day.year, day.month, day.day, rng.randint(7, 12), rng.randint(0, 59), tzinfo=TZ)
        out.append(Event(ev.ticker, ev.company, up, title, summary, published))
    return out


def _rss(title: str, slug: str, items: list[dict]) -> str:
    parts = [
        '<?xml version="1.0" encoding="utf-8"?>',
        '<rss version="2.0"><channel>',
        f"<title>{escape(title)}</title><link>https://example.com/{slug}</link>",
        f"<description>{escape(title)}: fictional market headlines (sample data)</description>",
    ]
    for it in items:
        parts.append(
            "<item>"
            f"<title>{escape(it['title'])}</title>"
            f"<link>https://example.com/{slug}/{it['id']}</link>"
            f"<guid isPermaLink=\"false\">{slug}-{it['id']}</guid>"
            f"<description>{escape(it['summary'])}</description>"
            + (f"<pubDate>{escape(it['date'])}</pubDate>" if it["date"] is not None else "")
            + "</item>"
        )
    parts.append("</channel></rss>")
    return "\n".join(parts) + "\n"


def _atom(title: str, slug: str, items: list[dict], updated: str) -> str:
    parts = [
        '<?xml version="1.0" encoding="utf-8"?>',
        '<feed xmlns="http://www.w3.org/2005/Atom">',
        f"<title>{escape(title)}</title><id>urn:example:{slug}</id><updated>{updated}</updated>",
        f'<link href="https://example.com/{slug}"/>',
    ]
    for it in items:
        parts.append(
            "<entry>"
            f"<title>{escape(it['title'])}</title>"
            f"<id>urn:example:{slug}:{it['id']}</id>"
            f'<link href="https://example.com/{slug}/{it["id"]}"/>'
            f"<summary>{escape(it['summary'])}</summary>"
            + (f"<published>{escape(it['date'])}</published><updated>{escape(it['date'])}</updated>" if it["date"] is not None else "")
            + "</entry>"
        )
    parts.append("</feed>")
    return "\n".join(parts) + "\n"


def _format_date(dt: datetime, kind: str) -> str:
    return format_datetime(dt) if kind == "rss" else dt.isoformat()


def build(out: Path = OUT, first_day: date = FIRST_DAY, days: int = DAYS, seed: int = 11) -> dict:
    rng = random.Random(seed)
    if out.exists():
        shutil.rmtree(out)
    previous: list[Event] = []
    stats = {}
    for offset in range(days):
        day = first_day + timedelta(days=offset)
        n_total = rng.randint(25, 34)
        n_follow = min(len(previous), rng.randint(5, 9))
        fresh = _events(rng, day, n_total - n_follow)
        follow = _follow_ups(rng, day, previous, n_follow)
        todays = fresh + follow
        rng.shuffle(todays)
        feeds = list(FEEDS)
        if offset % 5 == 4:  # some days one feed publishes nothing
            feeds.pop(rng.randrange(len(feeds)))
        items: dict[str, list[dict]] = {slug: [] for slug, _, _ in feeds}
        for i, ev in enumerate(todays):
            slug, _, kind = feeds[i % len(feeds)]
            items[slug].append(dict(id=f"{day:%Y%m%d}-{i}", title=ev.title, summary=ev.summary, date=_format_date(ev.published, kind)))
        # cross-feed duplicates (a wire story picked up by another feed, with different spacing/case)
        for ev in rng.sample(todays, 2):
            slug, _, kind = feeds[rng.randrange(len(feeds))]
            items[slug].append(dict(id=f"{day:%Y%m%d}-dup-{ev.ticker}", title="  " + ev.title.upper() + " ", summary=ev.summary,
                                    date=_format_date(ev.published + timedelta(minutes=7), kind)))
        # yesterday's items repeated late in the feed
        for ev in previous[:2]:
            slug, _, kind = feeds[rng.randrange(len(feeds))]
            items[slug].append(dict(id=f"{day:%Y%m%d}-old-{ev.ticker}", title=ev.title, summary=ev.summary, date=_format_date(ev.published, kind)))
        # broken entries: no title, no date, absurd date, unparseable date (not every day)
        if offset % 2 == 0:
            slug, _, kind = feeds[0]
            items[slug].append(dict(id=f"{day:%Y%m%d}-notitle", title="", summary="An entry with no title.", date=_format_date(todays[0].published, kind)))
        if offset % 3 == 0:
            slug, _, kind = feeds[-1]
            items[slug].append(dict(id=f"{day:%Y%m%d}-absurd", title=f"{todays[1].company} sets date for investor day",
                                    summary="The date on this entry is nonsense.",
                                    date="Thu, 01 Jan 2099 00:00:00 GMT" if kind == "rss" else "2099-01-01T00:00:00Z"))
            items[slug].append(dict(id=f"{day:%Y%m%d}-nodate", title=f"{todays[2].company} to present at industry conference",
                                    summary="This entry has no date.", date=None))
        if offset % 4 == 1:
            slug, _, kind = feeds[1]
            items[slug].append(dict(id=f"{day:%Y%m%d}-baddate", title=f"{todays[3].company} names new board member",
                                    summary="The date string is garbage.", date="sometime last week"))
        folder = out / day.isoformat()
        folder.mkdir(parents=True, exist_ok=True)
        updated = datetime(day.year, day.month, day.day, 21, 0, tzinfo=TZ).isoformat()
        for slug, title, kind in feeds:
            text = _rss(title, slug, items[slug]) if kind == "rss" else _atom(title, slug, items[slug], updated)
            if offset % 7 == 3 and slug == feeds[-1][0]:
                text = text[: int(len(text) * 0.6)]  # truncated download: ill-formed XML
            (folder / f"{slug}.xml").write_text(text, encoding="utf-8")
        if offset % 9 == 5:  # an HTML error page saved where a feed should be
            (folder / "pressroom.xml").write_text(
                "<html><head><title>503 Service Unavailable</title></head><body><h1>Service Unavailable</h1></body></html>\n",
                encoding="utf-8",
            )
        stats[day.isoformat()] = dict(feeds=len(feeds), events=len(todays), follow_ups=len(follow))
        previous = todays
    (out / "README.md").write_text(
        "# Bundled feed archive (fictional)\n\n"
        "Written by `python -m scripts.make_feeds_archive` (seeded, deterministic). One folder per day, one XML file\n"
        "per feed (RSS 2.0 and Atom). Events are fictional, about real tickers; some days' headlines follow up on\n"
        "the previous day's events. Some files and entries are broken on purpose (truncated XML, an HTML error page,\n"
        "entries without title or date, absurd dates, duplicates, yesterday's items) to exercise the quarantine.\n",
        encoding="utf-8",
    )
    return stats


def main() -> None:
    stats = build()
    total = sum(s["events"] for s in stats.values())
    print(f"wrote {len(stats)} days, {total} events to {OUT}")


if __name__ == "__main__":
    main()
