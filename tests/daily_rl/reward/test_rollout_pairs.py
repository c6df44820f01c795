"""Best-vs-worst pairs of the daily loop: order, minimum gap, no-contrast reasons, duplicates, exports."""

import json

import pandas as pd
import pytest

from outcome_flywheel.daily_rl.reward.pairs import build_rollout_pairs, pair_exports

PROMPT = json.dumps([{"role": "user", "content": "Headline: Apple beats estimates"}])


def _day(groups: dict[str, list[tuple[float, float, str]]], usable: dict[str, bool] | None = None):
    """scores and rollouts of one day: per headline, notes as (reward, structure, text)."""
    scores, rollouts = [], []
    for h, notes in groups.items():
        for k, (reward, structure, text) in enumerate(notes):
            ok = (usable or {}).get(h, True)
            scores.append(
                dict(
                    date="2025-11-05",
                    prediction_date="2025-11-04",
                    headline_id=h,
                    rollout_index=k,
                    rank=k + 1,
                    reward=reward,
                    structure_score=structure,
                    usable=ok,
                    unusable_reason="" if ok else "judge never answered",
                    reward_weights=json.dumps({"judge_rank": 0.5, "structure": 0.5}),
                )
            )
            rollouts.append(
                dict(
                    headline_id=h,
                    rollout_index=k,
                    prompt=PROMPT,
                    response=text,
                    seed=7,
                    policy_version="2025-11-04@abc",
                )
            )
    return pd.DataFrame(scores), pd.DataFrame(rollouts)


def test_best_over_worst_with_tie_breaks():
    scores, rollouts = _day(
        {
            # equal top rewards: higher structure wins; equal bottom rewards and structure: the longer note is the worst
            "h1": [(0.9, 0.5, "a"), (0.9, 1.0, "best"), (0.2, 0.5, "short"), (0.2, 0.5, "a much longer worst note")]
        }
    )
    pairs, none = build_rollout_pairs(scores, rollouts)
    assert none.empty and len(pairs) == 1
    pair = pairs.iloc[0]
    assert (pair["chosen"], pair["rejected"]) == ("best", "a much longer worst note")
    assert (pair["chosen_rollout_index"], pair["rejected_rollout_index"]) == (1, 3)
    assert pair["reward_gap"] == pytest.approx(0.7) and pair["policy_version"] == "2025-11-04@abc" and pair["seed"] == 7


def test_groups_without_contrast_are_kept_with_the_reason():
    scores, rollouts = _day(
        {
            "small": [(0.6, 1.0, "x"), (0.4, 1.0, "y")],
            "unusable": [(1.0, 1.0, "x"), (0.0, 0.0, "y")],
            "same": [(1.0, 1.0, "same text"), (0.0, 1.0, "same text ")],
            "ok": [(1.0, 1.0, "good"), (0.5, 0.5, "bad")],
        },
        usable={"unusable": False},
    )
    pairs, none = build_rollout_pairs(scores, rollouts, min_reward_gap=0.3)
    assert list(pairs["headline_id"]) == ["ok"]
    reasons = dict(zip(none["headline_id"], none["reason"]))
    assert reasons["small"].startswith("reward gap 0.200 < 0.3")
    assert reasons["unusable"] == "unusable group: judge never answered"
    assert reasons["same"] == "best and worst notes read the same"
    assert len(pairs) + len(none) == 4  # every group accounted for
    assert len(build_rollout_pairs(scores, rollouts, min_reward_gap=0.1)[0]) == 2  # the gap is a setting


def test_the_minimum_gap_allows_for_float_rounding():
    """0.7 - 0.4 is 0.29999999999999993 in floats: a gap of 0.3, kept at the default 0.3; a gap truly
    smaller, even by 1e-8, is not, and its reason does not read as "0.300 < 0.3"."""
    scores, rollouts = _day(
        {
            "exact": [(0.7, 1.0, "x1"), (0.4, 1.0, "y1")],
            "exact_too": [(0.1 + 0.2 + 0.3, 1.0, "x2"), (0.3, 1.0, "y2")],  # 0.6000000000000001 - 0.3
            "just_under": [(0.6999, 1.0, "x3"), (0.4, 1.0, "y3")],
            "hair_under": [(0.69999999, 1.0, "x4"), (0.4, 1.0, "y4")],
        }
    )
    assert 0.7 - 0.4 < 0.3  # the float fact the rule has to allow for
    pairs, none = build_rollout_pairs(scores, rollouts)
    assert sorted(pairs["headline_id"]) == ["exact", "exact_too"]
    assert pairs.set_index("headline_id").loc["exact", "reward_gap"] == pytest.approx(0.3)
    reasons = dict(zip(none["headline_id"], none["reason"]))
    assert reasons == {"just_under": "reward gap 0.2999 < 0.3", "hair_under": "reward gap 0.29999999 < 0.3"}
    assert len(build_rollout_pairs(scores, rollouts, min_reward_gap=0.1 + 0.2)[0]) == 2  # 0.30000000000000004 too


def test_duplicate_pairs_are_dropped():
    scores, rollouts = _day(
        {"h1": [(1.0, 1.0, "good"), (0.0, 0.0, "bad")], "h2": [(1.0, 1.0, "good"), (0.0, 0.0, "bad")]}
    )
    pairs, none = build_rollout_pairs(scores, rollouts)
    assert len(pairs) == 1 and list(none["reason"]) == ["duplicate of an earlier pair of the day"]


def test_exports_line_up_with_the_sidecar():
    scores, rollouts = _day(
        {"h1": [(1.0, 1.0, "good"), (0.0, 0.0, "bad")], "h2": [(0.9, 1.0, "fine"), (0.1, 0.5, "poor")]}
    )
    pairs, _ = build_rollout_pairs(scores, rollouts)
    files = pair_exports(pairs)
    meta = json.loads(files["pairs.meta.json"])
    trl = [json.loads(line) for line in files["trl.jsonl"].decode().splitlines()]
    nemo = [json.loads(line) for line in files["nemo_rl.jsonl"].decode().splitlines()]
    openai = [json.loads(line) for line in files["openai.jsonl"].decode().splitlines()]
    assert meta["rows"] == len(trl) == len(nemo) == len(openai) == 2
    for row, n, o, side in zip(trl, nemo, openai, meta["pairs"]):
        chosen = pairs.set_index("pair_id").loc[side["pair_id"], "chosen"]
        assert row["chosen"] == [{"role": "assistant", "content": chosen}]
        assert n["completions"][0]["rank"] == 0 and n["completions"][0]["completion"][0]["content"] == chosen
        assert o["preferred_output"][0]["content"] == chosen and o["input"]["messages"] == json.loads(PROMPT)
        assert side["reward_weights"] == {"judge_rank": 0.5, "structure": 0.5}
