"""Synthetic operators and the bundled sample audit log `sample_data/audit_log.jsonl`.

Every operator sees rebalance proposals and approves, rejects or overrides them by one rule, so
the flywheel can be measured on operators whose taste lives in different parts of a plan
(`weighting.render_plan` names each order's side, symbol, sector and weight):

  sector  (the bundled sample) likes Information Technology, Health Care and Consumer Staples plans
          and turns down the other sectors (mostly rejects; sometimes an override that buys liked
          names at 2-3% instead); proposals are single-sector; 10% noise.
  ticker  approves a basket that holds a name of its watchlist (two per sector, so the sector says
          nothing); otherwise rejects, or overrides with watchlist names at the same sides and sizes;
          10% noise.
  size    approves when no order is above 5% of the portfolio; otherwise rejects, or overrides with
          the same orders cut to 2-3%; 10% noise.
  mix     approves a plan mostly in the liked sectors or with no order above 5%; otherwise rejects or
          overrides as `size`; 15% noise: a consistent rule over two features, noisier.
  random  approves or rejects at random (nothing to learn: the honesty check).
Apart from `sector`, proposals hold 1-3 names drawn from every sector.

Decision times are real New York times inside the bundled prices (2025-06-02 .. 2026-01-08), most
during the session, some after the close or on a weekend; the last ones exit after 2026-01-08, so
their outcomes stay `pending`. A few lines show the log's edge cases: two malformed lines
(quarantined), one correction that repeats a decision id (the last line wins), one symbol with no
prices (outcome `no_data`), and extra keys (kept). The bundled file is the `sector` operator at the
defaults; its random stream is kept as it was, so the file does not change when operators are added.

    flywheel make-audit-log [--n 200] [--seed 7] [--operator sector] [--out PATH]

(the command is `outcome_flywheel.cli`; from Python, `write(path, n, seed, operator)`).
"""

from __future__ import annotations

import json
import random
from datetime import datetime, timedelta
from pathlib import Path
from typing import Callable
from zoneinfo import ZoneInfo

from outcome_flywheel.settings import SAMPLE_DATA

NY = ZoneInfo("America/New_York")
TARGET = SAMPLE_DATA / "audit_log.jsonl"

LIKED = {
    "Information Technology": ["AAPL", "MSFT", "NVDA", "ORCL", "CRM", "CSCO", "QCOM", "TXN", "IBM"],
    "Health Care": ["LLY", "UNH", "JNJ", "ABBV", "MRK", "PFE", "TMO", "AMGN"],
    "Consumer Staples": ["WMT", "PG", "COST", "KO", "PEP"],
}
DISLIKED = {
    "Energy": ["XOM", "CVX"],
    "Financials": ["JPM", "BAC", "WFC", "GS", "MS", "C", "AXP", "BLK"],
    "Industrials": ["CAT", "BA", "GE", "LMT", "UPS"],
    "Communication Services": ["GOOGL", "META", "NFLX", "DIS", "CMCSA", "T", "VZ"],
    "Consumer Discretionary": ["AMZN", "HD", "MCD", "NKE"],
}
SECTOR_OF = {s: sector for pool in (LIKED, DISLIKED) for sector, names in pool.items() for s in names}
ALL_NAMES = sorted(SECTOR_OF)
# The ticker operator's names: two per sector (one of Energy's two), so no sector predicts them.
WATCHLIST = [
    "ABBV",
    "AXP",
    "BA",
    "CMCSA",
    "COST",
    "CSCO",
    "CVX",
    "GS",
    "KO",
    "LMT",
    "MCD",
    "NFLX",
    "NKE",
    "ORCL",
    "PFE",
    "TXN",
]
SMALL_WEIGHTS = [0.01, 0.015, 0.02, 0.03, 0.04, 0.05]
LARGE_WEIGHTS = [0.08, 0.10, 0.12]
MAX_LIKED_WEIGHT = 0.05
NOTES = [
    None,
    None,
    "Quarterly drift rebalance.",
    "Momentum screen output.",
    "Earnings-season tilt.",
    "Cash deployment.",
]

# One decision: (decision, operator_orders or None, reason, proposal orders)
Decision = tuple[str, "list[dict] | None", str, list[dict]]


def _session_days(start: str, end: str) -> list[datetime]:
    import exchange_calendars as xc

    cal = xc.get_calendar("XNYS")
    return [s.to_pydatetime() for s in cal.sessions_in_range(start, end)]


def _proposal(rng: random.Random) -> tuple[str, bool, list[dict]]:
    """A single-sector proposal, liked or not with even odds (the sector operator's)."""
    liked = rng.random() < 0.5
    pool = LIKED if liked else DISLIKED
    sector = rng.choice(sorted(pool))
    n = rng.choice([1, 1, 2, 2, 3])
    symbols = rng.sample(pool[sector], min(n, len(pool[sector])))
    orders = [
        {
            "symbol": s,
            "side": "buy" if rng.random() < 0.85 else "sell",
            "weight": rng.choice(SMALL_WEIGHTS + LARGE_WEIGHTS),
        }
        for s in symbols
    ]
    return sector, liked, orders


def _decide(rng: random.Random, liked: bool, orders: list[dict]) -> tuple[str, list[dict] | None, str]:
    if liked:
        decision, reason = "approve", "fits the book"
    elif rng.random() < 0.3:
        sector = rng.choice(sorted(LIKED))
        names = rng.sample(LIKED[sector], min(len(orders), len(LIKED[sector])))
        instead = [{"symbol": s, "side": "buy", "weight": rng.choice([0.02, 0.03])} for s in names]
        return "override", instead, f"prefer {sector} names"
    else:
        decision, reason = "reject", "not a sector we add to"
    if rng.random() < 0.10:  # noise: the operator is not a machine
        decision = "reject" if decision == "approve" else "approve"
        reason = "judgement call"
    return decision, None, reason


def _sector_operator(rng: random.Random) -> Decision:
    _, liked, orders = _proposal(rng)
    return (*_decide(rng, liked, orders), orders)


def _mixed_proposal(rng: random.Random) -> list[dict]:
    """1-3 names from every sector, any size."""
    symbols = rng.sample(ALL_NAMES, rng.choice([1, 1, 2, 2, 3]))
    return [
        {
            "symbol": s,
            "side": "buy" if rng.random() < 0.85 else "sell",
            "weight": rng.choice(SMALL_WEIGHTS + LARGE_WEIGHTS),
        }
        for s in symbols
    ]


def holds_watchlist(orders: list[dict]) -> bool:
    return any(o["symbol"] in WATCHLIST for o in orders)


def small_sizes(orders: list[dict]) -> bool:
    return all(o["weight"] <= MAX_LIKED_WEIGHT for o in orders)


def liked_sectors(orders: list[dict]) -> bool:
    return sum(SECTOR_OF.get(o["symbol"]) in LIKED for o in orders) * 2 > len(orders)


def _with_watchlist(rng: random.Random, orders: list[dict]) -> list[dict]:
    names = rng.sample(WATCHLIST, len(orders))
    return [{**o, "symbol": s} for o, s in zip(orders, names)]


def _cut_sizes(rng: random.Random, orders: list[dict]) -> list[dict]:
    return [{**o, "weight": min(o["weight"], rng.choice([0.02, 0.03]))} for o in orders]


def _rule_operator(
    likes: Callable[[list[dict]], bool], instead: Callable, noise: float, why: str
) -> Callable[[random.Random], Decision]:
    """An operator on mixed proposals: approve what `likes`, else reject (70%) or override with
    `instead(rng, orders)` (30%); approve/reject flipped with probability `noise`."""

    def operator(rng: random.Random) -> Decision:
        orders = _mixed_proposal(rng)
        if likes(orders):
            decision, reason = "approve", "fits the book"
        elif rng.random() < 0.3:
            return "override", instead(rng, orders), why, orders
        else:
            decision, reason = "reject", why
        if rng.random() < noise:
            decision, reason = ("reject" if decision == "approve" else "approve"), "judgement call"
        return decision, None, reason, orders

    return operator


def _mix_rule(orders: list[dict]) -> bool:
    return liked_sectors(orders) or small_sizes(orders)


def _random_operator(rng: random.Random) -> Decision:
    orders = _mixed_proposal(rng)
    return rng.choice(["approve", "reject"]), None, "coin flip", orders


OPERATORS: dict[str, Callable[[random.Random], Decision]] = {
    "sector": _sector_operator,
    "ticker": _rule_operator(holds_watchlist, _with_watchlist, 0.10, "not on the watchlist"),
    "size": _rule_operator(small_sizes, _cut_sizes, 0.10, "positions too large"),
    "mix": _rule_operator(_mix_rule, _cut_sizes, 0.15, "not our kind of plan"),
    "random": _random_operator,
}
# Operators with a rule to learn (random has none).
CONSISTENT = ("sector", "ticker", "size", "mix")


def generate(n: int = 200, seed: int = 7, operator: str = "sector") -> list[str]:
    """The audit log's lines: `n` decisions of `operator` plus the edge-case lines."""
    decide = OPERATORS[operator]
    rng = random.Random(seed)
    days = _session_days("2025-06-02", "2026-01-07")
    # Most decisions spread over the sessions; the last 10 in the final week (still pending).
    picks = sorted(rng.choice(days[:-6]) for _ in range(n - 10)) + sorted(rng.choice(days[-6:]) for _ in range(10))
    lines: list[str] = []
    for i, day in enumerate(picks, start=1):
        minute = rng.randint(9 * 60 + 35, 17 * 60 + 30)  # some after the 16:00 close
        ts = datetime(day.year, day.month, day.day, minute // 60, minute % 60, tzinfo=NY)
        if rng.random() < 0.04:
            ts = ts + timedelta(days=(5 - ts.weekday()) % 7 or 7)  # a Saturday: enters Monday
        decision, operator_orders, reason, orders = decide(rng)
        record = {
            "decision_id": f"d-{i:04d}",
            "ts": ts.isoformat(),
            "decision": decision,
            "proposal": {"orders": orders, **({"text": t} if (t := rng.choice(NOTES)) else {})},
            "reason": reason,
            "context": {
                "account": "core-equity",
                "cash_pct": round(rng.uniform(2, 12), 1),
                "regime": rng.choice(["risk-on", "neutral", "risk-off"]),
            },
        }
        if operator_orders:
            record["operator_orders"] = operator_orders
        if rng.random() < 0.2:
            record["operator"] = rng.choice(["ops-ana", "ops-ben"])  # an extra key: kept, not refused
        lines.append(json.dumps(record))
    # Edge cases the pipeline must handle.
    lines.insert(
        40,
        '{"decision_id": "d-bad-1", "ts": "2025-07-15T10:00:00-04:00", "decision": "approve", "proposal": {"orders": [',
    )
    lines.insert(
        90,
        json.dumps(
            {"decision_id": "d-bad-2", "ts": "2025-09-10T11:00:00", "decision": "maybe", "proposal": {"orders": []}}
        ),
    )
    first = json.loads(lines[10])
    first["reason"] = "corrected: " + str(first.get("reason"))
    lines.append(json.dumps(first))  # a correction of an earlier decision: the last line wins
    lines.append(
        json.dumps(
            {
                "decision_id": f"d-{n + 1:04d}",
                "ts": "2025-09-16T10:30:00-04:00",
                "decision": "reject",
                "proposal": {"orders": [{"symbol": "TSLA", "side": "buy", "weight": 0.02}]},
                "reason": "not in the bundled prices",
                "context": {"account": "core-equity", "cash_pct": 5.0, "regime": "neutral"},
            }
        )
    )
    return lines


def write(path: Path, n: int = 200, seed: int = 7, operator: str = "sector") -> Path:
    lines = generate(n, seed, operator)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path
