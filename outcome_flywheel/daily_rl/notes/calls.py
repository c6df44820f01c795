"""Trade calls read from trading notes: which symbol, which side, for how long, how big, where the stop is.

To price a note against what the market did next, the loop needs its call in a fixed shape. Parsing is
plain `re`: the side comes from the Trade Recommendation section (any markdown header form, matched with
the structure score's header helper), else a Side / Direction / Action line, else the note's first
sentence when it has no recommendation section. A note that takes no side, or names no symbol the
market data knows, gets a status and a reason instead of a guess.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Iterable

import pandas as pd

from outcome_flywheel.daily_rl.notes.companies import _candidates
from outcome_flywheel.daily_rl.notes.structure import _header_pattern


@dataclass(frozen=True)
class TradeCall:
    """One note's call; `parse_status` is "ok" only when both a side and a known symbol were read."""

    symbol: str | None
    side: str  # "long" | "short" | "none"
    timeframe: str | None
    timeframe_days: float | None
    position_size_pct: float | None
    stop_loss_pct: float | None
    stop_loss_price: float | None
    parse_status: str  # ok | no_trade | no_side | no_symbol | unknown_symbol | ambiguous | empty
    parse_reason: str | None


CALL_COLUMNS: list[str] = [f.name for f in fields(TradeCall)]


# Header names per field; a line is tried against the longest names first.
_HEADERS = {
    "recommendation": ("Trade Recommendation", "Recommendation", "Trade Idea", "Trade Call", "Trade"),
    "side": ("Trade Direction", "Side", "Direction", "Action", "Position", "Bias", "Stance", "Signal"),
    "ticker": ("Ticker", "Symbol", "Instrument", "Asset", "Security", "Stock", "Company"),
    "timeframe": ("Timeframe", "Time Frame", "Time-frame", "Time Horizon", "Horizon", "Holding Period", "Duration"),
    "size": ("Position Size", "Position Sizing", "Position-Size", "Sizing", "Size", "Allocation"),
    "stop": ("Stop Loss", "Stop-Loss", "Stop Loss Level", "Stop-Loss Level", "Stoploss"),
    "other": (
        "Rationale",
        "Risk Factors",
        "Risks",
        "Risk",
        "Entry",
        "Entry Point",
        "Entry Price",
        "Target",
        "Price Target",
        "Take Profit",
        "Catalyst",
        "Catalysts",
        "Thesis",
        "Summary",
        "Headline",
    ),
}


_HEADER_PATTERNS = sorted(
    ((n, key, _header_pattern(n)) for key, ns in _HEADERS.items() for n in ns), key=lambda t: -len(t[0])
)


# Lines that open some other section: a markdown heading or a bold label such as "**Entry:**".
_OTHER_HEADER = re.compile(r"^\s*#{1,6}\s|^[ \t>\-•\d.)]*\*\*[^*\n]{1,40}?(?::\s*\*\*|\*\*\s*:)")


_LONG = r"buy(?:ing)?|long|overweight|accumulate|accumulating|bullish"


_SHORT = r"sell(?:ing)?|short(?:ing)?|underweight|bearish"


_NONE = (
    r"not?[\s-]+(?:new\s+)?(?:trade|position|action)|hold(?:\s+off)?|sidelines|stand\s+aside|stay\s+(?:out|flat)"
    r"|avoid|pass|wait|neutral|do\s+nothing"
)


# "short-term", "long run", "sell-off", "buy-side", "buy-back", "short of", "as long as", "in short" take no side.
_NOT_SIDE = (
    r"(?![\s-]*(?:term|run\b|lived|dated|haul|horizon|time|while|period|squeeze|interest|sellers?|covering"
    r"|float|history|standing|ago|enough|since|of\b|off\b|side\b|back\b|pressure))"
)


_SIDE_RE = re.compile(
    rf"(?<!\bas )(?<!\bso )(?<!\bhow )(?<!\bfor )(?<!\bin )\b(?:(?P<long>{_LONG})|(?P<short>{_SHORT}))\b{_NOT_SIDE}"
    rf"|\b(?P<none>{_NONE})\b(?!-)",
    re.IGNORECASE,
)


_NEGATION = re.compile(
    r"(?:\bnot|n't|\bnever|\bno|\bavoid|\bagainst|\brather\s+than|\binstead\s+of|\bwithout)"
    r"\s+(?:[\w'-]+\s+){0,2}$",
    re.IGNORECASE,
)


_PUTS = re.compile(r"\s*(?:[\w$.-]+\s+){0,3}?puts?\b", re.IGNORECASE)  # "buy XOM puts" is a bet on a fall


_CLAUSE_BREAK = re.compile(r"[.;:,!?\n()\[\]|—–]")


_NUM = r"\d+(?:\.\d+)?"


_PCT_UNIT = r"(?:%|\s*percent\b|\s*pct\b)"


_PCT_RE = re.compile(rf"({_NUM}){_PCT_UNIT}?\s*(?:-|–|—|to)\s*({_NUM}){_PCT_UNIT}|({_NUM}){_PCT_UNIT}", re.IGNORECASE)


# A price: "$185", "$1,250.50", or a bare "185" / "185.50" that is not a count of days, ATRs, moving-average days...
_PRICE_RE = re.compile(
    r"\$\s*(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)|(?<![\w.$,-])(\d+\.\d+|\d{2,})(?![\w%]|[.,]\d|\s*(?:[-–×]"
    r"|x\b|atr|sd\b|std|sigma|day|week|month|session|hour|times|tick|point|pts|bps|basis|dma|sma|ema|ma\b|%|percent))",
    re.IGNORECASE,
)


_STOP_INLINE = re.compile(r"\bstop(?:[\s-]*loss(?:es)?)?\b(?P<rest>[^\n]*)", re.IGNORECASE)


_AMOUNTS = {
    "a": 1,
    "an": 1,
    "next": 1,
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "twelve": 12,
    "couple": 2,
    "few": 3,
    "several": 4,
}


_UNIT_DAYS = {
    "hour": 1 / 24,
    "session": 1.0,
    "day": 1.0,
    "week": 7.0,
    "wk": 7.0,
    "month": 30.0,
    "mo": 30.0,
    "quarter": 91.0,
    "year": 365.0,
    "yr": 365.0,
}


_AMOUNT = r"\d+(?:\.\d+)?|" + "|".join(sorted(_AMOUNTS, key=len, reverse=True))


_SPAN_RE = re.compile(
    rf"\b(?P<a>{_AMOUNT})(?:\s+of)?(?:\s*(?:-|–|—|to)\s*(?P<b>{_AMOUNT}))?[\s-]*\+?\s*(?:trading[\s-]+)?"
    rf"(?P<unit>hour|session|day|week|wk|month|mo|quarter|year|yr)s?\b",
    re.IGNORECASE,
)


_SPAN_JOIN = re.compile(r"\s*(?:-|–|—|to)\s*$")


def _header(line: str) -> tuple[str, str] | None:
    for _, key, pattern in _HEADER_PATTERNS:
        m = pattern.match(line)
        if m:
            return key, (m.group("rest") or "").strip(" \t*_")
    return None


def _sections(lines: list[str]) -> dict[str, str]:
    """Each kind of section's text (the first one of a kind): the header line's rest and the lines below
    it, up to the next header, or a blank line once there is text."""
    return {key: text for key, (text, _) in _section_lines(lines).items()}


def _section_lines(lines: list[str]) -> dict[str, tuple[str, list[int]]]:
    """`_sections` with, per kind, the indices of the lines its text came from (the call's span)."""
    found: dict[str, tuple[str, list[int]]] = {}
    i = 0
    while i < len(lines):
        hit = _header(lines[i])
        i += 1
        if hit is None:
            continue
        key, rest = hit
        body, where = ([rest], [i - 1]) if rest else ([], [])
        while i < len(lines) and _header(lines[i]) is None and not _OTHER_HEADER.match(lines[i]):
            if lines[i].strip():
                body.append(lines[i].strip())
                where.append(i)
            elif body:
                break
            i += 1
        if body and key not in found:
            found[key] = ("\n".join(body), where)
    return found


def _side_hits(text: str) -> list[tuple[str, int, str]]:
    """(kind, clause start, phrase) for each side phrase; kind "neg" for a negated "buy" / "short"."""
    hits = []
    for m in _SIDE_RE.finditer(text):
        kind = m.lastgroup
        clause = max((b.end() for b in _CLAUSE_BREAK.finditer(text, 0, m.start())), default=0)
        if kind != "none" and _NEGATION.search(text[clause : m.start()]):
            kind = "neg"
        elif kind != "none" and _PUTS.match(text, m.end()):
            kind = "short" if kind == "long" else "long"
        hits.append((kind, clause, m.group(0)))
    return hits


def _side_in(text: str) -> tuple[str, str | None] | None:
    """The side one piece of text takes, with a reason when it is not long or short; None if it takes none.
    The first phrase decides; the other side in the same clause ("buy or sell") makes it ambiguous."""
    hits = _side_hits(text)
    for kind, clause, phrase in hits:
        if kind == "none":
            return "none", f"recommends no trade ({phrase!r})"
        if kind in ("long", "short"):
            rival = {"long": "short", "short": "long"}[kind]
            clash = [p for k, c, p in hits if k == rival and c == clause]
            if clash:
                return "ambiguous", f"both {phrase!r} and {clash[0]!r} with no clear first call"
            return kind, None
    negated = [p for k, _, p in hits if k == "neg"]
    return ("none", f"advises against it (negated {negated[0]!r})") if negated else None


def _symbol(regions: list[str], universe: set[str] | None) -> tuple[str, bool] | None:
    """(ticker, known) from the first region that names one, by preference: a known symbol, else a strong
    unknown one. A region with only weak unknowns passes to the next; the first of them is the last resort."""
    fallback = None
    for region in regions:
        cands = _candidates(region, universe)
        for want in (lambda c: c[2], lambda c: c[3]):
            hit = next((c for c in cands if want(c)), None)
            if hit:
                return hit[1], hit[2]
        fallback = fallback or (cands[0][1] if cands else None)
    return (fallback, False) if fallback else None


def _clean(body: str | None) -> str | None:
    """The first non-empty line of a section, without list marks, emphasis or a closing period."""
    line = next((ln for ln in (body or "").splitlines() if ln.strip()), "")
    line = re.sub(r"^[\s>*_#\-•]+", "", line).strip().rstrip(" *_.").strip()
    return line[:200] or None


def _percent(text: str) -> float | None:
    m = _PCT_RE.search(text or "")
    return None if not m else float(m.group(3)) if m.group(3) else (float(m.group(1)) + float(m.group(2))) / 2


def _amount(word: str) -> float:
    return float(_AMOUNTS.get(word.lower(), 0) or word)


def _days(text: str | None) -> float | None:
    """Midpoint of a span such as "1-2 weeks" in calendar days (a session counts one day)."""
    if not text:
        return None
    spans = list(_SPAN_RE.finditer(text))
    if spans:
        first = spans[0]
        unit = _UNIT_DAYS[first.group("unit").lower()]
        low, high = _amount(first.group("a")) * unit, _amount(first.group("b") or first.group("a")) * unit
        if len(spans) > 1 and _SPAN_JOIN.match(text[first.end() : spans[1].start()]):  # "1 week to 1 month"
            nxt = spans[1]
            high = _amount(nxt.group("b") or nxt.group("a")) * _UNIT_DAYS[nxt.group("unit").lower()]
        return (low + high) / 2
    if re.search(r"\bintra-?day\b|\bsame[\s-]day\b|\bday[\s-]trade", text, re.IGNORECASE):
        return 0.5
    return 1.0 if re.search(r"\bovernight\b", text, re.IGNORECASE) else None


def _stop(text: str | None) -> tuple[float | None, float | None]:
    """(percent from entry, price) read from stop-loss text."""
    m = _PRICE_RE.search(_PCT_RE.sub(" ", text or ""))
    return _percent(text), float((m.group(1) or m.group(2)).replace(",", "")) if m else None


def _readable(note: str) -> str:
    """The note as the parser reads it, character for character: a think block blanked (its newlines
    kept), curly quotes and non-breaking spaces made plain, so offsets into it are offsets into `note`."""
    blank = re.sub(r"<think>.*?(?:</think>|\Z)", lambda m: re.sub(r"[^\n]", " ", m.group(0)), note, flags=re.DOTALL)
    return blank.replace("’", "'").replace("\u00a0", " ")


def _side_sources(lines: list[str], sections: dict[str, str]) -> list[str | None]:
    """Where the side is read from, in order: the Trade Recommendation section, a Side line, and when
    there is no recommendation section the first sentence of the prose (markdown titles left out)."""
    sources = [sections.get("recommendation"), sections.get("side")]
    if "recommendation" not in sections:
        prose = " ".join(ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#"))
        sources.append(re.split(r"(?<=[.!?])\s", prose, maxsplit=1)[0])
    return sources


def call_spans(note: str) -> list[tuple[int, int]]:
    """The character spans of `note` that make its call: the lines of the section the side was read
    from (the Trade Recommendation section, else the Side line, else the first prose line), plus a
    Ticker section's lines when there is one. Empty when the note takes no side anywhere: then there
    is no call line, and the reward signals about the call (`price`, `relevance`) judge the whole note."""
    if not isinstance(note, str) or not note.strip():
        return []
    text = _readable(note)
    lines = text.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    bare = [ln.rstrip("\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029") for ln in lines]
    parts = _section_lines(bare)
    sections = {key: body for key, (body, _) in parts.items()}
    picked: list[int] = []
    for key, source in zip(("recommendation", "side", "prose"), _side_sources(bare, sections)):
        if source and _side_in(source):
            if key == "prose":
                picked = [next(i for i, ln in enumerate(bare) if ln.strip() and not ln.lstrip().startswith("#"))]
            else:
                picked = list(parts[key][1])
            break
    if not picked:
        return []
    picked += [i for i in parts.get("ticker", ("", []))[1] if i not in picked]
    return [
        (starts[i] + len(bare[i]) - len(bare[i].lstrip()), starts[i] + len(bare[i].rstrip())) for i in sorted(picked)
    ]


def call_part_spans(note: str) -> dict[str, list[tuple[int, int]]]:
    """The call's line split by what decides what: `side` = the first long / short phrase the parser can
    read in the call's lines (the word that makes the call long or short), `ticker` = the named symbol
    in those lines (else what follows the side phrase on its line, and the call's other lines). Empty when the note has no
    call line (`call_spans`). Credit uses them so that the price trains the side and relevance the name."""
    spans = call_spans(note)
    if not spans:
        return {}
    text = _readable(note)
    side: list[tuple[int, int]] = []
    for a, b in spans:
        hit = next((m for m in _SIDE_RE.finditer(text, a, b) if m.lastgroup in ("long", "short")), None)
        if hit is not None:
            side = [hit.span()]
            break
    symbol = parse_call(note).symbol
    ticker = (
        [
            m.span()
            for a, b in spans
            for m in re.finditer(rf"(?<!\w){re.escape(symbol)}(?!\w)", text[:b])
            if m.start() >= a
        ]
        if symbol
        else []
    )
    if not ticker:  # no symbol written out (a company's name): what follows the side phrase, and the other lines
        ticker = [(max(a, side[0][1]) if side and a <= side[0][0] < b else a, b) for a, b in spans]
        ticker = [(a, b) for a, b in ticker if text[a:b].strip()]
    return {"side": side, "ticker": ticker}


def parse_call(note: str, universe: Iterable[str] | None = None) -> TradeCall:
    """Read one note's trade call. With a `universe`, a symbol outside it gives "unknown_symbol"; without
    one any well-formed ticker counts (live data checks it later)."""
    known = {s.upper() for s in universe} if universe is not None else None
    if not isinstance(note, str) or not note.strip():
        return TradeCall(None, "none", None, None, None, None, None, "empty", "the note is empty")
    text = _readable(note)
    lines = text.splitlines()
    sections = _sections(lines)
    side = next((found for s in _side_sources(lines, sections) if s and (found := _side_in(s))), None)
    symbol = _symbol([r for r in (sections.get("recommendation"), sections.get("ticker"), text) if r], known)

    problems = []
    if side is None:
        problems.append(("no_side", "no buy / sell or long / short call found"))
    elif side[0] in ("none", "ambiguous"):
        problems.append(("no_trade" if side[0] == "none" else "ambiguous", side[1]))
    if symbol is None:
        problems.append(("no_symbol", "names no ticker or known company"))
    elif not symbol[1]:
        problems.append(("unknown_symbol", f"names {symbol[0]}, not in the market-data universe"))

    timeframe = _clean(sections.get("timeframe"))
    stop_text = sections.get("stop")
    if stop_text is None and (m := _STOP_INLINE.search(text)):
        stop_text = re.split(r";|\.(?=\s|$)", m.group("rest"), maxsplit=1)[0]  # "set a stop at $185."
    stop_pct, stop_price = _stop(stop_text)
    return TradeCall(
        symbol=symbol[0] if symbol else None,
        side=side[0] if side and side[0] in ("long", "short") else "none",
        timeframe=timeframe,
        timeframe_days=_days(timeframe),
        position_size_pct=_percent(sections.get("size", "")),
        stop_loss_pct=stop_pct,
        stop_loss_price=stop_price,
        parse_status=problems[0][0] if problems else "ok",
        parse_reason="; ".join(r for _, r in problems) or None,
    )


def calls_frame(
    notes: pd.DataFrame, universe: Iterable[str] | None = None, text_column: str = "response"
) -> pd.DataFrame:
    """`notes` with the CALL_COLUMNS of each row's call added; index and rows kept, input columns untouched."""
    clash = [c for c in CALL_COLUMNS if c in notes.columns]
    if clash:
        raise ValueError(f"notes already have call columns {clash}")
    known = {s.upper() for s in universe} if universe is not None else None
    calls = [parse_call(t, known) for t in notes[text_column]]
    out = notes.copy()
    for name in CALL_COLUMNS:
        values = [getattr(c, name) for c in calls]
        numeric = name in ("timeframe_days", "position_size_pct", "stop_loss_pct", "stop_loss_price")
        out[name] = pd.Series(values, index=notes.index, dtype=float if numeric else object)
    return out
