"""The online note scorer's learning signals as events, in a fixed order (docs/tiers.md).

Day D's events, in this order:
1. judge: `rollout_scores(D)` (the judge's ranks of D-1's notes, given on D), one event per usable
   headline group, labels = the rank reward r_k; groups in headline_id order;
2. price: the policy's calls whose price matured with exit session D (`rollout_outcomes` of earlier
   days), one event per headline group, labels = the `price` signal (PriceReward: the logistic of
   vs_spy_pct; no-trade and unparseable notes their set values); groups by note day, headline_id;
3. people: every rated feedback on notes of day D or earlier that the state has not taken yet
   (`ScorerState.applied_people`), one event per feedback in log order, labels = people's mean rating
   of each note of the headline as of that feedback (thumbs up 1 / down 0, stars (s-1)/4), notes
   nobody rated at a neutral 0.5: a thumbs-up says "better than the others".
People's events are the only ones that arrive outside the day's partition: the service steps the
live state on each feedback as it is posted, at any hour and on notes of any day (an archive day of
2025, rated today). The day's state starts from D-1's (a re-run reproduces it) and takes each
feedback the chain has not taken yet, so what people taught is in every later day's state, once.
"""

from __future__ import annotations

import datetime as dt
from typing import Callable, Collection, Iterable, Sequence
from zoneinfo import ZoneInfo

import pandas as pd

from outcome_flywheel.daily_rl.note_scorer.model import Event, clipped_event
from outcome_flywheel.daily_rl.reward.signals import PriceReward
from outcome_flywheel.feedback.records import FeedbackRecord, human_signal

NEUTRAL = 0.5


def judge_events(scores: pd.DataFrame, day: str) -> list[Event]:
    """One event per usable headline group of rollout_scores(D)."""
    if scores.empty:
        return []
    events = []
    for headline_id, group in sorted(
        scores[scores["usable"].astype(bool)].groupby("headline_id"), key=lambda g: str(g[0])
    ):
        group = group.sort_values("rollout_index")
        note_day = str(group["prediction_date"].iloc[0])
        keys = [(note_day, str(headline_id), int(i)) for i in group["rollout_index"]]
        events.append(
            clipped_event(
                "judge", day, f"{note_day}/{headline_id}", keys, group["outcome_reward"].astype(float).tolist()
            )
        )
    return events


def price_events(outcomes: pd.DataFrame, day: str, price: PriceReward | None = None) -> list[Event]:
    """One event per headline group of the policy's notes whose calls matured with exit session `day`."""
    if outcomes.empty:
        return []
    price = price or PriceReward()
    policy = outcomes[outcomes["source"] == "policy"]
    matured_groups = policy[(policy["status"] == "matured") & (policy["exit_date"].astype(str) == day)]
    events = []
    for note_day, headline_id in sorted(
        {(str(d), str(h)) for d, h in zip(matured_groups["date"], matured_groups["headline_id"])}
    ):
        group = policy[(policy["date"].astype(str) == note_day) & (policy["headline_id"] == headline_id)].sort_values(
            "rollout_index"
        )
        keys, labels = [], []
        for r in group.itertuples(index=False):
            value = price.value(r.status, r.vs_spy_pct, r.parse_status, r.side)
            if value is not None:
                keys.append((note_day, headline_id, int(r.rollout_index)))
                labels.append(value)
        if len(keys) >= 2:
            events.append(clipped_event("price", day, f"{note_day}/{headline_id}", keys, labels))
    return events


def local_day(created_at: str, timezone: str) -> str:
    """The day (YYYY-MM-DD, in `timezone`) a feedback was written."""
    when = dt.datetime.fromisoformat(created_at.replace("Z", "+00:00"))
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return when.astimezone(ZoneInfo(timezone)).date().isoformat()


def people_event(
    record: FeedbackRecord, feedback: Sequence[FeedbackRecord], indices: Sequence[int], day: str
) -> Event | None:
    """The event of one feedback: its headline group's ratings as of that feedback (every feedback
    on the group written up to and including it), unrated notes neutral. None without a rating."""
    if human_signal(record.thumbs, record.stars) is None:
        return None
    note_day, headline_id = record.date.isoformat(), record.headline_id
    ratings: dict[int, list[float]] = {}
    for other in feedback:
        if other.date.isoformat() == note_day and other.headline_id == headline_id:
            value = human_signal(other.thumbs, other.stars)
            if value is not None:
                ratings.setdefault(int(other.rollout_index), []).append(value)
        if other.feedback_id == record.feedback_id:
            break
    indices = sorted(set(int(i) for i in indices) | set(ratings))
    keys = [(note_day, headline_id, i) for i in indices]
    labels = [sum(ratings[i]) / len(ratings[i]) if i in ratings else NEUTRAL for i in indices]
    return clipped_event("people", day, f"{note_day}/{headline_id}", keys, labels, event_id=record.feedback_id)


def people_events(
    feedback: Sequence[FeedbackRecord],
    day: str,
    group_indices: Callable[[str, str], Iterable[int]],
    applied: Collection[str] = (),
) -> list[Event]:
    """One event per rated feedback on notes of `day` or earlier not in `applied` (feedback ids), in log order."""
    events = []
    for record in feedback:
        if record.date.isoformat() > day or record.feedback_id in applied:
            continue
        event = people_event(record, feedback, list(group_indices(record.date.isoformat(), record.headline_id)), day)
        if event is not None:
            events.append(event)
    return events


def day_events(
    scores: pd.DataFrame,
    outcomes: pd.DataFrame,
    feedback: Sequence[FeedbackRecord],
    day: str,
    group_indices: Callable[[str, str], Iterable[int]],
    applied_people: Collection[str] = (),
    price: PriceReward | None = None,
) -> list[Event]:
    """Every event of `day`, in the fixed order: judge, price, people (those not applied yet)."""
    return (
        judge_events(scores, day)
        + price_events(outcomes, day, price)
        + people_events(feedback, day, group_indices, applied_people)
    )
