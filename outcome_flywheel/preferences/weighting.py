"""Preference pairs from operator decisions, weighted by what the market did next.

Pairs (the prompt is the decision's context; completions are plans rendered by `render_plan`):
    approve  -> proposal  > hold (no trade)
    reject   -> hold      > proposal
    override -> operator's orders > proposal

The outcome-weighting table (docs/flywheel.md, "How the loop works"; verdict = sign of the proposal's T+5 return vs SPY):

    decision           verdict   outcome_weight  treatment            export replication
    approve            +          1.0            agree_boost          x3
    approve            -          0.3            approve_market_down  x1
    reject / override  -          1.0            agree_boost          x3
    reject / override  +         -0.5            swap (chosen<->rejected)  x1.5
    any                none       0.5            no_verdict           x1

Our own trainer uses the exact weights (`effective_weight` = |outcome_weight|, after the swap);
outside trainers (TRL, NeMo-RL, Together/OpenAI) get replicated rows. Holdout: 20% of decisions
chosen by a stable hash of the decision id, never trained on, never exported.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import defaultdict
from typing import Any, Mapping, Sequence

import pandas as pd

from outcome_flywheel.exports import EXPORT_FORMATS
from outcome_flywheel.preferences.audit_log import load_orders

HOLD_TEXT = "Plan: hold. No trades."
HOLDOUT_FRACTION = 0.2

# GICS sectors of the bundled symbols, so a rendered plan names what it trades.
SECTOR_BY_SYMBOL: dict[str, str] = {
    **dict.fromkeys(
        ["AAPL", "MSFT", "NVDA", "ORCL", "CRM", "CSCO", "INTC", "IBM", "QCOM", "TXN", "NOW", "AMD", "AVGO"],
        "Information Technology",
    ),
    **dict.fromkeys(["GOOGL", "META", "NFLX", "DIS", "CMCSA", "T", "VZ"], "Communication Services"),
    **dict.fromkeys(["AMZN", "HD", "MCD", "NKE", "TSLA"], "Consumer Discretionary"),
    **dict.fromkeys(["WMT", "PG", "COST", "KO", "PEP"], "Consumer Staples"),
    **dict.fromkeys(["LLY", "UNH", "JNJ", "ABBV", "MRK", "PFE", "TMO", "AMGN"], "Health Care"),
    **dict.fromkeys(["JPM", "BAC", "WFC", "GS", "MS", "C", "AXP", "BLK", "BRK-B"], "Financials"),
    **dict.fromkeys(["XOM", "CVX"], "Energy"),
    **dict.fromkeys(["CAT", "BA", "GE", "LMT", "UPS"], "Industrials"),
    **dict.fromkeys(["SPY", "QQQ"], "Index ETF"),
}

# (decision kind, verdict) -> (outcome_weight, export replication, treatment)
WEIGHT_TABLE: dict[tuple[str, str], tuple[float, float, str]] = {
    ("approve", "positive"): (1.0, 3.0, "agree_boost"),
    ("approve", "negative"): (0.3, 1.0, "approve_market_down"),
    ("reject_or_override", "negative"): (1.0, 3.0, "agree_boost"),
    ("reject_or_override", "positive"): (-0.5, 1.5, "swap"),
    ("approve", "none"): (0.5, 1.0, "no_verdict"),
    ("reject_or_override", "none"): (0.5, 1.0, "no_verdict"),
}


def verdict_of(status: str | None, vs_spy_pct: float | None) -> str:
    """`positive` / `negative` when the outcome matured, else `none` (pending, no_data, missing)."""
    if status != "matured" or vs_spy_pct is None or (isinstance(vs_spy_pct, float) and math.isnan(vs_spy_pct)):
        return "none"
    return "positive" if vs_spy_pct > 0 else "negative"


def outcome_treatment(decision: str, verdict: str) -> tuple[float, float, str]:
    """(outcome_weight, replication, treatment) from the table; a negative weight means swap."""
    kind = "approve" if decision == "approve" else "reject_or_override"
    if decision not in ("approve", "reject", "override"):
        raise ValueError(f"unknown decision {decision!r}")
    return WEIGHT_TABLE[(kind, verdict)]


def holdout_split(decision_id: str, fraction: float = HOLDOUT_FRACTION) -> str:
    """`holdout` for a stable `fraction` of decision ids (sha256, independent of order and run)."""
    bucket = int.from_bytes(hashlib.sha256(decision_id.encode("utf-8")).digest()[:8], "big") / 2**64
    return "holdout" if bucket < fraction else "train"


def _sector(symbol: str) -> str:
    return SECTOR_BY_SYMBOL.get(symbol, "Other")


def render_plan(orders: Sequence[Mapping[str, Any]]) -> str:
    """A plan as text, the same way every time: orders sorted by symbol then side."""
    if not orders:
        return HOLD_TEXT
    lines = [f"Plan: {len(orders)} order{'s' if len(orders) != 1 else ''}."]
    for o in sorted(orders, key=lambda o: (o["symbol"], o["side"], float(o["weight"]))):
        lines.append(
            f"{o['side'].capitalize()} {o['symbol']} ({_sector(o['symbol'])}), {float(o['weight']) * 100:.1f}% of the portfolio."
        )
    return "\n".join(lines)


def render_prompt(
    context: Mapping[str, Any], proposal_text: str | None = None, keys: Sequence[str] = ()
) -> list[dict[str, str]]:
    """The prompt of a decision's pairs: the context `keys` the operator's style may depend on (sorted,
    so the same context is the same prompt); `note` in `keys` adds the proposal's note, `*` takes every
    key and the note (adapters trained before keys were chosen). With no keys,
    every decision shares one context-free prompt (the default: FLYWHEEL_PREFERENCE_CONTEXT, docs/flywheel.md)."""
    # Short on purpose: every token of the prompt is paid for in every training and scoring pass.
    parts = []
    everything = "*" in keys
    for key in sorted(k for k in context if everything or k in keys):
        value = context[key]
        if isinstance(value, (dict, list)):
            value = json.dumps(value, sort_keys=True)
        parts.append(f"{key}: {value}")
    lines = ["Rebalance review. " + "; ".join(parts)] if parts else ["Rebalance review."]
    if (everything or "note" in keys) and proposal_text and str(proposal_text).strip():
        lines.append(f"Note: {str(proposal_text).strip()}")
    lines.append("Write the plan to execute.")
    return [{"role": "user", "content": "\n".join(lines)}]


# A pair's columns, in order: the `dpo_dataset` table, and what the service's /api/preferences/dataset returns.
PAIR_COLUMNS = [
    "pair_id",
    "decision_id",
    "decision_date",
    "split",
    "decision",
    "outcome_status",
    "vs_spy_pct",
    "verdict",
    "treatment",
    "outcome_weight",
    "effective_weight",
    "replication",
    "swapped",
    "prompt",
    "chosen",
    "rejected",
    "proposal_plan",
    "symbols",
]


def build_pairs(
    decisions: pd.DataFrame,
    outcomes: pd.DataFrame | None,
    holdout_fraction: float = HOLDOUT_FRACTION,
    context_keys: Sequence[str] = (),
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(pairs, skipped): one pair per decision, sorted by decision id; `skipped` says why a decision has none.
    The prompt holds the decision context's `context_keys` (`render_prompt`).

    `prompt` is the chat messages as canonical JSON; `proposal_plan` is the rendered proposal (what
    the holdout evaluation scores).
    """
    outcome_by_id: dict[str, tuple[str, float]] = {}
    if outcomes is not None and len(outcomes):
        for r in outcomes.itertuples(index=False):
            outcome_by_id[r.decision_id] = (r.status, r.vs_spy_pct)
    rows, skipped = [], []
    for d in decisions.sort_values("decision_id").itertuples(index=False):
        proposal = render_plan(load_orders(d.proposal_orders_json))
        if d.decision == "approve":
            chosen, rejected = proposal, HOLD_TEXT
        elif d.decision == "reject":
            chosen, rejected = HOLD_TEXT, proposal
        else:
            chosen, rejected = render_plan(load_orders(d.operator_orders_json)), proposal
        if chosen == rejected:
            skipped.append({"decision_id": d.decision_id, "reason": "chosen and rejected render to the same plan"})
            continue
        status, vs_spy = outcome_by_id.get(d.decision_id, ("missing", float("nan")))
        verdict = verdict_of(status, vs_spy)
        weight, replication, treatment = outcome_treatment(d.decision, verdict)
        swapped = weight < 0
        if swapped:  # the market proved the operator wrong: prefer what they turned down
            chosen, rejected = rejected, chosen
        context = json.loads(d.context_json) if isinstance(d.context_json, str) else {}
        prompt = render_prompt(context, d.proposal_text if isinstance(d.proposal_text, str) else None, context_keys)
        rows.append(
            {
                "pair_id": "pair-" + hashlib.sha256(d.decision_id.encode()).hexdigest()[:16],
                "decision_id": d.decision_id,
                "decision_date": d.decision_date,
                "split": holdout_split(d.decision_id, holdout_fraction),
                "decision": d.decision,
                "outcome_status": status,
                "vs_spy_pct": float(vs_spy) if vs_spy is not None else float("nan"),
                "verdict": verdict,
                "treatment": treatment,
                "outcome_weight": weight,
                "effective_weight": abs(weight),
                "replication": replication,
                "swapped": swapped,
                "prompt": json.dumps(prompt, sort_keys=True),
                "chosen": chosen,
                "rejected": rejected,
                "proposal_plan": proposal,
                "symbols": d.symbols,
            }
        )
    pairs = pd.DataFrame(rows, columns=PAIR_COLUMNS)
    return pairs.reset_index(drop=True), pd.DataFrame(skipped, columns=["decision_id", "reason"])


def dataset_fingerprint(pairs: pd.DataFrame) -> str:
    """sha256 over the pairs' content (order-independent: rows are sorted by decision id)."""
    cols = ["decision_id", "split", "effective_weight", "prompt", "chosen", "rejected"]
    payload = pairs.sort_values("decision_id")[cols].to_json(orient="records", double_precision=10)
    return hashlib.sha256(payload.encode()).hexdigest()


# -- exports for outside trainers ----------------------------------------------------------


def replication_counts(replications: Sequence[float]) -> list[int]:
    """Whole copies per row: a factor f gives floor(f*(k+1)) - floor(f*k) to the k-th row with that
    factor, so x3 -> 3 each, x1.5 -> 1, 2, 1, 2, ... (n rows at x1.5 give floor(1.5 n) copies)."""
    seen: dict[float, int] = defaultdict(int)
    counts = []
    for f in replications:
        k = seen[f]
        seen[f] += 1
        counts.append(int(math.floor(f * (k + 1) + 1e-9) - math.floor(f * k + 1e-9)))
    return counts


def export_rows(pairs: pd.DataFrame, fmt: str) -> list[dict[str, Any]]:
    """Training-split pairs replicated by the table (holdout never exported), in decision-id order."""
    train = pairs[pairs["split"] == "train"].sort_values("decision_id")
    make = EXPORT_FORMATS[fmt]
    rows = []
    for copies, r in zip(replication_counts(train["replication"].tolist()), train.itertuples(index=False)):
        row = make(json.loads(r.prompt), r.chosen, r.rejected)
        rows.extend([row] * copies)
    return rows


def export_metadata(pairs: pd.DataFrame, fmt: str, n_rows: int, sha256: str) -> dict[str, Any]:
    train = pairs[pairs["split"] == "train"]
    return {
        "format": fmt,
        "rows": n_rows,
        "pairs": int(len(train)),
        "holdout_pairs_excluded": int((pairs["split"] == "holdout").sum()),
        "replication": {"agree_boost": 3, "approve_market_down": 1, "swap": 1.5, "no_verdict": 1},
        "replication_rule": "x1.5 alternates 1 and 2 copies in decision-id order (floor(1.5 n) rows for n pairs)",
        "pairs_by_treatment": {k: int(v) for k, v in train["treatment"].value_counts().sort_index().items()},
        "note": "exact per-pair weights are in the dpo_dataset table (effective_weight); replication approximates them for trainers without per-pair weights",
        "dataset_fingerprint": dataset_fingerprint(pairs),
        "sha256": sha256,
    }
