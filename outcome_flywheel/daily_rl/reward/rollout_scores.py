"""`rollout_scores(D)`: D-1's notes scored. The judge ranks each headline's notes against the outcome
day's headlines (or a synthetic world's follow-ups); with the structure score, people's ratings
(`human`), whether the call is on the headline's company (`relevance`) and, when weighted, the online
note scorer's score, that makes each note's immediate reward and its group advantage (`score_table`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from outcome_flywheel.daily_rl.judge.ranking import GroupJudgement, JudgeGroup, is_permutation
from outcome_flywheel.daily_rl.notes.calls import calls_frame
from outcome_flywheel.daily_rl.notes.relevance import relevance_column
from outcome_flywheel.daily_rl.partitions import stable_seed
from outcome_flywheel.daily_rl.reward.credit import RELEVANCE_BASELINES
from outcome_flywheel.daily_rl.reward.signals import RewardConfig, group_advantages, rank_reward, rank_rewards
from outcome_flywheel.feedback.curation import note_ratings

# The `rollout_scores` table's stored columns, in order: column -> (type, description) as the Dagster catalog
# shows them (assets/catalog.py reads them from here).
SCORE_COLUMN_SCHEMA: dict[str, tuple[str, str]] = {
    "date": ("string", "Partition day D (the day whose headlines are the outcome)."),
    "prediction_date": ("string", "Day of the scored rollouts (D-1)."),
    "outcome_headlines_date": ("string", "Day whose headlines the judge compared against (D, or the override day)."),
    "headline_id": ("string", "The headline of the scored group (rollouts.headline_id of D-1)."),
    "rollout_index": ("int", "Which note of the group (rollouts.rollout_index)."),
    "rank": ("int", "Judge rank, 1 = best; the group's ranks are a permutation of 1..N."),
    "judge_placed": ("bool", "The judge picked this note in some round (unplaced notes share one reward)."),
    "outcome_reward": ("float", "Rank reward 1 - (rank-1)/(N-1), in [0, 1]."),
    "structure_score": ("float", "Structure score of the note, in [0, 1]."),
    "reward": (
        "float",
        (
            "Weighted sum of the signals (reward_weights), clipped to reward_clip; default 0.5 * structure_score + 0.5 * "
            "outcome_reward in [0, 1]."
        ),
    ),
    "advantage": ("float", "Reward normalised within the headline's group (0 for unusable groups)."),
    "usable": ("bool", "The group is trained on (the judge answered and there were outcome headlines)."),
    "unusable_reason": ("string", "Why the group is not trained on; empty when usable."),
    "judge_retries": ("int", "Greedy retries asking for exactly one letter."),
    "judge_fallback": ("bool", "The judge gave no usable letter in some round (ranks were padded)."),
    "judge_rounds_answered": ("int", "Selection rounds the judge answered."),
    "judge_first_position": ("int", "Position the note was shown at in the first round (0 = A), -1 if never shown."),
    "judge_presentation": ("string", "Per round, the notes in the order shown (A, B, ...), JSON."),
    "judge_answers": ("string", "The judge's raw answer per round, JSON."),
    "outcome_headlines_shown": ("string", "Outcome headlines shown to the judge, JSON."),
    "reward_weights": ("string", "Weight of each named signal the reward was made with (structure, judge_rank), JSON."),
    "reward_clip": ("string", "[min, max] the reward was clipped to, JSON."),
    "judge_note_tokens": ("int", "The note's length in tokens, whitespace collapsed (0 when the judge was not asked)."),
    "judge_shown_tokens": ("int", "Tokens of the note the judge saw: its fair share of the judge's prompt budget."),
    "judge_truncated": ("bool", "The note was cut to fit the judge's prompt budget."),
    "human_signal": (
        "float",
        (
            "People's thumbs/stars on the note in [0, 1] (note_feedback of the notes' day, mean), when it has any: the "
            "`human` reward signal."
        ),
    ),
    "relevance_signal": (
        "float",
        (
            "1 if the call is on a company the headline names, 0 if not; empty when the headline names no known company: "
            "the `relevance` signal."
        ),
    ),
    "relevance_advantage": (
        "float",
        (
            "The `relevance` part's advantage, normalised against the group or the day (`relevance_baseline`) and "
            "trained on the call's span (`relevance_span`) times its share; 0 where relevance is not weighted or the "
            "headline names no company."
        ),
    ),
    "relevance_baseline": ("string", "What relevance_advantage was measured against: `group` or `day`."),
}
SCORE_COLUMNS = list(SCORE_COLUMN_SCHEMA)


@dataclass
class ScoringInput:
    groups: list[JudgeGroup]
    keys: list[str]  # headline_id per group
    frames: list[pd.DataFrame]  # the group's rollouts, in rollout_index order


def judge_inputs(
    rollouts: pd.DataFrame, outcome_titles: Sequence[str], select_outcomes, seed: int, day: str
) -> ScoringInput:
    """One judge group per headline of the previous day's rollouts."""
    groups, keys, frames = [], [], []
    for headline_id, frame in rollouts.groupby("headline_id", sort=True):
        frame = frame.sort_values("rollout_index")
        title = frame["title"].iloc[0]
        groups.append(
            JudgeGroup(
                title,
                select_outcomes(title, list(outcome_titles)),
                list(frame["response"]),
                stable_seed(seed, day, headline_id, "judge"),
            )
        )
        keys.append(headline_id)
        frames.append(frame)
    return ScoringInput(groups, keys, frames)


def score_table(
    inputs: ScoringInput,
    judgements: Sequence[GroupJudgement],
    day: str,
    prediction_date: str,
    outcome_date: str,
    reward: RewardConfig | None = None,
    human: Mapping[tuple[str, int], float] | None = None,
    relevance: Mapping[tuple[str, int], float | None] | None = None,
    scorer: Mapping[tuple[str, int], float] | None = None,
    relevance_baseline: str = "group",
) -> pd.DataFrame:
    """rollout_scores rows: rank -> rank reward, the configured weighted sum of the whole-note signals
    (default 0.5 structure + 0.5 rank reward, clipped to [0, 1]) and its group advantage (`advantage`),
    the `relevance` part's own advantage (`relevance_advantage`, against `relevance_baseline`: see
    `relevance_advantages`; 0 where it is not weighted or the headline names no company); every row records
    the weights, clip and relevance baseline it was made with.

    Notes the judge never placed (it failed a round) share one rank reward (`rank_rewards`).
    Unusable groups (the judge never answered, or there was nothing to judge against) keep their
    rows with advantage 0 and the reason. `human`: (headline_id, rollout_index) -> the note's human
    signal in [0, 1], for the notes people rated (the `human` reward signal); `relevance`: the same key
    -> the `relevance` signal, None where the headline names no known company; `scorer`: the same key
    -> the online note scorer's signal, where it is weighted and known.
    """
    reward_config = reward or RewardConfig()
    human = human or {}
    relevance = relevance or {}
    scorer = scorer or {}
    recorded = reward_config.describe()
    on_topic_by_group = [
        [relevance.get((key, int(i))) for i in frame["rollout_index"]] for key, frame in zip(inputs.keys, inputs.frames)
    ]
    relevance_by_group = relevance_advantages(
        on_topic_by_group,
        [bool(j.usable) for j in judgements],
        relevance_baseline if reward_config.weighs("relevance") else None,
    )
    rows = []
    for group, key, frame, judgement, on_topic, relevance_adv in zip(
        inputs.groups, inputs.keys, inputs.frames, judgements, on_topic_by_group, relevance_by_group
    ):
        if not is_permutation(judgement.ranks):  # rank_groups guarantees it; never train on anything else
            raise AssertionError(f"ranks of {key} are not a permutation: {judgement.ranks}")
        n = len(judgement.ranks)
        structure = [float(s) for s in frame["structure_score"]]
        outcome = rank_rewards(judgement, rank_reward)
        people = [human.get((key, int(i))) for i in frame["rollout_index"]]
        rated = [scorer.get((key, int(i))) for i in frame["rollout_index"]]
        rewards = [
            reward_config.combine({"structure": s, "judge_rank": o, "human": h, "relevance": r, "scorer": c})
            for s, o, h, r, c in zip(structure, outcome, people, on_topic, rated)
        ]
        advantage = group_advantages(rewards) if judgement.usable else np.zeros(n)
        placed = set(judgement.picks)
        for k, rollout_index in enumerate(frame["rollout_index"]):
            rows.append(
                dict(
                    date=day,
                    prediction_date=prediction_date,
                    outcome_headlines_date=outcome_date,
                    headline_id=key,
                    rollout_index=int(rollout_index),
                    rank=int(judgement.ranks[k]),
                    judge_placed=k in placed,
                    outcome_reward=outcome[k],
                    structure_score=structure[k],
                    reward=rewards[k],
                    advantage=float(advantage[k]),
                    usable=bool(judgement.usable),
                    unusable_reason=judgement.unusable_reason,
                    judge_retries=int(judgement.retries),
                    judge_fallback=bool(judgement.fallback),
                    judge_rounds_answered=int(judgement.rounds_answered),
                    judge_first_position=judgement.first_position(k),
                    judge_presentation=json.dumps(judgement.shown),
                    judge_answers=json.dumps(judgement.answers),
                    outcome_headlines_shown=json.dumps(group.outcome_headlines),
                    **recorded,
                    judge_note_tokens=int(judgement.note_tokens[k]) if judgement.note_tokens else 0,
                    judge_shown_tokens=int(judgement.shown_tokens[k]) if judgement.shown_tokens else 0,
                    judge_truncated=judgement.truncated(k),
                    human_signal=people[k],
                    relevance_signal=on_topic[k],
                    relevance_advantage=float(relevance_adv[k]),
                    relevance_baseline=relevance_baseline,
                )
            )
    return pd.DataFrame(rows, columns=SCORE_COLUMNS)


def relevance_advantages(
    on_topic: Sequence[Sequence[float | None]], usable: Sequence[bool], baseline: str | None
) -> list[np.ndarray]:
    """Each group's `relevance` advantages (its own part: it judges the call's ticker), over the groups whose
    judgement is usable and whose headline names a company (every note's signal defined); zeros elsewhere
    and when `baseline` is None (relevance not weighted).

    `group`: (r - the group's mean) / its std, GRPO's. A group whose notes all call another name gets
    zeros, so nothing pulls it back to the headline's company. `day`: (r - m) / s with m, s the mean and
    std over every such note of the day: REINFORCE++'s batch baseline (Hu 2025), so that group is pushed
    back, and a group on the company everywhere is pushed further on."""
    if baseline is not None and baseline not in RELEVANCE_BASELINES:
        raise ValueError(f"relevance_baseline must be one of {', '.join(RELEVANCE_BASELINES)}, got {baseline!r}")
    trained = [
        baseline is not None and ok and all(r is not None for r in values) for values, ok in zip(on_topic, usable)
    ]
    out = [np.zeros(len(values)) for values in on_topic]
    if baseline == "group":
        for k, values in enumerate(on_topic):
            if trained[k]:
                out[k] = group_advantages([float(r) for r in values])
    elif baseline == "day":
        pooled = np.array([float(r) for values, t in zip(on_topic, trained) if t for r in values])
        if pooled.size and pooled.std() >= 1e-8:
            mean, std = pooled.mean(), pooled.std()
            for k, values in enumerate(on_topic):
                if trained[k]:
                    out[k] = (np.array([float(r) for r in values]) - mean) / std
    return out


def position_bias(scores: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Mean judge rank (1 = best) by the letter a note was first shown under, and by rollout
    index, over judged groups: a flat profile is no bias; ~(N+1)/2 everywhere is no preference."""
    judged = scores[scores["judge_rounds_answered"] > 0] if len(scores) else scores
    if judged.empty:
        return {"by_shown_position": {}, "by_rollout_index": {}}
    by_position = judged[judged["judge_first_position"] >= 0].groupby("judge_first_position")["rank"].mean()
    by_index = judged.groupby("rollout_index")["rank"].mean()
    return {
        "by_shown_position": {chr(ord("A") + int(p)): round(float(v), 3) for p, v in by_position.items()},
        "by_rollout_index": {str(int(i)): round(float(v), 3) for i, v in by_index.items()},
    }


def score_rollouts(
    inputs: ScoringInput,
    judgements: Sequence[GroupJudgement],
    day: str,
    prediction_day: str,
    outcome_day: str,
    prev_rollouts: pd.DataFrame,
    reward: RewardConfig | None = None,
    universe: set[str] | None = None,
    human: Mapping[tuple[str, int], float] | None = None,
    scorer: Mapping[tuple[str, int], float] | None = None,
    relevance_baseline: str = "group",
) -> pd.DataFrame:
    """rollout_scores(D): the judge's `judgements` of D-1's groups (`inputs`, `judge_inputs` over the outcome
    day's headlines, or a world's own follow-ups of the headlines' companies) made into rewards, with people's
    ratings (`human`, `human_signals`), whether each call is on the headline's company (`universe`) and the
    online note scorer's signal (`note_scorer.signal.scorer_signals`), when weighted."""
    if prev_rollouts.empty:
        return pd.DataFrame(columns=SCORE_COLUMNS)
    relevance = relevance_signals(prev_rollouts, universe)
    return score_table(
        inputs, judgements, day, prediction_day, outcome_day, reward, human, relevance, scorer, relevance_baseline
    )


def relevance_signals(rollouts: pd.DataFrame, universe: set[str] | None) -> dict[tuple[str, int], float | None]:
    """(headline_id, rollout_index) -> the `relevance` signal (None where the headline names no known company)."""
    calls = calls_frame(rollouts[["headline_id", "rollout_index", "title", "summary", "response"]], universe)
    values = relevance_column(calls)
    return {
        (str(h), int(i)): (None if v != v else float(v))
        for h, i, v in zip(calls["headline_id"], calls["rollout_index"], values)
    }


def human_signals(feedback: pd.DataFrame | None) -> dict[tuple[str, int], float]:
    """(headline_id, rollout_index) -> mean human score of the notes people rated, from note_feedback(D-1)
    as it stands when D is scored (no declared dependency: note_feedback reads rollouts, so a declared one
    would close a cycle; re-run D to take later feedback in). None or empty: no ratings."""
    if feedback is None or feedback.empty:
        return {}
    ratings = note_ratings(feedback)
    return {
        (str(h), int(i)): float(v)
        for h, i, v in zip(ratings["headline_id"], ratings["rollout_index"], ratings["rating"])
    }
