"""The delayed step of a day: earlier days' notes whose price outcome has matured, as GSPO examples.

A note of day E enters at the close of the first XNYS session after E and exits h sessions later
(`notes.outcomes.call_window`), so its `price` signal is known at the run of the first day D >= the exit
session (a Friday's notes, h = 1: Tuesday). `daily_update`(D) trains them beside D-1's judged notes:

- which notes: those of the days D-W .. D-2 (W = `longest_wait_days(h)`, the self-dependency's
  window) that no earlier day's ledger has settled on `price` (`ledger.settled_notes`);
- their outcome as of the end of day D in New York (`knowledge_cutoff`), with the prices the market
  data has, computed exactly as `rollout_outcomes` does (`calls_frame` + `outcome_rows`), so a re-run
  of D sees the same maturity whenever it runs;
- per headline group: any `pending` note -> the group waits (no ledger row); `no_data` notes are
  dropped (never train on price); a group staler than `max_staleness` policy updates is dropped;
  the rest get the price signal (`signals.PriceReward`), a group-normalised advantage times the price
  part's share of the credit (`RewardConfig.share`), on the tokens of the call's line (`credit.py`), and
  train with their stored behaviour log-probs (the loss weights them by the truncated IS ratio,
  `gspo_config.tis_cap`).

Staleness rule, named: *policy updates since sampling*, as NeMo-RL's trajectory age and TRL's
`max_staleness` count versions, not days: the number of times the checkpoint weights changed between
the checkpoint that sampled the note and D's parent (a day the gate rejected, or that trained
nothing, keeps the weights and does not count).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import date, timedelta
from functools import lru_cache
from typing import Callable

import numpy as np
import pandas as pd

from outcome_flywheel.daily_rl.notes.calls import calls_frame
from outcome_flywheel.daily_rl.notes.outcomes import (
    BENCHMARK,
    DEFAULT_COST_BPS,
    DEFAULT_HORIZON,
    outcome_rows,
    price_range,
)
from outcome_flywheel.daily_rl.reward.ledger import settled_notes
from outcome_flywheel.daily_rl.reward.signals import PriceReward, group_advantages
from outcome_flywheel.trading_sessions import nyse_calendar

DEFAULT_MAX_STALENESS = 4
NEW_YORK = "America/New_York"


@dataclass(frozen=True)
class MaturedConfig:
    """How the delayed step picks and rewards matured notes."""

    price: PriceReward = field(
        default_factory=PriceReward, metadata={"help": "The price signal's transform and values."}
    )
    max_staleness: int = field(
        default=DEFAULT_MAX_STALENESS,
        metadata={
            "help": (
                "Most policy updates between the note's sampler and D's parent; staler groups are dropped (reason recorded)."
            )
        },
    )
    horizon: int = field(
        default=DEFAULT_HORIZON, metadata={"help": "Sessions between entry and exit (FLYWHEEL_OUTCOME_HORIZON)."}
    )
    cost_bps: float = field(default=DEFAULT_COST_BPS, metadata={"help": "Round-trip cost (FLYWHEEL_OUTCOME_COST_BPS)."})

    def __post_init__(self):
        if (
            isinstance(self.max_staleness, bool)
            or int(self.max_staleness) != self.max_staleness
            or self.max_staleness < 0
        ):
            raise ValueError(f"price_max_staleness must be a whole number >= 0, got {self.max_staleness!r}")


@lru_cache(maxsize=8)
def longest_wait_days(horizon: int = DEFAULT_HORIZON) -> int:
    """The most calendar days from a note's day E to its exit session over the XNYS calendar: for the
    days after session S[i-1] up to S[i], entry is S[i] and exit S[i+h], so the wait is at most
    S[i+h] - S[i-1] (6 days for h = 1: the 2012 hurricane closure)."""
    sessions = nyse_calendar().sessions
    gaps = sessions[horizon + 1 :] - sessions[: len(sessions) - horizon - 1]
    return int(gaps.days.max())


def knowledge_cutoff(day: str, wall_clock: pd.Timestamp | None = None) -> pd.Timestamp:
    """What the run of D may know: every close up to the end of day D in New York (the run starts the
    next morning), or less if it runs earlier than that."""
    end = pd.Timestamp(date.fromisoformat(day) + timedelta(days=1), tz=NEW_YORK).tz_convert("UTC")
    now = pd.Timestamp.now(tz="UTC") if wall_clock is None else pd.Timestamp(wall_clock)
    return min(end, now)


def _digest(version: str | None) -> str:
    return str(version).split("@", 1)[-1]


def staleness_updates(note_day: str, behavior_version: str, checkpoints: dict[str, str], day: str) -> int:
    """Policy updates between the note's sampler and the parent of `day`: changes of weights along
    the checkpoints dated after the note's day and before `day` (`checkpoints`: date -> policy_version)."""
    current, updates = _digest(behavior_version), 0
    for d in sorted(k for k in checkpoints if note_day < k < day):
        if _digest(checkpoints[d]) != current:
            updates, current = updates + 1, _digest(checkpoints[d])
    return updates


@dataclass
class MaturedBatch:
    """What the delayed step hands the trainer and the ledger."""

    examples: list = field(default_factory=list)  # GSPOExample, in order
    example_keys: list[tuple[str, str, int]] = field(default_factory=list)  # (note_date, headline_id, rollout_index)
    ledger: list[dict] = field(default_factory=list)  # ledger rows without is_ratio yet
    waiting_notes: int = 0
    no_data_notes: int = 0
    window: tuple[str, str] | None = None


def matured_batch(
    notes: pd.DataFrame,
    outcomes: pd.DataFrame,
    day: str,
    parent_version: str | None,
    checkpoints: dict[str, str],
    config: MaturedConfig,
    advantage_scale: float,
    temperature: float | None,
    tokenizer=None,
) -> MaturedBatch:
    """Ledger rows and GSPO examples of the unsettled `notes` (rollout rows of earlier days) given their
    `outcomes` (same rows, in order: `outcome_rows` of their calls). `advantage_scale`: the price part's
    share of the credit (`RewardConfig.share("price")`). With the policy's `tokenizer` the advantage
    sits on the call's line only (`credit.py`); without it, on every token."""
    from outcome_flywheel.daily_rl.reward.credit import call_token_mask, price_token_advantages
    from outcome_flywheel.models.train.gspo_config import GSPOExample

    batch = MaturedBatch()
    frame = notes.reset_index(drop=True).assign(
        o_status=outcomes["status"].to_numpy(),
        o_vs=outcomes["vs_spy_pct"].to_numpy(),
        o_parse=outcomes["parse_status"].to_numpy(),
        o_why=outcomes["reason"].to_numpy(),
    )
    for (note_day, headline_id), group in frame.groupby(["date", "headline_id"], sort=True):
        if (group["o_status"] == "pending").any():
            batch.waiting_notes += len(group)
            continue
        behavior = str(group["policy_version"].iloc[0])
        stale = staleness_updates(note_day, behavior, checkpoints, day)
        base = dict(
            date=day,
            note_date=note_day,
            headline_id=headline_id,
            step="matured",
            signals="price",
            policy_version=parent_version,
            behavior_policy_version=behavior,
            staleness_updates=stale,
            staleness_days=(date.fromisoformat(day) - date.fromisoformat(note_day)).days,
            is_ratio=np.nan,
        )
        reason = None
        if stale > config.max_staleness:
            reason = f"stale: {stale} policy updates since the notes were sampled > price_max_staleness {config.max_staleness}"
        elif temperature is not None and float(group["temperature"].iloc[0]) != float(temperature):
            reason = f"sampled at temperature {group['temperature'].iloc[0]}, today's update trains at {temperature}"
        usable = group[group["o_status"] != "no_data"]
        values = [config.price.value(s, v, p) for s, v, p in zip(usable["o_status"], usable["o_vs"], usable["o_parse"])]
        advantages = (
            group_advantages(values) * advantage_scale if reason is None and len(values) else np.zeros(len(values))
        )
        for r in group[group["o_status"] == "no_data"].itertuples():
            batch.no_data_notes += 1
            batch.ledger.append(
                {
                    **base,
                    "rollout_index": int(r.rollout_index),
                    "status": "dropped",
                    "reason": f"no_data: {r.o_why}",
                    "signal_value": np.nan,
                    "advantage": np.nan,
                }
            )
        for r, value, adv in zip(usable.itertuples(), values, advantages):
            batch.ledger.append(
                {
                    **base,
                    "rollout_index": int(r.rollout_index),
                    "status": "dropped" if reason else "trained",
                    "reason": reason,
                    "signal_value": value,
                    "advantage": np.nan if reason else float(adv),
                }
            )
            if reason is None and abs(adv) > 1e-8 and len(r.response_ids):
                ids = [int(t) for t in r.response_ids]
                span = call_token_mask(tokenizer, ids, r.response) if tokenizer is not None else None
                batch.examples.append(
                    GSPOExample(
                        prompt=json.loads(r.prompt),
                        response_ids=ids,
                        behavior_logprobs=[float(x) for x in r.behavior_logprobs],
                        advantage=0.0,
                        token_advantages=price_token_advantages(len(ids), float(adv), span),
                    )
                )
                batch.example_keys.append((note_day, headline_id, int(r.rollout_index)))
    return batch


def collect_matured(
    warehouse,
    market_data,
    policy_version_of: Callable[[str], str | None],
    day: str,
    parent_version: str | None,
    config: MaturedConfig,
    advantage_scale: float,
    temperature: float | None,
    wall_clock: pd.Timestamp | None = None,
    tokenizer=None,
) -> MaturedBatch:
    """Read the window's notes and earlier ledgers, price the unsettled notes as of D, build the batch.
    Days of the window that were never run (first days, gaps) are simply absent. `policy_version_of(d)`:
    the version of day d's checkpoint, None where there is none."""
    wait = longest_wait_days(config.horizon)
    first = (date.fromisoformat(day) - timedelta(days=wait)).isoformat()
    days = [(date.fromisoformat(first) + timedelta(days=k)).isoformat() for k in range(wait)]  # first .. D-1
    earlier = [warehouse.read("reward_ledger", d) for d in days if warehouse.exists("reward_ledger", d)]
    settled = settled_notes(pd.concat(earlier, ignore_index=True) if earlier else None, "matured")
    frames = [warehouse.read("rollouts", d) for d in days[:-1] if warehouse.exists("rollouts", d)]  # .. D-2
    frames = [f for f in frames if len(f)]
    batch = MaturedBatch(window=(first, days[-1]))
    if not frames or market_data is None:
        return batch
    notes = pd.concat(frames, ignore_index=True)
    keys = zip(notes["date"].astype(str), notes["headline_id"].astype(str), notes["rollout_index"].astype(int))
    notes = notes[[k not in settled for k in keys]].reset_index(drop=True)
    if notes.empty:
        return batch
    calls = calls_frame(notes[["date", "headline_id", "rollout_index", "response"]], market_data.universe())
    cutoff = knowledge_cutoff(day, wall_clock)
    symbols = sorted({s for s in calls["symbol"].dropna()} | {BENCHMARK})
    start, end = price_range(sorted(set(notes["date"])), config.horizon)
    table, _ = market_data.price_table(symbols, start, end, cutoff)
    outcomes = outcome_rows(calls.drop(columns=["response"]), table, cutoff, config.horizon, config.cost_bps)
    checkpoints = {d: v for d in days if (v := policy_version_of(d)) is not None}
    result = matured_batch(
        notes, outcomes, day, parent_version, checkpoints, config, advantage_scale, temperature, tokenizer
    )
    result.window = batch.window
    return result
