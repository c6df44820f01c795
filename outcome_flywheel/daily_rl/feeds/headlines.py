"""Feed entries -> headline rows, with a quarantine row (and its reason) for everything dropped.

Accounting: for every feed, entries in = headlines kept + entries quarantined; a feed that cannot
be read at all (fetch error, not a feed, ill-formed with nothing recoverable) is one quarantine
row with no entry. Dates are checked twice: feedparser's lenient parser turns odd strings into
nonsense dates, so a date far from the partition's day is "implausible", and one that is merely
another day is "not on D" (feeds repeat yesterday's items).
"""

from __future__ import annotations

import calendar
import hashlib
import html
import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import feedparser
import pandas as pd

# The `headlines` table's stored columns, in order: column -> (type, description) as the Dagster catalog
# shows them (assets/catalog.py reads them from here).
HEADLINE_COLUMN_SCHEMA: dict[str, tuple[str, str]] = {
    "date": ("string", "Partition day D (YYYY-MM-DD, FLYWHEEL_TIMEZONE)."),
    "headline_id": ("string", "Stable id of the headline: hash of the day and its normalised title."),
    "title": ("string", "Headline text, HTML stripped."),
    "summary": ("string", "Feed summary/description, HTML stripped, at most 500 characters."),
    "source": ("string", "The feed's title (or its file name)."),
    "link": ("string", "The entry's link, empty when the feed gave none."),
    "published_at": ("timestamp", "Publication time, UTC (naive)."),
    "feed_file": ("string", "Feed file the entry came from (archive file or the saved live download)."),
}
HEADLINE_COLUMNS = list(HEADLINE_COLUMN_SCHEMA)
QUARANTINE_COLUMNS = ["date", "feed_file", "source", "entry_index", "title", "published", "reason", "detail"]
SOURCE_COLUMNS = [
    "date",
    "feed_file",
    "source",
    "feed_format",
    "sha256",
    "bytes",
    "status",
    "bozo",
    "bozo_exception",
    "entries",
    "kept",
    "quarantined",
]
# Quarantine reasons that stand for a whole feed rather than one of its entries.
FEED_LEVEL_REASONS = ("fetch_failed", "unparseable_feed", "ill_formed_feed", "not_a_feed", "no_entries")
# How far from the partition's day a date may be before we call it nonsense rather than "another day".
PLAUSIBLE_DAYS = 30
MAX_SUMMARY_CHARS = 500

_TAG = re.compile(r"<[^>]+>")
_SPACE = re.compile(r"\s+")
_NON_WORD = re.compile(r"[^\w\s]")


@dataclass
class RawFeed:
    """One feed's bytes as fetched (or the reason there are none)."""

    name: str  # file name (archive) or URL (live)
    data: bytes | None
    sha256: str = ""
    path: str = ""  # where the bytes are kept on disk
    error: str = ""


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def clean_text(value: str | None) -> str:
    """HTML tags and entities out, whitespace collapsed."""
    text = html.unescape(_TAG.sub(" ", value or ""))
    return _SPACE.sub(" ", text).strip()


def normalise_title(title: str) -> str:
    """The key duplicates are found by: lower case, no punctuation, single spaces."""
    return _SPACE.sub(" ", _NON_WORD.sub(" ", clean_text(title).lower())).strip()


def headline_id(day: str, title: str) -> str:
    """Stable id of a headline: the day and its normalised title."""
    return hashlib.sha256(f"{day}|{normalise_title(title)}".encode()).hexdigest()[:12]


def entry_datetime(entry) -> tuple[datetime | None, str]:
    """The entry's publication time (UTC) and the raw string it came from."""
    raw = entry.get("published") or entry.get("updated") or entry.get("created") or ""
    parsed = entry.get("published_parsed") or entry.get("updated_parsed") or entry.get("created_parsed")
    if not parsed:
        return None, raw
    try:
        return datetime.fromtimestamp(calendar.timegm(parsed), tz=timezone.utc), raw
    except (OverflowError, ValueError, OSError):
        return None, raw


def parse_feed(raw: RawFeed, day: str, tz: str) -> tuple[list[dict], list[dict], dict]:
    """Entries of one feed published on `day` (in `tz`) as headline rows; the rest quarantined.

    Returns (headlines, quarantine rows, source row). Duplicates across feeds are removed later
    by `build_headlines`.
    """
    zone = ZoneInfo(tz)
    the_day = date.fromisoformat(day)
    source_row = dict(
        date=day,
        feed_file=raw.name,
        source="",
        feed_format="",
        sha256=raw.sha256,
        bytes=len(raw.data or b""),
        status="ok",
        bozo=False,
        bozo_exception="",
        entries=0,
        kept=0,
        quarantined=0,
    )

    def feed_quarantine(reason: str, detail: str) -> tuple[list[dict], list[dict], dict]:
        row = dict(
            date=day,
            feed_file=raw.name,
            source=source_row["source"],
            entry_index=-1,
            title="",
            published="",
            reason=reason,
            detail=detail[:500],
        )
        source_row["status"] = reason  # the feed itself is the quarantined item (no entries counted)
        return [], [row], source_row

    if raw.data is None:
        return feed_quarantine("fetch_failed", raw.error or "no data")
    try:
        parsed = feedparser.parse(raw.data)
    except Exception as err:  # feedparser is lenient; anything it still raises is a broken feed
        return feed_quarantine("unparseable_feed", f"{type(err).__name__}: {err}")
    source = clean_text(parsed.feed.get("title", "")) if parsed.get("feed") else ""
    source_row.update(
        source=source or raw.name,
        feed_format=parsed.get("version", "") or "",
        bozo=bool(parsed.get("bozo")),
        bozo_exception=str(parsed.get("bozo_exception", ""))[:300],
        entries=len(parsed.entries),
    )
    if not parsed.entries:
        if parsed.get("bozo"):
            return feed_quarantine(
                "ill_formed_feed", source_row["bozo_exception"] or "not well-formed, no entries recovered"
            )
        if not source_row["feed_format"]:
            return feed_quarantine("not_a_feed", "no RSS/Atom/RDF structure found (e.g. an HTML page)")
        return feed_quarantine("no_entries", f"{source_row['feed_format']} feed with no entries")

    kept, quarantined = [], []
    for index, entry in enumerate(parsed.entries):
        title = clean_text(entry.get("title"))
        published, raw_date = entry_datetime(entry)

        def drop(reason: str, detail: str = "") -> None:
            quarantined.append(
                dict(
                    date=day,
                    feed_file=raw.name,
                    source=source_row["source"],
                    entry_index=index,
                    title=title[:300],
                    published=str(raw_date)[:100],
                    reason=reason,
                    detail=detail[:500],
                )
            )

        if not normalise_title(title):
            drop("missing_title", "entry has no usable title")
            continue
        if published is None:
            drop("missing_date" if not raw_date else "unparseable_date", f"date string {raw_date!r}")
            continue
        local = published.astimezone(zone)
        if abs((local.date() - the_day).days) > PLAUSIBLE_DAYS:
            drop("implausible_date", f"parsed as {local.isoformat()} from {raw_date!r}")
            continue
        if local.date() != the_day:
            drop("not_on_day", f"published {local.date().isoformat()} in {tz}")
            continue
        summary = clean_text(entry.get("summary") or entry.get("description"))
        if len(summary) > MAX_SUMMARY_CHARS:
            summary = summary[:MAX_SUMMARY_CHARS].rsplit(" ", 1)[0] + " ..."
        kept.append(
            dict(
                date=day,
                headline_id=headline_id(day, title),
                title=title,
                summary=summary,
                source=source_row["source"],
                link=str(entry.get("link") or ""),
                published_at=published.astimezone(timezone.utc).replace(tzinfo=None),
                feed_file=raw.name,
            )
        )
    source_row["kept"], source_row["quarantined"] = len(kept), len(quarantined)
    return kept, quarantined, source_row


def build_headlines(
    raws: list[RawFeed], day: str, tz: str, max_headlines: int
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """All feeds of one day -> (headlines, quarantine, sources) frames.

    Duplicates (same normalised title) keep their earliest copy; past `max_headlines` the latest
    entries are quarantined as `over_cap`. Order is deterministic: publication time, then title.
    """
    rows, quarantine, sources = [], [], []
    for raw in sorted(raws, key=lambda r: r.name):
        kept, dropped, source_row = parse_feed(raw, day, tz)
        rows += kept
        quarantine += dropped
        sources.append(source_row)
    rows.sort(key=lambda r: (r["published_at"], normalise_title(r["title"]), r["feed_file"]))
    seen: dict[str, str] = {}
    unique = []
    for row in rows:
        if row["headline_id"] in seen:
            detail = f"same title as headline {row['headline_id']} from {seen[row['headline_id']]}"
            _set_aside(quarantine, sources, row, day, "duplicate", detail)
            continue
        seen[row["headline_id"]] = row["feed_file"]
        unique.append(row)
    for row in unique[max_headlines:]:
        _set_aside(quarantine, sources, row, day, "over_cap", f"more than {max_headlines} headlines on {day}")
    unique = unique[:max_headlines]
    return (
        pd.DataFrame(unique, columns=HEADLINE_COLUMNS),
        pd.DataFrame(quarantine, columns=QUARANTINE_COLUMNS),
        pd.DataFrame(sources, columns=SOURCE_COLUMNS),
    )


def feed_failures(quarantine: pd.DataFrame) -> list[dict]:
    """The feeds that gave nothing at all (fetch failed, not a feed, ...): feed, reason, detail."""
    rows = quarantine[quarantine["reason"].isin(FEED_LEVEL_REASONS)] if not quarantine.empty else quarantine
    return [dict(feed=r.feed_file, reason=r.reason, detail=r.detail) for r in rows.itertuples()]


def _set_aside(quarantine: list, sources: list, row: dict, day: str, reason: str, detail: str) -> None:
    """A parsed headline that is not kept (a duplicate, over the cap): its quarantine row, and its feed's
    counts moved from kept to quarantined."""
    quarantine.append(
        dict(
            date=day,
            feed_file=row["feed_file"],
            source=row["source"],
            entry_index=-1,
            title=row["title"][:300],
            published=str(row["published_at"]),
            reason=reason,
            detail=detail,
        )
    )
    _move_kept_to_quarantined(sources, row["feed_file"])


def _move_kept_to_quarantined(sources: list[dict], feed_file: str) -> None:
    for s in sources:
        if s["feed_file"] == feed_file:
            s["kept"] -= 1
            s["quarantined"] += 1
            return


def day_bounds(day: str, tz: str) -> tuple[datetime, datetime]:
    """Start and end (exclusive) of `day` in `tz`, as UTC datetimes."""
    start = datetime.combine(date.fromisoformat(day), datetime.min.time(), tzinfo=ZoneInfo(tz))
    return start.astimezone(timezone.utc), (start + timedelta(days=1)).astimezone(timezone.utc)
