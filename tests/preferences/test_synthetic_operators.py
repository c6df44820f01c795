"""The synthetic operators behind benchmarks.flywheel_auc: each decides by its stated rule."""

import json

import pytest

from outcome_flywheel.preferences.synthetic import CONSISTENT, OPERATORS, TARGET, generate, holds_watchlist, small_sizes


def _decisions(operator: str, n: int = 240) -> list[dict]:
    records = []
    for line in generate(n, 7, operator):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # the deliberately malformed line
    return [
        r
        for r in records
        if r.get("decision") in ("approve", "reject", "override") and r["decision_id"].startswith("d-0")
    ]


def test_the_sector_operator_is_the_bundled_sample():
    assert generate(200, 7, "sector") == TARGET.read_text().splitlines()


@pytest.mark.parametrize("operator, rule", [("ticker", holds_watchlist), ("size", small_sizes)])
def test_rule_operators_follow_their_rule_up_to_the_noise(operator, rule):
    decisions = _decisions(operator)
    liked = [rule(d["proposal"]["orders"]) for d in decisions]
    approved = [d["decision"] == "approve" for d in decisions]
    agree = sum(a == b for a, b in zip(liked, approved)) / len(decisions)
    assert 0.8 <= agree < 1.0  # 10% noise flips some, never most
    assert 0.25 < sum(liked) / len(liked) < 0.75  # both classes are common enough to learn
    for d in decisions:
        if d["decision"] == "override":
            assert rule(d["operator_orders"]) and not rule(d["proposal"]["orders"])


def test_random_operator_has_nothing_to_learn():
    decisions = _decisions("random")
    assert {d["decision"] for d in decisions} == {"approve", "reject"}
    assert 0.4 < sum(d["decision"] == "approve" for d in decisions) / len(decisions) < 0.6
    assert "random" in OPERATORS and "random" not in CONSISTENT
