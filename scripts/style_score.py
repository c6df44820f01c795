"""Style-match score of a new rebalance proposal against the operator's learned preference.

    python -m scripts.style_score --orders '[{"symbol": "NVDA", "side": "buy", "weight": 0.02}]' \
        [--context '{"regime": "neutral"}'] [--text "note"] [--adapter PATH]

Prints one JSON object: {available, style_match_score, margin_logp, comment, adapter_path}.
margin_logp = the adapter's DPO implicit reward of the rendered plan minus that of holding;
style_match_score = sigmoid(beta * margin): P(operator prefers the plan to holding), outcome_flywheel/preferences/scoring.py. `available` is false when no preference adapter exists yet.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from outcome_flywheel.preferences.audit_log import Order
from outcome_flywheel.preferences.metrics import style_comment
from outcome_flywheel.preferences.scoring import score_candidates, scoring_settings
from outcome_flywheel.preferences.status import adapter_context_keys, latest_adapter_dir
from outcome_flywheel.preferences.weighting import render_plan, render_prompt
from outcome_flywheel.models import ModelLoader
from outcome_flywheel.storage import Warehouse


def style_score(
    orders: Sequence[Mapping[str, Any]],
    context: Mapping[str, Any] | None = None,
    text: str | None = None,
    adapter_path: str | Path | None = None,
    model_backend: ModelLoader | None = None,
    warehouse: Warehouse | None = None,
) -> dict[str, Any]:
    """Score one proposal (its orders, the decision context) with the latest (or given) adapter."""
    orders = [Order.model_validate(o).model_dump(mode="json") for o in orders]  # same validation as the log
    adapter = Path(adapter_path) if adapter_path else latest_adapter_dir(warehouse or Warehouse.from_env())
    if adapter is None or not adapter.exists():
        return {"available": False, "style_match_score": None, "margin_logp": None,
                "comment": style_comment(float("nan")), "adapter_path": None}
    backend = (model_backend or ModelLoader.from_env()).load(adapter_path=adapter)
    margin, score = score_candidates(backend, [render_prompt(context or {}, text, adapter_context_keys(adapter))], [render_plan(orders)], *scoring_settings(adapter))
    return {
        "available": True,
        "style_match_score": round(float(score[0]), 6),
        "margin_logp": round(float(margin[0]), 6),
        "comment": style_comment(float(score[0])),
        "adapter_path": str(adapter),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--orders", required=True, help="JSON list of {symbol, side, weight}, or @file.json")
    parser.add_argument("--context", default="{}", help="JSON object: the decision context")
    parser.add_argument("--text", default=None, help="the proposal's optional note")
    parser.add_argument("--adapter", default=None, help="adapter folder (default: adapters/preference/latest)")
    args = parser.parse_args(argv)
    raw = Path(args.orders[1:]).read_text() if args.orders.startswith("@") else args.orders
    result = style_score(json.loads(raw), json.loads(args.context), args.text, args.adapter)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
