"""Write `sample_data/tiny_local/notes.jsonl`: example trading notes the tiny-local model is
trained on. Fictional events about real tickers; most notes carry the six sections of
the structure score (`outcome_flywheel/daily_rl/structure.py`), some miss a few, some are unstructured prose, so the base policy writes note-like
text that only sometimes has the headers (room for the daily loop to improve it).

    python -m scripts.make_tiny_local_corpus
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from outcome_flywheel.models.prompts import NOTE_SECTIONS

OUT = Path(__file__).resolve().parent.parent / "sample_data" / "tiny_local" / "notes.jsonl"

COMPANIES = {
    "AAPL": "Apple", "MSFT": "Microsoft", "NVDA": "Nvidia", "AMZN": "Amazon", "GOOGL": "Alphabet",
    "META": "Meta", "JPM": "JPMorgan", "XOM": "Exxon Mobil", "LLY": "Eli Lilly", "UNH": "UnitedHealth",
    "WMT": "Walmart", "JNJ": "Johnson & Johnson", "PG": "Procter & Gamble", "HD": "Home Depot",
    "COST": "Costco", "MRK": "Merck", "CVX": "Chevron", "BAC": "Bank of America", "KO": "Coca-Cola",
    "NFLX": "Netflix", "CRM": "Salesforce", "ORCL": "Oracle", "INTC": "Intel", "QCOM": "Qualcomm",
    "GS": "Goldman Sachs", "PFE": "Pfizer", "DIS": "Disney", "BA": "Boeing", "CAT": "Caterpillar",
    "NKE": "Nike", "MCD": "McDonald's", "GE": "GE Aerospace", "LMT": "Lockheed Martin", "UPS": "UPS",
}

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
SEGMENTS = ["cloud", "data center", "consumer", "advertising", "pharma", "energy", "retail", "services", "defense", "payments"]
RISKS = [
    "guidance could disappoint", "valuation is stretched", "rates may stay higher", "the sector is crowded",
    "regulators may push back", "demand could fade", "margins are under pressure", "the macro backdrop is weak",
]
REASONS_UP = ["momentum is improving", "estimates are moving higher", "the catalyst is not priced in", "buybacks support the stock"]
REASONS_DOWN = ["estimates are too high", "the news hurts near-term earnings", "sentiment is turning", "the multiple can compress"]


def _note(rng: random.Random, ticker: str, positive: bool, keep: list[str]) -> str:
    side = "Buy" if positive else "Sell"
    reason = rng.choice(REASONS_UP if positive else REASONS_DOWN)
    body = {
        "Trade Recommendation": f"{side} {ticker}.",
        "Rationale": f"The headline matters because {reason}; {rng.choice(REASONS_UP + REASONS_DOWN)}.",
        "Risk Factors": f"{rng.choice(RISKS).capitalize()}; {rng.choice(RISKS)}.",
        "Timeframe": rng.choice(["1-2 weeks.", "2-4 weeks.", "Next few sessions.", "1-3 months."]),
        "Position Size": f"{rng.choice([1, 2, 3, 4, 5])}% of the portfolio.",
        "Stop Loss": f"{rng.choice([3, 4, 5, 6, 8])}% {'below' if positive else 'above'} entry.",
    }
    return "\n".join(f"{name}: {body[name]}" for name in NOTE_SECTIONS if name in keep)


def _prose(rng: random.Random, ticker: str, positive: bool) -> str:
    view = "constructive" if positive else "cautious"
    return (
        f"We are {view} on {ticker} after this news. {rng.choice(REASONS_UP if positive else REASONS_DOWN).capitalize()}, "
        f"but {rng.choice(RISKS)}. We would wait for the open before acting."
    )


def make_notes(n: int = 480, seed: int = 7) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        ticker, co = rng.choice(sorted(COMPANIES.items()))
        positive = rng.random() < 0.5
        title_t, summary_t = rng.choice(POSITIVE if positive else NEGATIVE)
        fill = dict(co=co, seg=rng.choice(SEGMENTS), pct=rng.randint(2, 19), n=rng.randint(2, 60))
        title, summary = title_t.format(**fill), summary_t.format(**fill)
        u = rng.random()
        if u < 0.40:  # full six-section note
            note = _note(rng, ticker, positive, list(NOTE_SECTIONS))
        elif u < 0.80:  # some sections missing
            keep = [s for s in NOTE_SECTIONS if rng.random() < 0.55] or [NOTE_SECTIONS[0]]
            note = _note(rng, ticker, positive, keep)
        else:  # unstructured prose
            note = _prose(rng, ticker, positive)
        rows.append({"ticker": ticker, "title": title, "summary": summary, "note": note})
    return rows


def main() -> None:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with OUT.open("w") as fh:
        for row in make_notes():
            fh.write(json.dumps(row) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
