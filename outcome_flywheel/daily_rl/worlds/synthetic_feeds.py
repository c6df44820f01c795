"""SYNTHETIC feed archives for the worlds (`prices.py`): more days of news than the bundled archive's 26,
seeded, written from the bundled archive's own event templates. Plain Python; `flywheel make-world
--synthetic-days N --headlines-per-day M --archive-out DIR` writes one and builds the world over it.

Templates (`archive_templates`): every event headline of the bundled archive (not a follow-up, whose
summary starts "Follow-up:" and whose title states a real move) with good or bad news in its title
(`news.news_direction`) and one company named in its title; the company's name, as written, becomes the
slot `{company}`, and the title + summary pair is kept as it is ("{company} beats quarterly estimates on
strong pharma demand" / "Revenue rose 14% as pharma sales beat forecasts."). Companies: the archive's
companies (named as the archive writes them, which is how tiny-local's corpus names them) that the price
file has, SPY aside.

An archive (`write_synthetic_archive`) is N consecutive calendar days (weekends too, like the bundled
one) × M headlines a day, in RSS 2.0 files shaped like the archive's, every feed and item title and
description marked SYNTHETIC, and `synthetic_archive.json` in its root (seed, days, per-day count,
templates used, `synthetic: true`). Each day has half good and half bad news (an odd M: the extra one
drawn); a company appears at most once a day, and headlines whose calls share one window (Friday's,
Saturday's and Sunday's share Monday's entry) name a company again only with the same news, so no
planted move of a world is cancelled by clashing news. Every headline is checked: `feeds.headlines.build_headlines`
keeps it, `notes.relevance.headline_symbols` reads its company alone, `news.news_direction` its planned news.
The days start at the price file's 21st session by default and must leave every call window (h sessions)
inside the price file. `split_days` cuts an archive's days into train / validation / test by position.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Sequence
from xml.sax.saxutils import escape
from zoneinfo import ZoneInfo

import numpy as np
import pandas as pd

from outcome_flywheel.daily_rl.feeds.headlines import build_headlines
from outcome_flywheel.daily_rl.feeds.source import DEFAULT_ARCHIVE, FeedSource
from outcome_flywheel.daily_rl.notes.companies import COMPANY_TICKERS
from outcome_flywheel.daily_rl.notes.outcomes import BENCHMARK, call_window
from outcome_flywheel.daily_rl.notes.relevance import headline_symbols
from outcome_flywheel.daily_rl.worlds.news import news_direction
from outcome_flywheel.market_data import BUNDLED_PRICES, read_price_file
from outcome_flywheel.settings import resolve_path
from outcome_flywheel.storage import atomic_write_bytes

SLOT = "{company}"
# On every feed's title and description, every item's guid and the manifest; not in the headline's own
# words, which the policy reads: a marker it never saw in training moved tiny-local's calls off the
# headline's company (11-13 of 64 notes on it, against ~53 on the bundled archive).
MARK = "(SYNTHETIC)"
MANIFEST_NAME = "synthetic_archive.json"
FEEDS = ("synthetic-wire", "synthetic-desk")
START_SESSION = 20  # default first day: the price file's 21st session, so every world has closes before it
PLAN_COLUMNS = ["date", "symbol", "company", "news", "template", "title", "summary", "feed", "published"]


@dataclass(frozen=True)
class EventTemplate:
    title: str  # with SLOT where the company goes
    summary: str
    news: int  # +1 good, -1 bad

    @property
    def event(self) -> str:
        """The kind of event: the title's first word besides the company ("beats", "Regulators", "recalls")."""
        return next(w for w in self.title.split() if SLOT not in w).lower()

    def fill(self, company: str) -> tuple[str, str]:
        return self.title.replace(SLOT, company), self.summary.replace(SLOT, company)


def _name_pattern(name: str) -> str:
    return r"(?<![\w&])" + re.escape(name).replace(r"\ ", r"\s+") + r"(?![\w&])"


def company_mention(text: object, symbol: str) -> str | None:
    """The words `text` names `symbol` by, as written: the first of its names in `notes.calls.COMPANY_TICKERS`
    (capitalised, the longest at one place) or its ticker ("$AAPL", "AAPL"); None when it names it nowhere."""
    if not isinstance(text, str):
        return None
    hits = []
    for name in (n for n, t in COMPANY_TICKERS.items() if t == symbol):
        for m in re.finditer(_name_pattern(name), text, re.IGNORECASE):
            if m.group(0)[0].isupper() or not m.group(0)[0].isalpha():
                hits.append((m.start(), -len(m.group(0)), m.group(0)))
    for m in re.finditer(r"(?<![\w&])\$?" + re.escape(symbol) + r"(?![\w&])", text):
        hits.append((m.start(), -len(m.group(0)), m.group(0)))
    return min(hits)[2] if hits else None


def _archive_headlines(archive_dir: str | Path, tz: str) -> pd.DataFrame:
    folder = resolve_path(str(archive_dir))
    days = sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
    if not days:
        raise FileNotFoundError(f"feed archive {folder} has no day folders (YYYY-MM-DD/*.xml)")
    source = FeedSource(archive_dir=str(folder))
    frames = [build_headlines(source.fetch(day), day, tz, max_headlines=10**9)[0] for day in days]
    return pd.concat(frames, ignore_index=True)


def archive_templates(
    archive_dir: str | Path = DEFAULT_ARCHIVE, tz: str = "America/New_York"
) -> tuple[list[EventTemplate], dict[str, str]]:
    """(the archive's event templates, sorted and unique; {symbol: the name the archive writes it by, the
    most common}). Only headlines whose filled-in template reads the same company and news are kept."""
    templates, names = set(), {}
    for h in _archive_headlines(archive_dir, tz).itertuples(index=False):
        if (
            h.summary.startswith("Follow-up") or MARK in h.title or h.title.isupper()
        ):  # isupper: the archive's shouted duplicates
            continue
        symbols, news = headline_symbols(h.title), news_direction(h.title)
        if len(symbols) != 1 or news == 0:
            continue
        mention = company_mention(h.title, symbols[0])
        if not mention or h.title.count(mention) != 1:
            continue
        template = EventTemplate(h.title.replace(mention, SLOT), h.summary.replace(mention, SLOT), news)
        if _reads(template, mention, symbols[0]):
            templates.add(template)
            names.setdefault(symbols[0], Counter())[mention] += 1
    chosen = {s: sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))[0][0] for s, c in names.items()}
    return sorted(templates, key=lambda t: (t.news, t.title, t.summary)), chosen


def _reads(template: EventTemplate, company: str, symbol: str) -> bool:
    title, summary = template.fill(company)
    return headline_symbols(title, summary) == (symbol,) and news_direction(title, summary) == template.news


def synthetic_days(days: int, start: str) -> list[str]:
    """`days` consecutive calendar days from `start` (YYYY-MM-DD)."""
    first = pd.Timestamp(start)
    return [(first + pd.Timedelta(days=i)).date().isoformat() for i in range(days)]


def default_start(prices: pd.DataFrame) -> str:
    """The price file's 21st session (2025-07-01 for the bundled prices): closes before the first day."""
    sessions = sorted(prices["date"].unique())
    return sessions[min(START_SESSION, len(sessions) - 1)]


def check_days_fit(day_list: Sequence[str], prices: pd.DataFrame, horizon: int = 1) -> None:
    """ValueError unless every day and its call window (h sessions) lie inside the price file's dates."""
    first, last = min(prices["date"]), max(prices["date"])
    for day in (day_list[0], day_list[-1]):
        w = call_window(day, horizon)
        if not (day >= first and w.exit_date <= last):
            raise ValueError(
                f"day {day}'s call window ({w.entry_date}..{w.exit_date}, h={horizon}) is not inside the price "
                f"file's dates {first}..{last}: choose another start or fewer days"
            )


def plan_headlines(
    day_list: Sequence[str],
    per_day: int,
    seed: int,
    templates: Sequence[EventTemplate],
    names: dict[str, str],
    tz: str = "America/New_York",
) -> pd.DataFrame:
    """Every synthetic headline (PLAN_COLUMNS), seeded: per day half good and half bad news, distinct
    companies, a company again inside one call window only with the same news, an event kind drawn evenly
    (then one of its templates), published 07:00-18:59 New York time."""
    by_news = {s: {} for s in (1, -1)}  # news -> event -> its templates' indices
    for i, t in enumerate(templates):
        by_news[t.news].setdefault(t.event, []).append(i)
    if not by_news[1] or not by_news[-1]:
        raise ValueError("the template archive needs both good and bad event templates")
    symbols = sorted(names)
    if not 0 < per_day <= len(symbols):
        raise ValueError(f"headlines per day must be 1..{len(symbols)} (one per company a day), got {per_day}")
    rng, zone = np.random.default_rng(seed), ZoneInfo(tz)
    rows, window, taken = [], None, {}  # taken: symbol -> news inside the current call window
    for day in day_list:
        landing = call_window(day, 1).exit_date
        if landing != window:
            window, taken = landing, {}
        signs = [1, -1] * (per_day // 2) + ([int(rng.choice([1, -1]))] if per_day % 2 else [])
        signs = [signs[i] for i in rng.permutation(len(signs))]
        minutes = np.sort(rng.choice(12 * 60, size=per_day, replace=False))
        today: set[str] = set()
        for i, (sign, minute) in enumerate(zip(signs, minutes)):
            free = [s for s in symbols if s not in taken and s not in today]
            same = [s for s in symbols if taken.get(s) == sign and s not in today]
            pool = free or same
            if not pool:
                raise ValueError(
                    f"{per_day} headlines a day leave no company for {day} without clashing news: use fewer"
                )
            symbol = pool[int(rng.integers(len(pool)))]
            events = sorted(by_news[sign])
            choices = by_news[sign][events[int(rng.integers(len(events)))]]
            index = choices[int(rng.integers(len(choices)))]
            template = templates[index]
            title, summary = template.fill(names[symbol])
            taken[symbol] = sign
            today.add(symbol)
            local = datetime.fromisoformat(day).replace(tzinfo=zone) + timedelta(hours=7, minutes=int(minute))
            rows.append(
                dict(
                    date=day,
                    symbol=symbol,
                    company=names[symbol],
                    news=sign,
                    template=index,
                    title=title,
                    summary=summary,
                    feed=FEEDS[i % len(FEEDS)],
                    published=local,
                )
            )
    return pd.DataFrame(rows, columns=PLAN_COLUMNS)


def feed_xml(feed: str, day: str, items: pd.DataFrame) -> bytes:
    """One day's RSS 2.0 file of one feed, shaped like the bundled archive's."""
    name = feed.replace("-", " ").title()
    out = [
        '<?xml version="1.0" encoding="utf-8"?>',
        '<rss version="2.0"><channel>',
        f"<title>{name} {MARK}</title><link>https://example.com/{feed}</link>",
        f"<description>{name}: SYNTHETIC headlines for a world (flywheel make-world), fictional events {MARK}</description>",
    ]
    compact = day.replace("-", "")
    for n, r in enumerate(items.itertuples(index=False)):
        out.append(
            f"<item><title>{escape(r.title)}</title><link>https://example.com/{feed}/{compact}-{n}</link>"
            f'<guid isPermaLink="false">synthetic-{feed}-{compact}-{n}</guid><description>{escape(r.summary)}</description>'
            f"<pubDate>{format_datetime(r.published)}</pubDate></item>"
        )
    out.append("</channel></rss>\n")
    return "\n".join(out).encode()


def write_synthetic_archive(
    out_dir: str | Path,
    days: int = 60,
    per_day: int = 16,
    seed: int = 0,
    start: str | None = None,
    template_archive: str | Path = DEFAULT_ARCHIVE,
    prices_file: str | Path = BUNDLED_PRICES,
    tz: str = "America/New_York",
    horizon: int = 1,
) -> dict:
    """Write `days` × `per_day` SYNTHETIC headlines as `out_dir/YYYY-MM-DD/<feed>.xml` and the manifest
    `out_dir/synthetic_archive.json`; return the manifest. Every headline is read back through
    `build_headlines` and must come back whole, with its company and news (else RuntimeError)."""
    if days < 1:
        raise ValueError(f"days must be >= 1, got {days}")
    prices = read_price_file(resolve_path(str(prices_file)))
    templates, names = archive_templates(template_archive, tz)
    universe = set(prices["symbol"]) - {BENCHMARK}
    names = {s: n for s, n in names.items() if s in universe}
    day_list = synthetic_days(days, start or default_start(prices))
    check_days_fit(day_list, prices, horizon)
    plan = plan_headlines(day_list, per_day, seed, templates, names, tz)
    out = Path(out_dir)
    _clear_old_archive(out)
    for (day, feed), items in plan.groupby(["date", "feed"], sort=True):
        atomic_write_bytes(out / day / f"{feed}.xml", feed_xml(feed, day, items))
    _check_read_back(out, plan, tz)
    used = plan.groupby("template").size()
    manifest = dict(
        synthetic=True,
        note="SYNTHETIC headlines: fictional events written from the bundled archive's event templates; no "
        "headline is news. Written by `flywheel make-world --synthetic-days` (worlds/synthetic_feeds.py).",
        seed=seed,
        days=days,
        headlines_per_day=per_day,
        first_day=day_list[0],
        last_day=day_list[-1],
        horizon=horizon,
        feeds=list(FEEDS),
        template_archive=str(resolve_path(str(template_archive))),
        prices_file=str(resolve_path(str(prices_file))),
        headlines=len(plan),
        good_news=int((plan["news"] > 0).sum()),
        bad_news=int((plan["news"] < 0).sum()),
        companies={s: names[s] for s in sorted(set(plan["symbol"]))},
        templates=[
            dict(title=t.title, summary=t.summary, news=t.news, uses=int(used.get(i, 0)))
            for i, t in enumerate(templates)
        ],
    )
    atomic_write_bytes(out / MANIFEST_NAME, (json.dumps(manifest, indent=1) + "\n").encode())
    return manifest


def _clear_old_archive(out: Path) -> None:
    """An earlier synthetic archive in `out` goes (its feed files, then its emptied day folders), so no
    stale day is read; a folder holding anything else is refused."""
    if not out.exists():
        return
    if not out.is_dir() or (any(out.iterdir()) and not (out / MANIFEST_NAME).is_file()):
        raise ValueError(f"{out} is not empty and holds no synthetic archive ({MANIFEST_NAME}): give a new folder")
    for xml in out.glob("????-??-??/synthetic-*.xml"):
        xml.unlink()
    for day in out.glob("????-??-??"):
        if day.is_dir() and not any(day.iterdir()):
            day.rmdir()


def _check_read_back(folder: Path, plan: pd.DataFrame, tz: str) -> None:
    source = FeedSource(archive_dir=str(folder))
    for day, want in plan.groupby("date", sort=True):
        got, quarantine, _ = build_headlines(source.fetch(day), day, tz, max_headlines=10**9)
        if len(quarantine) or sorted(got["title"]) != sorted(want["title"]):
            raise RuntimeError(
                f"synthetic feeds of {day} do not read back whole: {len(got)} of {len(want)} kept, "
                f"{len(quarantine)} quarantined"
            )
        planned = dict(zip(want["title"], zip(want["symbol"], want["news"])))
        for h in got.itertuples(index=False):
            symbol, news = planned[h.title]
            if headline_symbols(h.title, h.summary) != (symbol,) or news_direction(h.title, h.summary) != news:
                raise RuntimeError(f"synthetic headline {h.title!r} does not read as {symbol} with news {news:+d}")


def read_archive_manifest(archive_dir: str | Path) -> dict | None:
    """The synthetic archive's manifest, or None for an archive of (fictional but not generated) feeds."""
    path = resolve_path(str(archive_dir)) / MANIFEST_NAME
    return json.loads(path.read_text()) if path.is_file() else None


def archive_day_list(archive: str | Path | Sequence[str]) -> list[str]:
    if isinstance(archive, (str, Path)):
        folder = resolve_path(str(archive))
        return sorted(p.name for p in folder.iterdir() if p.is_dir() and re.fullmatch(r"\d{4}-\d{2}-\d{2}", p.name))
    return sorted(archive)


def split_days(
    archive: str | Path | Sequence[str], validation: float = 0.2, test: float = 0.2
) -> tuple[list[str], list[str], list[str]]:
    """(train, validation, test) days, in date order and by position: the first days train, the next
    `validation` share stops early, the last `test` share is held out, so no split learns from a later
    one's news. A cut never parts days whose calls share one window (h = 1: Friday to Sunday enter on
    Monday): it moves to the next day with a window of its own. `archive`: a folder or a list of days."""
    days = archive_day_list(archive)
    if not (0 <= validation < 1 and 0 <= test < 1 and validation + test < 1):
        raise ValueError(
            f"validation and test are shares of the days, each in [0, 1) and together under 1; got {validation}, {test}"
        )
    exits = [call_window(d, 1).exit_date for d in days]

    def cut(at: int) -> int:
        while 0 < at < len(days) and exits[at] == exits[at - 1]:
            at += 1
        return at

    n = len(days)
    first_test = cut(n - round(n * test))
    first_validation = min(cut(n - round(n * test) - round(n * validation)), first_test)
    return days[:first_validation], days[first_validation:first_test], days[first_test:]
