"""Pairs, the outcome-weighting table (each cell and the swap), holdout split, plan text, exports."""

import json

import numpy as np
import pandas as pd
import pytest

from outcome_flywheel.preferences.weighting import (
    HOLD_TEXT,
    build_pairs,
    dataset_fingerprint,
    export_metadata,
    export_rows,
    holdout_split,
    render_plan,
    render_prompt,
    replication_counts,
)

PROPOSAL = [{"symbol": "NVDA", "side": "buy", "weight": 0.05}]
OPERATOR = [{"symbol": "AAPL", "side": "buy", "weight": 0.02}]


def _decisions(specs):
    rows = []
    for i, (decision, _status, _vs) in enumerate(specs):
        rows.append(
            {
                "decision_id": f"d-{i:03d}",
                "decision_date": "2025-11-26",
                "decision": decision,
                "proposal_orders_json": json.dumps(PROPOSAL),
                "proposal_text": None,
                "operator_orders_json": json.dumps(OPERATOR) if decision == "override" else None,
                "context_json": json.dumps({"regime": "neutral", "cash_pct": 5.0}),
                "symbols": "NVDA",
                "line_number": i + 1,
            }
        )
    return pd.DataFrame(rows)


def _outcomes(specs):
    return pd.DataFrame(
        [{"decision_id": f"d-{i:03d}", "status": s, "vs_spy_pct": v} for i, (_, s, v) in enumerate(specs)]
    )


PLAN = render_plan(PROPOSAL)
OVERRIDE_PLAN = render_plan(OPERATOR)

# decision, status, vs_spy -> weight, replication, treatment, chosen, rejected
CELLS = [
    (("approve", "matured", 1.2), 1.0, 3.0, "agree_boost", PLAN, HOLD_TEXT),
    (("approve", "matured", -0.7), 0.3, 1.0, "approve_market_down", PLAN, HOLD_TEXT),
    (("reject", "matured", -0.7), 1.0, 3.0, "agree_boost", HOLD_TEXT, PLAN),
    (("override", "matured", -0.7), 1.0, 3.0, "agree_boost", OVERRIDE_PLAN, PLAN),
    (("reject", "matured", 2.0), -0.5, 1.5, "swap", PLAN, HOLD_TEXT),
    (("override", "matured", 2.0), -0.5, 1.5, "swap", PLAN, OVERRIDE_PLAN),
    (("approve", "pending", np.nan), 0.5, 1.0, "no_verdict", PLAN, HOLD_TEXT),
    (("reject", "no_data", np.nan), 0.5, 1.0, "no_verdict", HOLD_TEXT, PLAN),
    (("override", "pending", np.nan), 0.5, 1.0, "no_verdict", OVERRIDE_PLAN, PLAN),
]


@pytest.mark.parametrize("spec, weight, replication, treatment, chosen, rejected", CELLS)
def test_each_cell_of_the_weighting_table(spec, weight, replication, treatment, chosen, rejected):
    pairs, skipped = build_pairs(_decisions([spec]), _outcomes([spec]))
    assert skipped.empty and len(pairs) == 1
    p = pairs.iloc[0]
    assert (p.outcome_weight, p.replication, p.treatment) == (weight, replication, treatment)
    assert p.effective_weight == abs(weight)
    assert bool(p.swapped) == (weight < 0)
    assert (p.chosen, p.rejected) == (chosen, rejected)
    assert p.proposal_plan == PLAN


def test_a_flat_return_is_not_a_market_win():
    pairs, _ = build_pairs(_decisions([("reject", "matured", 0.0)]), _outcomes([("reject", "matured", 0.0)]))
    assert pairs.iloc[0].treatment == "agree_boost"


def test_missing_outcome_means_no_verdict():
    pairs, _ = build_pairs(_decisions([("approve", "x", 0)]), None)
    assert pairs.iloc[0].verdict == "none" and pairs.iloc[0].outcome_weight == 0.5


def test_plan_text_is_the_same_whatever_the_order_order():
    a = [{"symbol": "XOM", "side": "buy", "weight": 0.03}, {"symbol": "AAPL", "side": "sell", "weight": 0.1}]
    assert render_plan(a) == render_plan(list(reversed(a)))
    assert (
        render_plan(a)
        == "Plan: 2 orders.\nSell AAPL (Information Technology), 10.0% of the portfolio.\nBuy XOM (Energy), 3.0% of the portfolio."
    )
    assert render_plan([]) == HOLD_TEXT


def test_holdout_is_a_stable_fifth_by_hash():
    ids = [f"d-{i:05d}" for i in range(5000)]
    splits = [holdout_split(d) for d in ids]
    assert splits == [holdout_split(d) for d in ids]
    assert 0.18 < splits.count("holdout") / len(ids) < 0.22
    # Known values, so a change of hash function shows up here.
    assert [holdout_split(f"d-{i:04d}") for i in range(1, 11)] == ["train"] * 4 + ["holdout"] * 2 + ["train"] * 3 + [
        "holdout"
    ]


def test_rebuilding_gives_the_same_pairs():
    specs = [c[0] for c in CELLS] * 3
    d, o = _decisions(specs), _outcomes(specs)
    a, _ = build_pairs(d, o)
    b, _ = build_pairs(d.sample(frac=1.0, random_state=1), o.sample(frac=1.0, random_state=2))
    pd.testing.assert_frame_equal(a, b)
    assert dataset_fingerprint(a) == dataset_fingerprint(b)


def test_replication_counts():
    assert replication_counts([3, 1, 1.5, 1.5, 1.5, 1.5, 1.5, 3]) == [3, 1, 1, 2, 1, 2, 1, 3]
    assert sum(replication_counts([1.5] * 7)) == 10  # floor(1.5 * 7)


def _with_split(pairs, split):
    pairs = pairs.copy()
    pairs["split"] = split
    return pairs


def test_export_replication_counts_and_formats():
    # 2 agree_boost, 1 approve_market_down, 3 swaps, 1 no_verdict, all in training.
    specs = [CELLS[0][0], CELLS[2][0], CELLS[1][0], CELLS[4][0], CELLS[5][0], CELLS[4][0], CELLS[6][0]]
    pairs, _ = build_pairs(_decisions(specs), _outcomes(specs))
    pairs = _with_split(pairs, "train")
    expected = 2 * 3 + 1 * 1 + 4 + 1  # three x1.5 rows give 1 + 2 + 1
    for fmt in ("trl", "nemo_rl", "openai"):
        rows = export_rows(pairs, fmt)
        assert len(rows) == expected
        meta = export_metadata(pairs, fmt, len(rows), "sha")
        assert meta["rows"] == expected and meta["pairs"] == 7
    trl = export_rows(pairs, "trl")[0]
    assert set(trl) == {"prompt", "chosen", "rejected"} and trl["chosen"][0]["role"] == "assistant"
    nemo = export_rows(pairs, "nemo_rl")[0]
    assert [c["rank"] for c in nemo["completions"]] == [0, 1] and nemo["context"] == trl["prompt"]
    oai = export_rows(pairs, "openai")[0]
    assert oai["input"]["messages"] == trl["prompt"]
    assert oai["preferred_output"] == trl["chosen"] and oai["non_preferred_output"] == trl["rejected"]


def test_holdout_pairs_are_never_exported():
    specs = [CELLS[0][0]] * 4
    pairs, _ = build_pairs(_decisions(specs), _outcomes(specs))
    pairs["split"] = ["train", "holdout", "holdout", "train"]
    assert len(export_rows(pairs, "trl")) == 2 * 3


def test_the_prompt_holds_only_the_chosen_context_keys():
    context = {"regime": "neutral", "cash_pct": 5.0, "account": "core"}
    plain = render_prompt(context, "Cash deployment.")
    assert (
        plain
        == render_prompt({}, None)
        == [{"role": "user", "content": "Rebalance review.\nWrite the plan to execute."}]
    )
    keyed = render_prompt(context, "Cash deployment.", ("regime", "note"))[0]["content"]
    assert keyed == "Rebalance review. regime: neutral\nNote: Cash deployment.\nWrite the plan to execute."
    everything = render_prompt(context, "Cash deployment.", ("*",))[0]["content"]
    assert everything.startswith(
        "Rebalance review. account: core; cash_pct: 5.0; regime: neutral\nNote: Cash deployment."
    )
    specs = [("approve", "matured", 1.0), ("reject", "matured", -1.0)]
    default_pairs, _ = build_pairs(_decisions(specs), _outcomes(specs))
    assert default_pairs["prompt"].nunique() == 1
    keyed_pairs, _ = build_pairs(_decisions(specs), _outcomes(specs), context_keys=("cash_pct",))
    assert "cash_pct: 5.0" in json.loads(keyed_pairs["prompt"][0])[0]["content"]
