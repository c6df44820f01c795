"""Write `sample_data/tiny_local/notes.jsonl`: example trading notes the tiny-local model is trained on.

Fictional events about real tickers, worded as the bundled feed archive words them: fresh events
(the POSITIVE / NEGATIVE templates below, which `scripts/make_feeds_archive.py` also writes) and
follow-ups that state a share move. Each note is a base model's note, not a good trader's:

- it names the headline's company, the way the headline first names it (name or ticker, sometimes
  both), as an instruct model does: a call on the headline's company in most notes;
- its side is not tied to the news: within good news and within bad news (`news_direction`,
  `outcome_flywheel/daily_rl/worlds/news.py`: the event's template; a follow-up carries its event's news)
  half the calls are long and half short, so the base policy has no edge, and there is something
  for the prices to teach;
- most carry the six sections of the structure score (`outcome_flywheel/daily_rl/notes/structure.py`),
  some miss a few, some are unstructured prose, some take no trade, so the base policy writes
  note-like text that only sometimes has every header (room for the daily loop to improve it).

    python -m scripts.make_tiny_local_corpus
"""

from __future__ import annotations

import json
import random
from datetime import date, timedelta
from pathlib import Path

from outcome_flywheel.daily_rl.worlds.news import news_direction
from outcome_flywheel.models.prompts import NOTE_SECTIONS

OUT = Path(__file__).resolve().parent.parent / "sample_data" / "tiny_local" / "notes.jsonl"

COMPANIES = {
    "AAPL": "Apple",
    "MSFT": "Microsoft",
    "NVDA": "Nvidia",
    "AMZN": "Amazon",
    "GOOGL": "Alphabet",
    "META": "Meta",
    "JPM": "JPMorgan",
    "XOM": "Exxon Mobil",
    "LLY": "Eli Lilly",
    "UNH": "UnitedHealth",
    "WMT": "Walmart",
    "JNJ": "Johnson & Johnson",
    "PG": "Procter & Gamble",
    "HD": "Home Depot",
    "COST": "Costco",
    "MRK": "Merck",
    "CVX": "Chevron",
    "BAC": "Bank of America",
    "KO": "Coca-Cola",
    "NFLX": "Netflix",
    "CRM": "Salesforce",
    "ORCL": "Oracle",
    "INTC": "Intel",
    "QCOM": "Qualcomm",
    "GS": "Goldman Sachs",
    "PFE": "Pfizer",
    "DIS": "Disney",
    "BA": "Boeing",
    "CAT": "Caterpillar",
    "NKE": "Nike",
    "MCD": "McDonald's",
    "GE": "GE Aerospace",
    "LMT": "Lockheed Martin",
    "UPS": "UPS",
}

# Fresh events; the feed archive is written from these too (keep them as they are, or rebuild it).
POSITIVE = [
    ("{co} beats quarterly estimates on strong {seg} demand", "Revenue rose {pct}% as {seg} sales beat forecasts."),
    ("{co} announces ${n} billion share buyback", "The board approved a larger repurchase program."),
    ("{co} raises full-year guidance", "Management lifted its outlook citing {seg} momentum."),
    ("Regulators clear {co} deal for {seg} unit", "The approval removes a long-running overhang."),
    ("{co} wins multi-year {seg} contract", "The contract is worth about ${n} billion over five years."),
]
NEGATIVE = [
    ("{co} misses estimates as {seg} sales slow", "Revenue fell {pct}% short of forecasts."),
    ("{co} cuts outlook, shares slide after hours", "The company blamed weaker {seg} orders."),
    ("{co} faces antitrust probe over {seg} practices", "Officials opened a formal investigation."),
    ("{co} recalls products in {seg} line", "The recall covers units sold over two years."),
    ("{co} chief financial officer steps down", "The exit comes ahead of a key {seg} launch."),
]
SEGMENTS = [
    "cloud",
    "data center",
    "consumer",
    "advertising",
    "pharma",
    "energy",
    "retail",
    "services",
    "defense",
    "payments",
]
# Follow-ups, worded as the archive's (its moves are real; these are invented). {move}: "rise 1.3%" ...
FOLLOW_UPS = (
    "{ticker} shares {move} after the news",
    "{co} shares {word} a day after {event}",
    "Analysts {analysts} {co} targets; {ticker} shares {move} after the news",
    "Markets closed {weekday}; {ticker} shares last {moved} in the {session} session",
)
RISKS = [
    "guidance could disappoint",
    "valuation is stretched",
    "rates may stay higher",
    "the sector is crowded",
    "regulators may push back",
    "demand could fade",
    "margins are under pressure",
    "the macro backdrop is weak",
]
# Reasons by (side, news): a long on bad news and a short on good news are argued too.
REASONS = {  # news: +1 good, -1 bad, 0 neither (`news_direction`)
    ("long", 1): ["momentum is improving", "estimates are moving higher", "the catalyst is not priced in"],
    ("long", -1): ["the drop looks overdone", "the bad news is already priced in", "the balance sheet can absorb it"],
    ("long", 0): ["buybacks support the stock", "positioning is light"],
    ("short", 1): ["the good news is already priced in", "the rally looks stretched", "expectations are now too high"],
    ("short", -1): ["estimates are too high", "the news hurts near-term earnings", "sentiment is turning"],
    ("short", 0): ["the multiple can compress", "positioning is crowded"],
}
CALLS = {
    "long": ("Buy {m}.", "Buy {m} shares.", "Buy {m} on this news."),
    "short": ("Sell {m}.", "Sell {m} shares.", "Sell {m} on this news."),
}


def _headline(rng: random.Random, ticker: str, co: str) -> tuple[str, str]:
    """(title, summary): a fresh event (60%) or a follow-up stating an invented move, up or down
    whatever the event was (as the archive's real moves are)."""
    positive = rng.random() < 0.5
    title_t, summary_t = rng.choice(POSITIVE if positive else NEGATIVE)
    fill = dict(co=co, seg=rng.choice(SEGMENTS), pct=rng.randint(2, 19), n=rng.randint(2, 60))
    title, summary = title_t.format(**fill), summary_t.format(**fill)
    if rng.random() < 0.6:
        return title, summary
    event = title.split(", shares ")[0]
    event = event if event.startswith(co) else event[0].lower() + event[1:]
    u, size = rng.random(), f"{rng.randint(1, 60) / 10:.1f}%"
    if u < 0.06:
        words = dict(move="close flat", word="close flat", moved="closed flat", analysts="hold")
    elif u < 0.53:
        words = dict(move=f"rise {size}", word="gain", moved=f"rose {size}", analysts="lift")
    else:
        words = dict(move=f"fall {size}", word="slide", moved=f"fell {size}", analysts="cut")
    session = date(2025, 1, 6) + timedelta(days=rng.randrange(300))
    title = rng.choice(FOLLOW_UPS).format(
        ticker=ticker,
        co=co,
        event=event,
        weekday=rng.choice(["Saturday", "Sunday"]),
        session=session.isoformat(),
        **words,
    )
    return title, f"Follow-up: {event}."


def _mention(rng: random.Random, title: str, ticker: str, co: str) -> str:
    """The company as the headline first names it; now and then with the other form in brackets."""
    by_name = co in title and (ticker not in title.split() or title.index(co) < title.index(ticker))
    first = co if by_name else ticker
    return f"{co} ({ticker})" if rng.random() < 0.25 else first


def _note(rng: random.Random, m: str, side: str, news: int, keep: list[str]) -> str:
    if side == "none":
        call = f"No trade on {m}; wait for the open."
        reason = rng.choice(["the news is already in the price", "the move is hard to read"])
    else:
        call = rng.choice(CALLS[side]).format(m=m)
        reason = rng.choice(REASONS[(side, news)])
    body = {
        "Trade Recommendation": call,
        "Rationale": f"The headline matters for {m} because {reason}; {rng.choice(RISKS)}.",
        "Risk Factors": f"{rng.choice(RISKS).capitalize()}; {rng.choice(RISKS)}.",
        "Timeframe": rng.choice(["1-2 weeks.", "2-4 weeks.", "Next few sessions.", "1-3 months."]),
        "Position Size": f"{rng.choice([1, 2, 3, 4, 5])}% of the portfolio.",
        "Stop Loss": f"{rng.choice([3, 4, 5, 6, 8])}% {'above' if side == 'short' else 'below'} entry.",
    }
    return "\n".join(f"{name}: {body[name]}" for name in NOTE_SECTIONS if name in keep)


def _prose(rng: random.Random, m: str, side: str, news: int) -> str:
    if side == "none":
        return f"We are watching {m} after this news. {rng.choice(RISKS).capitalize()}. We would wait for the open before acting."
    view, verb = ("constructive", "buy") if side == "long" else ("cautious", "sell")
    return (
        f"We are {view} on {m} and would {verb} after this news. {rng.choice(REASONS[(side, news)]).capitalize()}, "
        f"but {rng.choice(RISKS)}."
    )


def _balanced_sides(rng: random.Random, n: int) -> list[str]:
    """`n` sides: a few "none" (no trade), the rest exactly half long and half short, shuffled."""
    none = round(n * 0.06)
    sides = ["none"] * none + ["long", "short"] * ((n - none) // 2) + ["long"] * ((n - none) % 2)
    rng.shuffle(sides)
    return sides


def make_notes(n: int = 640, seed: int = 7) -> list[dict]:
    rng = random.Random(seed)
    heads = []
    for _ in range(n):
        ticker, co = rng.choice(sorted(COMPANIES.items()))
        title, summary = _headline(rng, ticker, co)
        heads.append((ticker, co, title, summary, news_direction(title, summary)))
    # The side is drawn apart from the news: a balanced deck of sides within each kind of news.
    sides: dict[int, str] = {}
    for news in (1, -1, 0):
        idx = [i for i, h in enumerate(heads) if h[4] == news]
        sides.update(zip(idx, _balanced_sides(rng, len(idx))))
    rows = []
    for i, (ticker, co, title, summary, news) in enumerate(heads):
        side, m = sides[i], _mention(rng, title, ticker, co)
        u = rng.random()
        if u < 0.45:  # full six-section note
            note = _note(rng, m, side, news, list(NOTE_SECTIONS))
        elif u < 0.85:  # some sections missing; the recommendation mostly kept
            keep = [s for s in NOTE_SECTIONS if rng.random() < (0.9 if s == NOTE_SECTIONS[0] else 0.5)] or [
                NOTE_SECTIONS[0]
            ]
            note = _note(rng, m, side, news, keep)
        else:  # unstructured prose
            note = _prose(rng, m, side, news)
        rows.append({"ticker": ticker, "title": title, "summary": summary, "news": news, "side": side, "note": note})
    return rows


def main() -> None:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    tmp = OUT.with_suffix(".jsonl.tmp")
    with tmp.open("w") as fh:
        for row in make_notes():
            fh.write(json.dumps(row) + "\n")
    tmp.replace(OUT)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
