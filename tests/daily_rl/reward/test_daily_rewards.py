"""Structure score, rank reward, reward mix and group-normalised advantages."""

import numpy as np
import pytest

from outcome_flywheel.daily_rl.notes.structure import sections_present, structure_score
from outcome_flywheel.daily_rl.reward.signals import RewardConfig, group_advantages, mixed_reward, rank_reward
from outcome_flywheel.models.prompts import NOTE_SECTIONS

FULL = "\n".join(f"{name}: something" for name in NOTE_SECTIONS)


def test_structure_score_counts_sections_with_text():
    assert structure_score(FULL) == 1.0
    assert structure_score("") == 0.0
    assert structure_score("We are constructive on AAPL after this news.") == 0.0
    half = "Trade Recommendation: Buy AAPL.\nRationale: momentum.\nTimeframe: 2 weeks."
    assert structure_score(half) == pytest.approx(0.5)
    # a header with nothing after it does not count; repeats count once
    assert structure_score("Stop Loss:\nStop Loss:") == 0.0
    assert structure_score("Stop Loss: 5%\nStop Loss: 6%") == pytest.approx(1 / 6)


def test_structure_score_accepts_markdown_headers():
    text = (
        "**Trade Recommendation:** Buy MSFT\n## Rationale\nCloud demand.\n- risk factors: rates\n1. Position size - 2%"
    )
    assert sections_present(text) == ["Trade Recommendation", "Rationale", "Risk Factors", "Position Size"]
    # a section name inside a sentence is not a header
    assert structure_score("We set the stop loss: 5%") == 0.0


def test_rank_reward_endpoints_and_linearity():
    assert rank_reward(1, 8) == 1.0
    assert rank_reward(8, 8) == 0.0
    assert rank_reward(4, 7) == pytest.approx(0.5)
    assert rank_reward(1, 1) == 1.0
    with pytest.raises(ValueError):
        rank_reward(9, 8)


def test_mixed_reward_is_half_and_half_in_unit_interval():
    assert mixed_reward(1.0, 1.0) == 1.0
    assert mixed_reward(0.0, 0.0) == 0.0
    assert mixed_reward(0.5, 1.0) == pytest.approx(0.75)
    with pytest.raises(ValueError):
        mixed_reward(1.2, 0.0)


def test_group_advantages_normalise_within_the_group():
    rewards = [0.1, 0.4, 0.7, 1.0]
    adv = group_advantages(rewards)
    # float64: the mean cancels to ~1e-16; the std is std / (std + 1e-4) = 1 - 3e-4 here (the eps)
    assert adv.mean() == pytest.approx(0.0, abs=1e-9)
    assert adv.std() == pytest.approx(1.0, rel=1e-3)
    assert np.all(np.diff(adv) > 0)  # order kept, sign: better than the group mean -> positive
    assert np.all(group_advantages([0.5, 0.5, 0.5]) == 0.0)
    assert group_advantages([]).size == 0


def test_reward_config_weighs_named_signals_and_clips():
    from outcome_flywheel.daily_rl.reward.signals import RewardConfig

    assert RewardConfig().combine({"structure": 1.0, "judge_rank": 0.0}) == pytest.approx(0.5)
    only_structure = RewardConfig(weights={"structure": 1.0}, clip_max=0.8)
    assert only_structure.combine({"structure": 1.0, "judge_rank": 0.3}) == pytest.approx(0.8)  # clipped
    assert RewardConfig(weights={"structure": 2.0, "judge_rank": -1.0}, clip_min=-1.0, clip_max=2.0).combine(
        {"structure": 0.5, "judge_rank": 1.0}
    ) == pytest.approx(0.0)
    assert RewardConfig().describe() == {
        "reward_weights": '{"human": 0.5, "judge_rank": 0.5, "price": 1.0, "relevance": 1.0, "structure": 0.5}',
        "reward_clip": "[0.0, 1.0]",
    }
    for bad in (
        dict(weights={"profit": 1.0}),
        dict(weights={"structure": 0.0}),
        dict(clip_min=1.0, clip_max=0.0),
        dict(weights={"structure": float("nan")}),
    ):
        with pytest.raises(ValueError):
            RewardConfig(**bad)
    with pytest.raises(ValueError):
        RewardConfig().combine({"structure": 1.0})  # a weighted signal is missing


def test_the_human_signal_joins_only_where_people_rated_the_note():
    config = RewardConfig()
    # no feedback: exactly the reward without the human signal
    assert config.combine({"structure": 0.6, "judge_rank": 0.2}) == pytest.approx(0.4)
    assert config.combine({"structure": 0.6, "judge_rank": 0.2, "human": None}) == pytest.approx(0.4)
    # rated: the weighted mean of the three, on the same [0, 1] scale
    assert config.combine({"structure": 0.6, "judge_rank": 0.2, "human": 1.0}) == pytest.approx((0.3 + 0.1 + 0.5) / 1.5)
    assert config.combine({"structure": 0.6, "judge_rank": 0.2, "human": 0.0}) == pytest.approx((0.3 + 0.1) / 1.5)
    with pytest.raises(ValueError, match="outside"):
        config.combine({"structure": 0.6, "judge_rank": 0.2, "human": 2.0})
    assert (
        RewardConfig(weights={"structure": 0.5, "judge_rank": 0.5}).combine(
            {"structure": 1, "judge_rank": 1, "human": 0.0}
        )
        == 1.0
    )


def test_score_table_takes_the_human_signal_of_rated_notes():
    import pandas as pd

    from outcome_flywheel.daily_rl.judge.ranking import GroupJudgement, JudgeGroup
    from outcome_flywheel.daily_rl.reward.rollout_scores import ScoringInput, score_table

    frame = pd.DataFrame({"rollout_index": [0, 1], "structure_score": [1.0, 1.0]})
    inputs = ScoringInput(
        groups=[JudgeGroup("Oil rises", ["Oil up 2%"], ["a", "b"], seed=1)], keys=["h1"], frames=[frame]
    )
    judged = [GroupJudgement(ranks=[1, 2], picks=[0, 1], rounds_answered=1)]
    plain = score_table(inputs, judged, "2025-11-05", "2025-11-04", "2025-11-05")
    rated = score_table(inputs, judged, "2025-11-05", "2025-11-04", "2025-11-05", human={("h1", 1): 1.0})
    assert list(plain["reward"]) == pytest.approx([1.0, 0.5]) and plain["human_signal"].isna().all()
    assert list(rated["reward"]) == pytest.approx([1.0, (0.5 + 0.0 + 0.5) / 1.5])  # people liked the judge's loser
    assert rated["human_signal"].iloc[1] == 1.0 and pd.isna(rated["human_signal"].iloc[0])


def test_the_relevance_signal_pays_a_side_on_the_company_not_abstaining_on_it():
    """rollout_scores' relevance: 1 for a call with a side on the headline's company, 0 for "No trade on
    <company>" (which names it), 0 for a call on another company, None where the headline names none."""
    import pandas as pd

    from outcome_flywheel.daily_rl.reward.rollout_scores import relevance_signals

    notes = [
        "Trade Recommendation: Short Pfizer (PFE), 2 days.",
        "Trade Recommendation: No trade on Pfizer; wait for the open.",
        "Trade Recommendation: Long Apple (AAPL), 2 days.",
        "Trade Recommendation: Long Pfizer (PFE), 2 days.",
    ]
    rollouts = pd.DataFrame(
        {
            "headline_id": ["h1"] * 3 + ["h2"],
            "rollout_index": [0, 1, 2, 0],
            "title": ["Pfizer cuts its outlook"] * 3 + ["Markets wait for the Fed"],
            "summary": [""] * 3 + ["Stocks were flat."],
            "response": notes,
        }
    )
    assert relevance_signals(rollouts, None) == {("h1", 0): 1.0, ("h1", 1): 0.0, ("h1", 2): 0.0, ("h2", 0): None}


def test_a_group_calling_only_other_names_learns_under_the_days_baseline_and_not_under_its_own():
    """relevance_baseline: under `group` a group whose notes all call another company gets zero relevance
    advantages (nothing pulls it back); under `day` it is measured against the day's mean and pushed back,
    by the day's std. Groups the judge could not use, or whose headline names no company, stay at 0 and do
    not enter the day's mean; an unknown baseline is refused."""
    import pandas as pd

    from outcome_flywheel.daily_rl.judge.ranking import GroupJudgement, JudgeGroup
    from outcome_flywheel.daily_rl.reward.rollout_scores import ScoringInput, relevance_advantages, score_table

    keys = ["mixed", "off", "unjudged", "no_company"]
    frames = [pd.DataFrame({"rollout_index": [0, 1, 2, 3], "structure_score": [1.0] * 4}) for _ in keys]
    inputs = ScoringInput(
        groups=[JudgeGroup("t", ["o"], ["a", "b", "c", "d"], seed=1) for _ in keys], keys=keys, frames=frames
    )
    judged = [GroupJudgement(ranks=[1, 2, 3, 4], picks=[0, 1, 2, 3], rounds_answered=3) for _ in keys]
    judged[2] = GroupJudgement(ranks=[1, 2, 3, 4], skipped="no outcome headlines")
    on = {"mixed": [1, 1, 1, 0], "off": [0, 0, 0, 0], "unjudged": [1, 0, 1, 0], "no_company": [None] * 4}
    relevance = {(k, i): on[k][i] for k in keys for i in range(4)}

    def advantages(baseline):
        table = score_table(inputs, judged, "d", "p", "o", relevance=relevance, relevance_baseline=baseline)
        assert set(table["relevance_baseline"]) == {baseline}
        return {k: list(g["relevance_advantage"]) for k, g in table.groupby("headline_id")}

    group = advantages("group")
    assert group["off"] == [0.0] * 4 and group["mixed"] == pytest.approx(list(group_advantages([1, 1, 1, 0])))
    day = advantages("day")
    pooled = np.array(on["mixed"] + on["off"], dtype=float)  # the two usable groups that name a company
    expected = (pooled - pooled.mean()) / pooled.std()
    assert day["mixed"] + day["off"] == pytest.approx(list(expected))
    assert all(a < 0 for a in day["off"]) and all(a > 0 for a in day["mixed"][:3])
    assert day["unjudged"] == day["no_company"] == [0.0] * 4
    # relevance not weighted: nothing trains, whatever the baseline
    unweighted = RewardConfig(weights={"structure": 0.5, "judge_rank": 0.5})
    table = score_table(inputs, judged, "d", "p", "o", unweighted, relevance=relevance, relevance_baseline="day")
    assert (table["relevance_advantage"] == 0).all()
    # a day whose notes all call the company (or all do not) has no spread: zeros, not a division by 0
    assert [list(a) for a in relevance_advantages([[1.0, 1.0], [1.0, 1.0]], [True, True], "day")] == [[0, 0], [0, 0]]
    with pytest.raises(ValueError, match="relevance_baseline must be one of group, day"):
        relevance_advantages([[1.0]], [True], "batch")
