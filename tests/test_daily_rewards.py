"""Structure score, rank reward, reward mix and group-normalised advantages."""

import numpy as np
import pytest

from outcome_flywheel.daily_rl.rewards import group_advantages, mixed_reward, rank_reward
from outcome_flywheel.daily_rl.structure import sections_present, structure_score
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
    text = "**Trade Recommendation:** Buy MSFT\n## Rationale\nCloud demand.\n- risk factors: rates\n1. Position size - 2%"
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
    assert adv.mean() == pytest.approx(0.0, abs=1e-9)
    assert adv.std() == pytest.approx(1.0, rel=1e-3)
    assert np.all(np.diff(adv) > 0)  # order kept, sign: better than the group mean -> positive
    assert np.all(group_advantages([0.5, 0.5, 0.5]) == 0.0)
    assert group_advantages([]).size == 0


def test_reward_config_weighs_named_signals_and_clips():
    from outcome_flywheel.daily_rl.rewards import RewardConfig

    assert RewardConfig().combine({"structure": 1.0, "judge_rank": 0.0}) == pytest.approx(0.5)
    only_structure = RewardConfig(weights={"structure": 1.0}, clip_max=0.8)
    assert only_structure.combine({"structure": 1.0, "judge_rank": 0.3}) == pytest.approx(0.8)  # clipped
    assert RewardConfig(weights={"structure": 2.0, "judge_rank": -1.0}, clip_min=-1.0, clip_max=2.0).combine(
        {"structure": 0.5, "judge_rank": 1.0}) == pytest.approx(0.0)
    assert RewardConfig().describe() == {"reward_weights": '{"judge_rank": 0.5, "structure": 0.5}', "reward_clip": "[0.0, 1.0]"}
    for bad in (dict(weights={"price": 1.0}), dict(weights={"structure": 0.0}), dict(clip_min=1.0, clip_max=0.0),
                dict(weights={"structure": float("nan")})):
        with pytest.raises(ValueError):
            RewardConfig(**bad)
    with pytest.raises(ValueError):
        RewardConfig().combine({"structure": 1.0})  # a weighted signal is missing
