"""Write the bundled sample audit log `sample_data/audit_log.jsonl`: a synthetic operator.

The operator has a consistent taste that shows in the plan text (`weighting.render_plan` names
each order's symbol, sector and weight):
  - likes Information Technology, Health Care and Consumer Staples: approves such plans;
  - turns down plans in the other sectors (Energy, Financials, Industrials, Communication Services,
    Consumer Discretionary): mostly a reject, sometimes an override that buys names of a liked
    sector instead (at 2-3% each);
  - with 10% noise (an approve becomes a reject or the reverse).
An earlier version also overrode liked-sector plans with large weights down to 2-3%; tiny-local
learned the sector names but not the size digits, so those overrides scored like approvals and
pulled the holdout AUC down (0.57 at lr 2e-3). The operator's taste is now about sectors only.
Decision times are real New York times inside the bundled prices (2025-06-02 .. 2026-01-08), most
during the session, some after the close or on a weekend; the last ones exit after 2026-01-08, so
their outcomes stay `pending`. A few lines show the log's edge cases: two malformed lines
(quarantined), one correction that repeats a decision id (the last line wins), one symbol with no
prices (outcome `no_data`), and extra keys (kept).

    python -m scripts.make_audit_log [--n 200] [--seed 7] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import random
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

from resources.settings import SAMPLE_DATA

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
SMALL_WEIGHTS = [0.01, 0.015, 0.02, 0.03, 0.04, 0.05]
LARGE_WEIGHTS = [0.08, 0.10, 0.12]
NOTES = [None, None, "Quarterly drift rebalance.", "Momentum screen output.", "Earnings-season tilt.", "Cash deployment."]


def _session_days(start: str, end: str) -> list[datetime]:
    import exchange_calendars as xc

    cal = xc.get_calendar("XNYS")
    return [s.to_pydatetime() for s in cal.sessions_in_range(start, end)]


def _proposal(rng: random.Random) -> tuple[str, bool, list[dict]]:
    liked = rng.random() < 0.5
    pool = LIKED if liked else DISLIKED
    sector = rng.choice(sorted(pool))
    n = rng.choice([1, 1, 2, 2, 3])
    symbols = rng.sample(pool[sector], min(n, len(pool[sector])))
    orders = [
        {"symbol": s, "side": "buy" if rng.random() < 0.85 else "sell", "weight": rng.choice(SMALL_WEIGHTS + LARGE_WEIGHTS)}
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


def generate(n: int = 200, seed: int = 7) -> list[str]:
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
        sector, liked, orders = _proposal(rng)
        decision, operator_orders, reason = _decide(rng, liked, orders)
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
    lines.insert(40, '{"decision_id": "d-bad-1", "ts": "2025-07-15T10:00:00-04:00", "decision": "approve", "proposal": {"orders": [')
    lines.insert(90, json.dumps({"decision_id": "d-bad-2", "ts": "2025-09-10T11:00:00", "decision": "maybe", "proposal": {"orders": []}}))
    first = json.loads(lines[10])
    first["reason"] = "corrected: " + str(first.get("reason"))
    lines.append(json.dumps(first))  # a correction of an earlier decision: the last line wins
    lines.append(json.dumps({
        "decision_id": f"d-{n + 1:04d}", "ts": "2025-09-16T10:30:00-04:00", "decision": "reject",
        "proposal": {"orders": [{"symbol": "TSLA", "side": "buy", "weight": 0.02}]},
        "reason": "not in the bundled prices", "context": {"account": "core-equity", "cash_pct": 5.0, "regime": "neutral"},
    }))
    return lines


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=TARGET)
    args = parser.parse_args(argv)
    lines = generate(args.n, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out} ({len(lines)} lines)")
    return args.out


if __name__ == "__main__":
    main()
