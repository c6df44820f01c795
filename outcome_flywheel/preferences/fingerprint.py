"""The operator's style fingerprint, read from every decision: what a person reviewing the flywheel
wants to know before trusting its style score.

- sector tilts: per sector, the approval rate of proposals that buy into it, minus the overall
  approval rate (percentage points; + = the operator favours adding to that sector);
- top rejected names: the symbols most often in proposals the operator did not approve;
- turnover bias: a proposal's turnover is the sum of its order weights; mean turnover of approved
  against not-approved proposals, and how overrides resize the proposal (operator / proposed);
- approval by size: approval rate per turnover bucket.

Rates over fewer than `MIN_COUNT` proposals are reported with their count but no rate (None).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pandas as pd

from outcome_flywheel.preferences.audit_log import load_orders
from outcome_flywheel.preferences.weighting import SECTOR_BY_SYMBOL

MIN_COUNT = 3
# Turnover buckets (sum of order weights): small < 5 %, medium 5-15 %, large >= 15 % of the portfolio.
SIZE_BUCKETS = (("small (<5%)", 0.0, 0.05), ("medium (5-15%)", 0.05, 0.15), ("large (>=15%)", 0.15, float("inf")))


def _rate(approved: int, n: int) -> float | None:
    return round(approved / n, 4) if n >= MIN_COUNT else None


def _turnover(orders: list[dict[str, Any]]) -> float:
    return float(sum(float(o["weight"]) for o in orders))


def style_fingerprint(decisions: pd.DataFrame, top: int = 10) -> dict[str, Any]:
    """The fingerprint of `decisions` (records_frame rows, one per decision id)."""
    n = int(len(decisions))
    if n == 0:
        return {
            "n_decisions": 0,
            "approval_rate": None,
            "decisions": {},
            "sector_tilts": [],
            "top_rejected_names": [],
            "turnover_bias": {},
            "approval_by_size": [],
        }
    approved = decisions["decision"].eq("approve").to_numpy()
    proposals = [load_orders(j) for j in decisions["proposal_orders_json"]]
    overall = float(approved.mean())

    sector_n: Counter = Counter()
    sector_ok: Counter = Counter()
    name_n: Counter = Counter()
    name_rejected: Counter = Counter()
    for orders, ok in zip(proposals, approved):
        for sector in {SECTOR_BY_SYMBOL.get(o["symbol"], "Other") for o in orders if o["side"] == "buy"}:
            sector_n[sector] += 1
            sector_ok[sector] += int(ok)
        for symbol in {o["symbol"] for o in orders}:
            name_n[symbol] += 1
            name_rejected[symbol] += int(not ok)
    tilts = []
    for sector, count in sector_n.items():
        rate = _rate(sector_ok[sector], count)
        tilts.append(
            {
                "sector": sector,
                "proposals_buying": count,
                "approved": sector_ok[sector],
                "approval_rate": rate,
                "tilt_pp": None if rate is None else round((rate - overall) * 100, 2),
            }
        )
    tilts.sort(key=lambda t: (t["tilt_pp"] is None, -(t["tilt_pp"] or 0.0), t["sector"]))
    rejected_names = sorted(((s, c) for s, c in name_rejected.items() if c), key=lambda item: (-item[1], item[0]))[:top]

    turnover = pd.Series([_turnover(o) for o in proposals], dtype=float)
    overrides = decisions["decision"].eq("override").to_numpy()
    resize = [
        _turnover(load_orders(op)) / t
        for op, t, is_override in zip(decisions["operator_orders_json"], turnover, overrides)
        if is_override and t > 0
    ]
    mean_ok = float(turnover[approved].mean()) if approved.any() else None
    mean_other = float(turnover[~approved].mean()) if (~approved).any() else None
    if mean_ok is None or mean_other is None:
        leaning = "not enough decisions of both kinds"
    elif mean_ok < 0.9 * mean_other:
        leaning = "approves smaller rebalances"
    elif mean_ok > 1.1 * mean_other:
        leaning = "approves larger rebalances"
    else:
        leaning = "no size preference"
    sizes = []
    for label, low, high in SIZE_BUCKETS:
        inside = ((turnover >= low) & (turnover < high)).to_numpy()
        sizes.append(
            {
                "size": label,
                "proposals": int(inside.sum()),
                "approved": int(approved[inside].sum()),
                "approval_rate": _rate(int(approved[inside].sum()), int(inside.sum())),
            }
        )
    return {
        "n_decisions": n,
        "approval_rate": round(overall, 4),
        "decisions": {k: int(v) for k, v in decisions["decision"].value_counts().sort_index().items()},
        "sector_tilts": tilts,
        "top_rejected_names": [
            {"symbol": s, "in_not_approved": c, "in_proposals": name_n[s], "not_approved_rate": _rate(c, name_n[s])}
            for s, c in rejected_names
        ],
        "turnover_bias": {
            "mean_turnover_approved_pct": None if mean_ok is None else round(mean_ok * 100, 2),
            "mean_turnover_not_approved_pct": None if mean_other is None else round(mean_other * 100, 2),
            "overrides": len(resize),
            "override_resize_median": round(float(pd.Series(resize).median()), 4) if resize else None,
            "leaning": leaning,
        },
        "approval_by_size": sizes,
    }
