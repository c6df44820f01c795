"""Write the bundled feed archive `sample_data/feeds_archive/YYYY-MM-DD/*.xml`.

26 consecutive days (2025-11-03 .. 2025-11-28, inside the bundled price data), four feeds a day
(two RSS 2.0, two Atom; one is missing on some days), 25-40 entries a day. Fictional events
about real tickers, built from the templates the tiny-local corpus uses; about a quarter of each
day's entries follow up on the previous day's events, so the judge has something to compare the
notes against. The events are invented, the share moves are not: every follow-up states the real
close-to-close move of its ticker from `sample_data/prices/daily_close.csv` (`real_move`):

- on an XNYS session D: the move from the previous session's close to D's close, one decimal
  ("AAPL shares rise 1.3% after the news", "Apple shares gain a day after ...", "... close flat ...");
- on a day with no session (weekends, holidays): no move is claimed for that day; the follow-up
  says the market is closed and names the last session and its move
  ("Markets closed Saturday; AAPL shares last rose 1.3% in the 2025-11-21 session").

Deliberate damage, as live feeds have it:
cross-feed duplicates, yesterday's items repeated, entries with no title, absurd or unparseable
dates, a truncated (ill-formed) feed, and an HTML error page where a feed should be.
Deterministic (seeded).

    python -m scripts.make_feeds_archive
"""

from __future__ import annotations

import csv
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
PRICES = Path(__file__).resolve().parent.parent / "sample_data" / "prices" / "daily_close.csv"
FIRST_DAY = date(2025, 11, 3)
DAYS = 26
TZ = ZoneInfo("America/New_York")
FEEDS = (
    ("market-wire", "Market Wire", "rss"),
    ("street-desk", "Street Desk", "atom"),
    ("sector-brief", "Sector Brief", "rss"),
    ("ticker-tape", "Ticker Tape", "atom"),
)
# A follow-up's wording, by the template the seeded stream picks (0, 1 or 2). {move}: "rise 1.3%",
# "fall 1.3%" or "close flat"; {word}: "gain", "slide" or "close flat"; {moved}: "rose 1.3%",
# "fell 1.3%" or "closed flat"; {analysts}: "lift", "cut" or "hold". All from the real prices.
FOLLOW_UP_SESSION = (
    "{ticker} shares {move} after the news",
    "{co} shares {word} a day after {event}",
    "Analysts {analysts} {co} targets; {ticker} shares {move} after the news",
)
FOLLOW_UP_NO_SESSION = (  # no session that day: no move today, the last session's move, named
    "Markets closed {weekday}; {ticker} shares last {moved} in the {session} session",
    "Markets closed a day after {event}; {ticker} shares last {moved} in the {session} session",
    "Analysts {analysts} {co} targets; {ticker} shares last {moved} in the {session} session",
)


def load_closes(path: Path = PRICES) -> dict[str, dict[date, float]]:
    """symbol -> {session date: close} from the bundled price file (its dates are the XNYS sessions)."""
    closes: dict[str, dict[date, float]] = {}
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            closes.setdefault(row["symbol"], {})[date.fromisoformat(row["date"])] = float(row["close"])
    return closes


@dataclass(frozen=True)
class Move:
    session: date  # the session whose close-to-close move this is: `day` itself, or the last one before it
    pct: float  # previous session's close -> `session`'s close, in percent, rounded to one decimal
    on_day: bool  # `day` is a session


def real_move(closes: dict[date, float], day: date) -> Move:
    """The real move of one symbol for `day`: that session's move, or the last session's when `day` has none."""
    sessions = sorted(d for d in closes if d <= day)
    if len(sessions) < 2:
        raise ValueError(f"no close before {day}: the price file does not cover the archive")
    session, before = sessions[-1], sessions[-2]
    pct = round((closes[session] / closes[before] - 1.0) * 100.0, 1) + 0.0  # + 0.0: no "-0.0"
    return Move(session, pct, session == day)


def _wording(move: Move) -> dict[str, str]:
    size = f"{abs(move.pct):.1f}%"
    if move.pct > 0:
        return dict(move=f"rise {size}", word="gain", moved=f"rose {size}", analysts="lift")
    if move.pct < 0:
        return dict(move=f"fall {size}", word="slide", moved=f"fell {size}", analysts="cut")
    return dict(move="close flat", word="close flat", moved="closed flat", analysts="hold")


@dataclass
class Event:
    ticker: str
    company: str
    positive: bool
    title: str
    summary: str
    published: datetime
    origin: str = ""  # the fresh event's title a follow-up goes back to ("" for a fresh event)


def _events(rng: random.Random, day: date, n: int) -> list[Event]:
    out = []
    for ticker, company in rng.sample(sorted(COMPANIES.items()), n):
        positive = rng.random() < 0.5
        title_t, summary_t = rng.choice(POSITIVE if positive else NEGATIVE)
        fill = dict(co=company, seg=rng.choice(SEGMENTS), pct=rng.randint(2, 19), n=rng.randint(2, 60))
        published = datetime(day.year, day.month, day.day, rng.randint(6, 20), rng.randint(0, 59), tzinfo=TZ)
        out.append(Event(ticker, company, positive, title_t.format(**fill), summary_t.format(**fill), published))
    return out


def _without_move(title: str) -> str:
    # A fresh event without its own fictional after-hours move ("..., shares slide after hours"):
    # a follow-up states only the real move.
    return title.split(", shares ")[0]


def _event_phrase(title: str, company: str) -> str:
    title = _without_move(title)  # a leading company name keeps its capitals
    return title if title.startswith(company) else title[0].lower() + title[1:]


def _follow_ups(
    rng: random.Random, day: date, previous: list[Event], n: int, closes: dict[str, dict[date, float]]
) -> list[Event]:
    out = []
    taken: set[str] = set()
    for ev in rng.sample(previous, min(n, len(previous))):
        # Draws kept from the old invented moves (direction, template, size) so that the seeded
        # stream, and with it every day's entries, feeds and damage, stays the same; the direction
        # and the size now come from the prices.
        rng.random()
        variant = rng.choice((0, 1, 2))
        rng.randint(1, 9)
        origin = ev.origin or ev.title
        move = real_move(closes[ev.ticker], day)
        templates = FOLLOW_UP_SESSION if move.on_day else FOLLOW_UP_NO_SESSION
        fill = dict(
            ticker=ev.ticker,
            co=ev.company,
            event=_event_phrase(ev.title, ev.company),
            weekday=f"{day:%A}",
            session=move.session.isoformat(),
            **_wording(move),
        )
        # "a day after" a follow-up would name an older event; and two follow-ups of one ticker
        # (yesterday's event and yesterday's follow-up) take different wordings, so that the same
        # real move does not turn them into duplicates.
        choices = [v for v in (variant, (variant + 1) % 3, (variant + 2) % 3) if not (v == 1 and ev.origin)]
        titles = [templates[v].format(**fill) for v in choices]
        title = next((t for t in titles if t not in taken), titles[0])
        taken.add(title)
        summary = f"Follow-up: {_without_move(origin)}."
        published = datetime(day.year, day.month, day.day, rng.randint(7, 12), rng.randint(0, 59), tzinfo=TZ)
        out.append(Event(ev.ticker, ev.company, move.pct > 0, title, summary, published, origin))
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
            f'<guid isPermaLink="false">{slug}-{it["id"]}</guid>'
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
            + (
                f"<published>{escape(it['date'])}</published><updated>{escape(it['date'])}</updated>"
                if it["date"] is not None
                else ""
            )
            + "</entry>"
        )
    parts.append("</feed>")
    return "\n".join(parts) + "\n"


def _format_date(dt: datetime, kind: str) -> str:
    return format_datetime(dt) if kind == "rss" else dt.isoformat()


def build(out: Path = OUT, first_day: date = FIRST_DAY, days: int = DAYS, seed: int = 11) -> dict:
    rng = random.Random(seed)
    closes = load_closes()
    if out.exists():
        shutil.rmtree(out)
    previous: list[Event] = []
    stats = {}
    for offset in range(days):
        day = first_day + timedelta(days=offset)
        n_total = rng.randint(25, 34)
        n_follow = min(len(previous), rng.randint(5, 9))
        fresh = _events(rng, day, n_total - n_follow)
        follow = _follow_ups(rng, day, previous, n_follow, closes)
        todays = fresh + follow
        rng.shuffle(todays)
        feeds = list(FEEDS)
        if offset % 5 == 4:  # some days one feed publishes nothing
            feeds.pop(rng.randrange(len(feeds)))
        items: dict[str, list[dict]] = {slug: [] for slug, _, _ in feeds}
        for i, ev in enumerate(todays):
            slug, _, kind = feeds[i % len(feeds)]
            items[slug].append(
                dict(id=f"{day:%Y%m%d}-{i}", title=ev.title, summary=ev.summary, date=_format_date(ev.published, kind))
            )
        # cross-feed duplicates (a wire story picked up by another feed, with different spacing/case)
        for ev in rng.sample(todays, 2):
            slug, _, kind = feeds[rng.randrange(len(feeds))]
            items[slug].append(
                dict(
                    id=f"{day:%Y%m%d}-dup-{ev.ticker}",
                    title="  " + ev.title.upper() + " ",
                    summary=ev.summary,
                    date=_format_date(ev.published + timedelta(minutes=7), kind),
                )
            )
        # yesterday's items repeated late in the feed
        for ev in previous[:2]:
            slug, _, kind = feeds[rng.randrange(len(feeds))]
            items[slug].append(
                dict(
                    id=f"{day:%Y%m%d}-old-{ev.ticker}",
                    title=ev.title,
                    summary=ev.summary,
                    date=_format_date(ev.published, kind),
                )
            )
        # broken entries: no title, no date, absurd date, unparseable date (not every day)
        if offset % 2 == 0:
            slug, _, kind = feeds[0]
            items[slug].append(
                dict(
                    id=f"{day:%Y%m%d}-notitle",
                    title="",
                    summary="An entry with no title.",
                    date=_format_date(todays[0].published, kind),
                )
            )
        if offset % 3 == 0:
            slug, _, kind = feeds[-1]
            items[slug].append(
                dict(
                    id=f"{day:%Y%m%d}-absurd",
                    title=f"{todays[1].company} sets date for investor day",
                    summary="The date on this entry is nonsense.",
                    date="Thu, 01 Jan 2099 00:00:00 GMT" if kind == "rss" else "2099-01-01T00:00:00Z",
                )
            )
            items[slug].append(
                dict(
                    id=f"{day:%Y%m%d}-nodate",
                    title=f"{todays[2].company} to present at industry conference",
                    summary="This entry has no date.",
                    date=None,
                )
            )
        if offset % 4 == 1:
            slug, _, kind = feeds[1]
            items[slug].append(
                dict(
                    id=f"{day:%Y%m%d}-baddate",
                    title=f"{todays[3].company} names new board member",
                    summary="The date string is garbage.",
                    date="sometime last week",
                )
            )
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
        "per feed (RSS 2.0 and Atom).\n\n"
        "The events are fictional (invented headlines about real tickers). The share moves are not: about a quarter\n"
        "of each day's headlines follow up on the previous day's events, and every statement of a share move in them\n"
        "is the real close-to-close move of that symbol from the bundled prices (`sample_data/prices/daily_close.csv`),\n"
        "rounded to one decimal:\n\n"
        "- On an XNYS session day D, a follow-up states the move from the previous session's close to D's close:\n"
        '  "AAPL shares rise 1.3% after the news", "Apple shares gain a day after ..." (gain/slide: the sign of that\n'
        '  move), "... shares close flat ..." when the move rounds to 0.0%. "Analysts lift/cut/hold" follows the sign too.\n'
        "- On a day with no session (weekends; Thanksgiving, 2025-11-27), no move is claimed for that day: the\n"
        "  follow-up says the market is closed and states the last session's real move with that session named:\n"
        '  "Markets closed Saturday; AAPL shares last rose 1.3% in the 2025-11-21 session".\n\n'
        '(The fresh headline template "... cuts outlook, shares slide after hours" is part of the fictional events; it\n'
        "is not a close-to-close statement and follow-ups do not repeat it.) `tests/daily_rl/feeds/test_feeds_archive.py` checks\n"
        "every readable move statement against the prices.\n\n"
        "Some files and entries are broken on purpose (truncated XML, an HTML error page, entries without title or\n"
        "date, absurd dates, duplicates, yesterday's items) to exercise the quarantine.\n",
        encoding="utf-8",
    )
    return stats


def main() -> None:
    stats = build()
    total = sum(s["events"] for s in stats.values())
    print(f"wrote {len(stats)} days, {total} events to {OUT}")


if __name__ == "__main__":
    main()
