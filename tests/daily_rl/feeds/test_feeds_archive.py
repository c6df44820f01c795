"""The bundled feed archive's events are fictional, its share moves are real: every statement of a
share move in the archive is the close-to-close move of that symbol in the bundled prices.

Each readable entry (feedparser; what it cannot read is skipped) is split into clauses at "; ". A
clause with "shares" in it is a move statement, dated by the entry's own publication date (New York),
or the archive folder's day when the entry has none that parses:

- "{TICKER} shares rise|fall N.N% after the news", "{TICKER} shares close flat after the news",
  "{Company} shares gain|slide|close flat a day after ...": a move on that day, which must be an XNYS
  session; the number (one decimal) and the sign are the move from the previous session's close;
- "{TICKER} shares last rose|fell N.N% in the YYYY-MM-DD session", "... last closed flat in the
  YYYY-MM-DD session": on a day with no session only, naming the last session before it.

Any other "shares" clause fails the test, except the fictional after-hours wording of the fresh event
template "{Company} cuts outlook, shares slide after hours" (not a close-to-close statement).
"""

import csv
import re
import shutil
from datetime import date, datetime
from email.utils import parsedate_to_datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import exchange_calendars as xcals
import feedparser
import pytest

from outcome_flywheel.settings import SAMPLE_DATA
from scripts.make_tiny_local_corpus import COMPANIES

ARCHIVE = SAMPLE_DATA / "feeds_archive"
PRICES = SAMPLE_DATA / "prices" / "daily_close.csv"
TZ = ZoneInfo("America/New_York")
# the symbol a statement's subject names: a ticker or a company name, any case
SUBJECTS = {t.lower(): t for t in COMPANIES} | {c.lower(): t for t, c in COMPANIES.items()}

ON_DAY = [  # a move on the entry's day
    re.compile(r"shares (?P<word>rise|fall) (?P<pct>\d+\.\d)% after the news"),
    re.compile(r"shares (?P<word>close flat) after the news"),
    re.compile(r"shares (?P<word>gain|slide|close flat) a day after \S.*"),
]
LAST_SESSION = [  # no session on the entry's day: the last session's move, named
    re.compile(r"shares last (?P<word>rose|fell) (?P<pct>\d+\.\d)% in the (?P<session>\d{4}-\d{2}-\d{2}) session"),
    re.compile(r"shares last (?P<word>closed flat) in the (?P<session>\d{4}-\d{2}-\d{2}) session"),
]
SIGN = {"rise": 1, "gain": 1, "rose": 1, "fall": -1, "slide": -1, "fell": -1, "close flat": 0, "closed flat": 0}
FICTIONAL = re.compile(r"(?P<company>.+) cuts outlook, shares slide after hours")  # the fresh event template
MOVE_WORDS = re.compile(
    r"\b(rises?|rose|falls?|fell|gains?|slides?|slid|flat|jumps?|drops?|climbs?|sinks?|extends?|surges?|"
    r"plunges?|tumbles?|soars?)\b"
)


def _closes() -> dict[str, dict[date, float]]:
    closes: dict[str, dict[date, float]] = {}
    with open(PRICES, newline="") as fh:
        for row in csv.DictReader(fh):
            closes.setdefault(row["symbol"], {})[date.fromisoformat(row["date"])] = float(row["close"])
    return closes


CLOSES = _closes()


def _move(symbol: str, session: date) -> float:
    """`session`'s close over the previous session's, in percent, to one decimal."""
    sessions = sorted(CLOSES[symbol])
    i = sessions.index(session)
    assert i > 0, f"{symbol}: no session before {session} in the price file"
    return round((CLOSES[symbol][session] / CLOSES[symbol][sessions[i - 1]] - 1.0) * 100.0, 1)


def _entry_day(entry, folder_day: date) -> date:
    raw = (entry.get("published") or entry.get("updated") or "").strip()
    for parse in (parsedate_to_datetime, datetime.fromisoformat):
        try:
            dt = parse(raw)
        except (TypeError, ValueError, IndexError):
            continue
        if dt.tzinfo is not None:
            return dt.astimezone(TZ).date()
    return folder_day


def statements(archive: Path) -> list[dict]:
    """Every "shares" clause of every readable entry of the archive, with where it is and its day."""
    out = []
    for path in sorted(archive.glob("*/*.xml")):
        folder_day = date.fromisoformat(path.parent.name)
        for entry in feedparser.parse(path.read_bytes()).entries:
            day = _entry_day(entry, folder_day)
            for field in ("title", "summary"):
                text = " ".join((entry.get(field) or "").split())
                for clause in text.split("; "):
                    where = f"{path.relative_to(archive)} {field} {text!r}"
                    if re.search(r"\bshares\b", clause, re.I) or (
                        field == "title" and MOVE_WORDS.search(clause.lower())
                    ):
                        out.append(dict(where=where, day=day, clause=clause.strip().rstrip(".")))
    return out


def check(statement: dict) -> tuple[str, str | None]:
    """(kind, problem): kind is "on_day", "last_session" or "fictional"; problem is None when true."""
    clause, day = statement["clause"], statement["day"]
    low = clause.lower()
    if FICTIONAL.fullmatch(low) and FICTIONAL.fullmatch(low)["company"] in SUBJECTS:
        return "fictional", None
    subject, sep, rest = low.partition(" shares ")
    if not sep:
        return "unknown", "a move wording with no 'shares' statement the test knows"
    symbol = SUBJECTS.get(subject.strip())
    if symbol is None or symbol not in CLOSES:
        return "unknown", f"subject {subject!r} is not a symbol of the price file"
    rest = "shares " + rest
    match = next((m for p in ON_DAY if (m := p.fullmatch(rest))), None)
    kind = "on_day"
    if match is None:
        match = next((m for p in LAST_SESSION if (m := p.fullmatch(rest))), None)
        kind = "last_session"
    if match is None:
        return "unknown", "unrecognised move wording"
    if kind == "on_day":
        if day not in CLOSES[symbol]:
            return kind, f"claims a {symbol} move on {day}, which is not a session"
        session = day
    else:
        session = date.fromisoformat(match["session"])
        if day in CLOSES[symbol]:
            return kind, f"{day} is a session: its own move should be stated, not {session}'s"
        last = max(d for d in CLOSES[symbol] if d < day)
        if session != last:
            return kind, f"names the {session} session; the last session before {day} is {last}"
    real = _move(symbol, session)
    sign = SIGN[match["word"]]
    stated = sign * float(match["pct"]) if match.groupdict().get("pct") else None
    if sign == 0 and real != 0.0:
        return kind, f"says flat; {symbol} moved {real:+.1f}% on {session}"
    if sign != 0 and (real == 0.0 or (real > 0) != (sign > 0)):
        return kind, f"says {match['word']}; {symbol} moved {real:+.1f}% on {session}"
    if stated is not None and abs(stated - real) > 1e-9:
        return kind, f"says {stated:+.1f}%; {symbol} moved {real:+.1f}% on {session}"
    return kind, None


def problems(archive: Path) -> tuple[list[str], dict[str, int]]:
    found, kinds = [], {}
    for st in statements(archive):
        kind, problem = check(st)
        kinds[kind] = kinds.get(kind, 0) + 1
        if problem:
            found.append(f"{st['day']} {st['where']}: {problem}")
    return found, kinds


def test_price_sessions_are_the_xnys_sessions_of_the_archive():
    days = sorted(date.fromisoformat(p.name) for p in ARCHIVE.iterdir() if p.is_dir())
    xnys = {d.date() for d in xcals.get_calendar("XNYS").sessions_in_range(days[0].isoformat(), days[-1].isoformat())}
    assert date(2025, 11, 27) not in xnys and date(2025, 11, 28) in xnys
    for ticker in COMPANIES:
        assert ticker in CLOSES, ticker
        assert {d for d in CLOSES[ticker] if days[0] <= d <= days[-1]} == xnys, ticker
        assert min(CLOSES[ticker]) < days[0]  # the first day's move has a previous close


def test_every_share_move_in_the_archive_is_the_real_one():
    found, kinds = problems(ARCHIVE)
    assert found == [], "\n".join(found[:20])
    assert kinds.get("unknown", 0) == 0
    # the check covers the follow-ups: many on session days, some on weekends and Thanksgiving
    assert kinds["on_day"] > 100 and kinds["last_session"] > 20, kinds


@pytest.mark.parametrize("edit", ["number", "direction", "non_session_day"])
def test_the_check_catches_one_wrong_statement(tmp_path, edit):
    copy = tmp_path / "archive"
    shutil.copytree(ARCHIVE, copy)
    if edit == "non_session_day":  # a Saturday headline claiming a move that day
        path = copy / "2025-11-08" / "market-wire.xml"
        text = path.read_text(encoding="utf-8")
        new = re.sub(
            r"Markets closed Saturday; (\w+) shares last (rose|fell) (\d+\.\d)% in the 2025-11-07 session",
            r"\1 shares rise \3% after the news",
            text,
            count=1,
        )
    else:
        path = copy / "2025-11-05" / "market-wire.xml"
        text = path.read_text(encoding="utf-8")
        m = re.search(r"shares (rise|fall) (\d+\.\d)% after the news", text)
        assert m
        if edit == "number":
            wrong = f"{float(m[2]) + 0.1:.1f}"
            new = text[: m.start(2)] + wrong + text[m.end(2) :]
        else:
            new = text[: m.start(1)] + {"rise": "fall", "fall": "rise"}[m[1]] + text[m.end(1) :]
    assert new != text
    path.write_text(new, encoding="utf-8")
    found, _ = problems(copy)
    assert len(found) >= 1 and all(path.parent.name in f for f in found), found
