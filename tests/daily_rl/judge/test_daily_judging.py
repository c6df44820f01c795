"""Judge side without a model: hostile answers, rank repair, iterative selection."""

import pytest

from outcome_flywheel.daily_rl.judge.ranking import (
    NEVER_ANSWERED,
    NO_OUTCOME_HEADLINES,
    JudgeGroup,
    extract_letter,
    is_permutation,
    judge_groups,
    picks_to_ranks,
    rank_groups,
    repair_ranks,
    select_outcome_headlines,
)
from outcome_flywheel.daily_rl.reward.signals import rank_reward, rank_rewards


@pytest.mark.parametrize(
    "answer, n, expected",
    [
        ("C", 8, 2),
        ("c", 8, 2),
        ("  b.\n", 8, 1),
        ("[D]", 8, 3),
        ("(e)", 8, 4),
        ('{"answer": "F"}', 8, 5),
        ('{"Best": "g", "reason": "it had a stop loss"}', 8, 6),
        ('```json\n{"choice": "h"}\n```', 8, 7),
        ("```\nA\n```", 8, 0),
        ("Answer: c", 8, 2),
        ("The best candidate is [B] because it names a stop.", 8, 1),
        ("BBBB", 8, 1),
        ("B B B", 8, 1),
        ('"A"', 3, 0),
        ("My choice is a clear C", 8, 2),  # the article "a" is not the letter A
        ("The answer is a tough one, but C", 8, 2),
        ("the answer is d.", 8, 3),
        ("A strong note: D", 8, 3),  # the article "A" opens a phrase; the letter follows the colon
        ("A strong note, but D.", 8, 3),
        ("I think C", 8, 2),
        ("A is the best", 8, 0),
        ("The best one is E", 8, 4),
    ],
)
def test_extract_letter_tolerates_formats(answer, n, expected):
    assert extract_letter(answer, n) == expected


@pytest.mark.parametrize(
    "answer, n",
    [
        ("", 8),
        (None, 8),
        ("   ", 8),
        ("Z", 8),
        ("[Z]", 8),
        ("F", 5),
        ('{"answer": "H"}', 4),
        ("no idea", 8),
        ("```\n```", 8),
        ("12", 8),
        ("{}", 8),
    ],
)
def test_extract_letter_rejects_out_of_range_and_empty(answer, n):
    assert extract_letter(answer, n) is None


def test_picks_to_ranks_dedupes_drops_and_pads():
    assert picks_to_ranks([2, 2, 9, None, 0], 4) == [2, 3, 1, 4]  # 2 best, then 0, then 1, 3 in index order
    assert picks_to_ranks([], 3) == [1, 2, 3]
    assert picks_to_ranks([-1, 5], 2) == [1, 2]


@pytest.mark.parametrize(
    "ranks", [[1, 1, 1, 1], [0, 9, 3, 3], [None, 2, None, 1], [4, 3, 2, 1], [float("nan"), 1, 2, 2], ["x", 2, 2, 2]]
)
def test_repair_ranks_always_permutation(ranks):
    fixed = repair_ranks(ranks)
    assert is_permutation(fixed)
    assert len(fixed) == len(ranks)


def test_repair_ranks_keeps_a_valid_permutation_and_breaks_ties_by_index():
    assert repair_ranks([3, 1, 2]) == [3, 1, 2]
    assert repair_ranks([1, 1, 2]) == [1, 2, 3]
    assert repair_ranks([None, 1]) == [2, 1]


def scripted(answers_by_call):
    """An ask() that replays per-call answers, recording what it was asked."""
    calls = []

    def ask(requests, strict):
        calls.append(([r.remaining for r in requests], strict))
        return answers_by_call[len(calls) - 1]

    return ask, calls


def test_iterative_selection_relabels_remaining_candidates():
    # 4 candidates; the judge says "C" (candidate 2), then "C" again of the remaining [0, 1, 3] = candidate 3,
    # then "a" of [0, 1] = candidate 0; the last one (1) is ranked without asking.
    ask, calls = scripted([["C"], ["[C]"], ["a"]])
    [result] = rank_groups([4], ask)
    assert result.picks == [2, 3, 0, 1]
    assert result.ranks == [3, 4, 1, 2]
    assert [c[0] for c in calls] == [[(0, 1, 2, 3)], [(0, 1, 3)], [(0, 1)]]
    assert result.usable and result.retries == 0 and not result.fallback


def test_greedy_retry_then_fallback_and_unanswered_group():
    # group 0 answers garbage, retry "B"; group 1 never answers (garbage twice): unusable, index order.
    ask, calls = scripted([["???", "nope"], ["B", ""], ["A"]])
    g0, g1 = rank_groups([3, 3], ask)
    assert calls[1] == ([(0, 1, 2), (0, 1, 2)], True)  # the retry is strict (greedy)
    assert g0.ranks == [2, 1, 3] and g0.retries == 1 and g0.usable
    assert g1.ranks == [1, 2, 3] and g1.fallback and not g1.usable and g1.rounds_answered == 0
    assert len(calls) == 3  # g1 is not asked again after failing its retry


def test_partial_answers_are_usable_with_fallback_padding():
    ask, calls = scripted([["D"], ["zzz"], ["Q"]])
    [g] = rank_groups([5], ask)
    assert g.usable and g.fallback and g.rounds_answered == 1
    assert g.ranks[3] == 1 and is_permutation(g.ranks)


def test_groups_of_one_or_none_need_no_judge():
    ask, calls = scripted([])
    single, empty = rank_groups([1, 0], ask)
    assert single.ranks == [1] and empty.ranks == [] and calls == []


def test_select_outcome_headlines_prefers_follow_ups():
    outcomes = [
        "Nvidia wins defense contract",
        "AAPL shares rise 3% after the news as Apple buyback lands",
        "Oil slides",
        "Apple shares extend gains a day after buyback",
    ]
    shown = select_outcome_headlines("Apple announces $40 billion share buyback", outcomes, k=2)
    assert set(shown) == {outcomes[1], outcomes[3]}
    assert select_outcome_headlines("x", [], k=3) == []


def test_presentation_order_is_a_seeded_permutation_per_round_and_recorded():
    """A judge that always answers "A" picks whatever was shown first: with shuffled, recorded
    orders its picks follow the permutations, not the rollout index."""

    def always_a(requests, strict):
        return ["A"] * len(requests)

    groups = rank_groups([8] * 40, always_a, seeds=list(range(40)))
    for g in groups:
        assert [order[0] for order in g.shown] == g.picks[:7]  # the first shown each round was picked
        assert all(sorted(order) == sorted(set(order)) for order in g.shown)
        assert is_permutation(g.ranks) and g.first_position(g.picks[0]) == 0
    assert len({tuple(g.shown[0]) for g in groups}) > 30  # orders differ by seed
    again = rank_groups([8] * 40, always_a, seeds=list(range(40)))
    assert [g.shown for g in again] == [g.shown for g in groups]  # and repeat with it
    # position bias no longer lands on index 0: mean rank by rollout index is near (N+1)/2 everywhere
    mean_rank_by_index = [sum(g.ranks[i] for g in groups) / len(groups) for i in range(8)]
    assert max(mean_rank_by_index) - min(mean_rank_by_index) < 3.0
    assert all(g.ranks[g.shown[0][0]] == 1 for g in groups)  # shown position A -> rank 1


def test_unplaced_notes_share_the_mean_of_the_remaining_rank_rewards():
    ask, _ = scripted([["D"], ["B"], ["zzz"], ["zzz"]])
    [g] = rank_groups([5], ask)
    assert g.picks == [3, 1] and g.fallback and g.usable
    rewards = rank_rewards(g, rank_reward)
    assert rewards[3] == 1.0 and rewards[1] == 0.75
    shared = (0.5 + 0.25 + 0.0) / 3
    assert rewards[0] == rewards[2] == rewards[4] == pytest.approx(shared)  # index order carries nothing
    assert is_permutation(g.ranks)  # stored ranks stay a permutation
    never = rank_groups([3], scripted([["?"], ["?"]])[0])[0]
    assert rank_rewards(never, rank_reward) == [0.5, 0.5, 0.5] and never.unusable_reason == NEVER_ANSWERED


def test_groups_without_outcome_headlines_are_not_judged():
    class NoModel:
        def sample(self, *args, **kwargs):  # pragma: no cover - must not be called
            raise AssertionError("the judge was asked about a group with nothing to judge against")

        greedy = sample

    groups = [JudgeGroup("Apple buyback", [], ["note a", "note b", "note c"], seed=1)]
    [judgement] = judge_groups(NoModel(), groups)
    assert not judgement.usable and judgement.unusable_reason == NO_OUTCOME_HEADLINES
    assert is_permutation(judgement.ranks)


def test_the_judge_loads_the_base_or_its_own_model_without_the_policys_adapter(model_backend, tiny_model_dir, tmp_path):
    """`Judge.load`: no `judge_model` is the frozen base itself; a `judge_model` (here another folder holding the
    same weights) is loaded from its own folder on the same backend and device."""
    import shutil

    import numpy as np

    from outcome_flywheel.daily_rl.judge.llm_judge import Judge
    from outcome_flywheel.models.prompts import trading_note_messages

    other = tmp_path / "judge-model"
    shutil.copytree(tiny_model_dir, other)
    prompt = [trading_note_messages("Apple beats estimates", "")]
    base = Judge().load(model_backend)
    own = Judge(judge_model=str(other)).load(model_backend)
    assert not base.has_adapter and not own.has_adapter
    assert type(own) is type(base) and own.greedy(prompt, 8) == base.greedy(prompt, 8)
    ids = base.encode_response("Buy AAPL")
    assert np.allclose(own.response_logprobs(prompt, [ids])[0], base.response_logprobs(prompt, [ids])[0])
    with pytest.raises((OSError, ValueError)):  # neither a folder nor a hub id in the cache (no download here)
        Judge(judge_model=str(tmp_path / "missing")).load(model_backend)
