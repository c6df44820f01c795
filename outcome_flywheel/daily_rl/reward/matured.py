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

Pooled evidence (`replay_days`): a day's few new price groups (~6-7 on the bundled archive) are too few
to estimate a side from, and trained once they swing the side from day to day. So a group trained on
price at day d trains again at each later day D up to d + `replay_days`, its advantage decayed by
`replay_decay ** (D - d)`, while it stays within the staleness limit (and under the loss's truncated IS
weight against the current policy): the side is fitted to a window of evidence, like a running
regression, not to one day's. Replays are ledger rows of step `replay` (they settle nothing). A day the
gate rejected kept its parent's weights: its price rows settle nothing and its groups go back to
pending, so the next day trains them anew.

Advantage (`price_baseline`): `loo` (default), A_i = 2 (p_i - mean_{j != i} p_j), the leave-one-out
baseline (RLOO, Ahmadian et al. 2024) in units of the signal's half-range and, as Dr. GRPO (Liu et al.
2025), no per-group std: a group whose spread is only other tickers' noise keeps its small advantages
instead of being scaled up to full size; `group_std` = (p - mean) / std, GRPO's; `other_side` = p_i - p_i(other
side) on calls on the headline's company, 0 elsewhere (`counterfactual.other_side_advantages`): the side judged
against its own other side only, not against the notes that made no call.

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
from outcome_flywheel.daily_rl.reward.signals import PriceReward, group_advantages, loo_advantages
from outcome_flywheel.trading_sessions import nyse_calendar

DEFAULT_MAX_STALENESS = 4
PRICE_BASELINES = ("loo", "group_std", "other_side")
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
    baseline: str = field(
        default="loo",
        metadata={
            "help": "The price advantage: `loo` = 2 (p_i - mean of the others), no std (RLOO, Dr. GRPO); `group_std` = (p - mean) / std (GRPO); `other_side` = p_i - p_i(other side) on calls on the headline's company, 0 elsewhere (the side against its own known other side)."
        },
    )
    replay_days: int = field(
        default=4,
        metadata={
            "help": "Days a price group trained at d trains again (d+1 .. d+N), within the staleness limit; 0 = once (on a 2 x 2 grid of 16 days on tiny-local, 0 took side accuracy on company calls from 0.85 / 0.89 to 0.58 / 0.65: docs/daily_rl.md, the ablation)."
        },
    )
    replay_decay: float = field(
        default=0.7, metadata={"help": "A replayed group's advantage is multiplied by decay ** (days since d)."}
    )
    span: str = field(
        default="side", metadata={"help": "Tokens the price trains: side, ticker or call (credit.CreditConfig)."}
    )
    counterfactual_c: float = field(
        default=1.0,
        metadata={
            "help": "c of the counterfactual side term -c sum_a pi(a) (R(a) - R_bar) over a matured call's two sides, calls on the headline's company only (reward/counterfactual.py); 0 = off. 1 (one epoch, `relevance` weighted 1.0) is the default: the ablation's winner on tiny-local (issue 46; docs/daily_rl.md, the ablation)."
        },
    )

    def __post_init__(self):
        if self.baseline not in PRICE_BASELINES:
            raise ValueError(f"price_baseline must be one of {', '.join(PRICE_BASELINES)}, got {self.baseline!r}")
        if isinstance(self.replay_days, bool) or int(self.replay_days) != self.replay_days or self.replay_days < 0:
            raise ValueError(f"price_replay_days must be a whole number >= 0, got {self.replay_days!r}")
        if not (isinstance(self.counterfactual_c, (int, float)) and 0.0 <= float(self.counterfactual_c) < float("inf")):
            raise ValueError(f"price_counterfactual_c must be a finite number >= 0, got {self.counterfactual_c!r}")
        if not (isinstance(self.replay_decay, (int, float)) and 0.0 <= float(self.replay_decay) <= 1.0):
            raise ValueError(f"price_replay_decay must be in [0, 1], got {self.replay_decay!r}")
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
    replayed_groups: int = 0
    window: tuple[str, str] | None = None


def price_advantages(values, config: MaturedConfig, rows) -> np.ndarray:
    """The group's price advantages under `config.baseline` (`rows`: the group's rollout rows, in order)."""
    if config.baseline == "other_side":
        from outcome_flywheel.daily_rl.reward.counterfactual import other_side_advantages

        return other_side_advantages(rows, values, config.price, config.cost_bps)
    return loo_advantages(values) if config.baseline == "loo" else group_advantages(values)


def _example(r, adv: float, value: float, tokenizer, config: MaturedConfig, weight: float = 1.0):
    """A price example of rollout row `r`: the advantage on the call's `config.span` (every token without a
    tokenizer), and its counterfactual side term (x the replay `weight`) where it has one; None when it would
    carry no gradient (no call line to credit, or no tokens)."""
    from outcome_flywheel.daily_rl.reward.counterfactual import side_counterfactual
    from outcome_flywheel.daily_rl.reward.credit import call_token_mask, price_token_advantages
    from outcome_flywheel.models.train.gspo_config import GSPOExample

    if not len(r.response_ids):
        return None
    ids = [int(t) for t in r.response_ids]
    headline = (getattr(r, "title", None), getattr(r, "summary", None))
    c = float(config.counterfactual_c) * weight
    counterfactual = (
        side_counterfactual(tokenizer, ids, r.response, headline, value, config.price, config.cost_bps, c)
        if c and tokenizer is not None
        else None
    )
    if abs(adv) <= 1e-8 and counterfactual is None:
        return None
    mask = call_token_mask(tokenizer, ids, r.response, config.span) if tokenizer is not None else [True] * len(ids)
    if mask is None and counterfactual is None:  # no side to credit (no call line, no side phrase, no round trip)
        return None
    return GSPOExample(
        prompt=json.loads(r.prompt),
        response_ids=ids,
        behavior_logprobs=[float(x) for x in r.behavior_logprobs],
        advantage=0.0,
        token_advantages=price_token_advantages(len(ids), float(adv), mask),
        token_part="price",
        counterfactual=counterfactual,
        name_mask=call_token_mask(tokenizer, ids, r.response, "ticker") if tokenizer is not None else None,
    )


def _staleness_reason(stale: int, group: pd.DataFrame, config: MaturedConfig, temperature: float | None) -> str | None:
    if stale > config.max_staleness:
        return (
            f"stale: {stale} policy updates since the notes were sampled > price_max_staleness {config.max_staleness}"
        )
    if temperature is not None and float(group["temperature"].iloc[0]) != float(temperature):
        return f"sampled at temperature {group['temperature'].iloc[0]}, today's update trains at {temperature}"
    return None


def _base_row(day, note_day, headline_id, step, parent_version, behavior, stale) -> dict:
    return dict(
        date=day,
        note_date=note_day,
        headline_id=headline_id,
        step=step,
        signals="price",
        policy_version=parent_version,
        behavior_policy_version=behavior,
        staleness_updates=stale,
        staleness_days=(date.fromisoformat(day) - date.fromisoformat(note_day)).days,
        is_ratio=np.nan,
    )


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
    replays: pd.DataFrame | None = None,
) -> MaturedBatch:
    """Ledger rows and GSPO examples of the unsettled `notes` (rollout rows of earlier days) given their
    `outcomes` (same rows, in order: `outcome_rows` of their calls). `advantage_scale`: the price part's
    share of the credit (`RewardConfig.share("price")`). With the policy's `tokenizer` the advantage
    sits on the call's `config.span` only (`credit.py`); without it, on every token. `replays`: rollout
    rows of groups trained on price at an earlier day d (columns `trained_on`, `signal_value`), trained
    again with weight `replay_decay ** (day - d)` (`replay_batch`)."""
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
        base = _base_row(day, note_day, headline_id, "matured", parent_version, behavior, stale)
        reason = _staleness_reason(stale, group, config, temperature)
        usable = group[group["o_status"] != "no_data"]
        values = [config.price.value(s, v, p) for s, v, p in zip(usable["o_status"], usable["o_vs"], usable["o_parse"])]
        advantages = (
            price_advantages(values, config, usable) * advantage_scale
            if reason is None and len(values)
            else np.zeros(len(values))
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
        _add_group(batch, base, usable, values, advantages, reason, None, tokenizer, config)
    if replays is not None and len(replays):
        replay_batch(batch, replays, day, parent_version, checkpoints, config, advantage_scale, temperature, tokenizer)
    return batch


def replay_batch(
    batch: MaturedBatch,
    replays: pd.DataFrame,
    day: str,
    parent_version: str | None,
    checkpoints: dict[str, str],
    config: MaturedConfig,
    advantage_scale: float,
    temperature: float | None,
    tokenizer=None,
) -> None:
    """Add the pooled groups to `batch`: each group first trained at `trained_on` = d trains again with its
    stored price signals, advantage x `replay_decay ** (day - d)`, unless it is now too stale."""
    for (note_day, headline_id, trained_on), group in replays.groupby(["date", "headline_id", "trained_on"], sort=True):
        behavior = str(group["policy_version"].iloc[0])
        stale = staleness_updates(note_day, behavior, checkpoints, day)
        base = _base_row(day, note_day, headline_id, "replay", parent_version, behavior, stale)
        reason = _staleness_reason(stale, group, config, temperature)
        age = (date.fromisoformat(day) - date.fromisoformat(trained_on)).days
        weight = float(config.replay_decay) ** age
        values = group["signal_value"].to_numpy(dtype=float)
        advantages = price_advantages(values, config, group) * advantage_scale * weight
        batch.replayed_groups += int(reason is None)
        why = f"replay of {trained_on}'s price group, weight {weight:.3g}"
        _add_group(batch, base, group, values, advantages, reason, why, tokenizer, config, weight)


def _add_group(
    batch: MaturedBatch, base: dict, rows, values, advantages, dropped: str | None, why, tokenizer, config, weight=1.0
):
    """One ledger row per note of a group (`rows`: its rollout rows, in order of `values` and `advantages`):
    dropped with the reason `dropped`, else trained (with `why` as its reason) and, where it carries a
    gradient, a price example (a replayed group's: its counterfactual term x `weight`)."""
    for r, value, adv in zip(rows.itertuples(), values, advantages):
        batch.ledger.append(
            {
                **base,
                "rollout_index": int(r.rollout_index),
                "status": "dropped" if dropped else "trained",
                "reason": dropped or why,
                "signal_value": float(value),
                "advantage": np.nan if dropped else float(adv),
            }
        )
        example = None if dropped else _example(r, float(adv), float(value), tokenizer, config, weight)
        if example is not None:
            batch.examples.append(example)
            batch.example_keys.append((base["note_date"], base["headline_id"], int(r.rollout_index)))


def replay_groups(earlier: pd.DataFrame | None, day: str, config: MaturedConfig) -> pd.DataFrame:
    """The (note_date, headline_id, rollout_index, trained_on, signal_value) of the notes first trained on
    price within `replay_days` before `day` (`earlier`: those days' ledgers, rejected days left out)."""
    columns = ["note_date", "headline_id", "rollout_index", "trained_on", "signal_value"]
    if earlier is None or earlier.empty or not config.replay_days or not config.replay_decay:
        return pd.DataFrame(columns=columns)
    first = (date.fromisoformat(day) - timedelta(days=int(config.replay_days))).isoformat()
    rows = earlier[
        (earlier["step"] == "matured")
        & (earlier["status"] == "trained")
        & (earlier["date"].astype(str) >= first)
        & (earlier["date"].astype(str) < day)
    ]
    out = rows.rename(columns={"date": "trained_on"})[columns].copy()
    out["trained_on"] = out["trained_on"].astype(str)
    out["note_date"] = out["note_date"].astype(str)
    out["rollout_index"] = out["rollout_index"].astype(int)
    return out.reset_index(drop=True)


def matured_days(day: str, config: MaturedConfig) -> tuple[list[str], list[str]]:
    """(the days whose ledgers a day reads, oldest first, up to D-1; the window of days whose notes can
    mature by D). A replayed note is at most `wait` days older than its first training."""
    wait = longest_wait_days(config.horizon)
    span = wait + int(config.replay_days)
    first = date.fromisoformat(day) - timedelta(days=span)
    days = [(first + timedelta(days=k)).isoformat() for k in range(span)]  # first .. D-1
    return days, days[-wait:]


def note_days(earlier: pd.DataFrame | None, day: str, config: MaturedConfig) -> list[str]:
    """The days whose rollouts the delayed step reads: the window's (.. D-2) and the replayed notes' days."""
    _, window = matured_days(day, config)
    return sorted(set(window[:-1]) | set(replay_groups(earlier, day, config)["note_date"]))


def collect_matured(
    earlier: pd.DataFrame | None,
    rollouts: pd.DataFrame | None,
    market_data,
    versions: dict[str, str],
    day: str,
    parent_version: str | None,
    config: MaturedConfig,
    advantage_scale: float,
    temperature: float | None,
    wall_clock: pd.Timestamp | None = None,
    tokenizer=None,
) -> MaturedBatch:
    """Price the unsettled notes of the window as of D and build the batch. `earlier`: the ledgers of
    `matured_days` (the days the gate rejected left out: their price rows settle nothing, so their groups
    are pending again); `rollouts`: the notes of `note_days`; `versions`: day -> its checkpoint's policy
    version (days without one absent). Days never run (first days, gaps) are simply absent."""
    days, window = matured_days(day, config)
    settled = settled_notes(earlier, "matured")
    replay_keys = replay_groups(earlier, day, config)
    batch = MaturedBatch(window=(window[0], window[-1]))
    if rollouts is None or rollouts.empty or market_data is None:
        return batch
    rollouts = rollouts.copy()
    rollouts["date"] = rollouts["date"].astype(str)
    checkpoints = {d: versions[d] for d in days if d in versions}
    replays = rollouts.merge(
        replay_keys.rename(columns={"note_date": "date"}), on=["date", "headline_id", "rollout_index"], how="inner"
    )
    notes = rollouts[rollouts["date"].isin(window[:-1])]
    keys = zip(notes["date"], notes["headline_id"].astype(str), notes["rollout_index"].astype(int))
    notes = notes[[k not in settled for k in keys]].reset_index(drop=True)
    if notes.empty:
        outcomes = pd.DataFrame(columns=["status", "vs_spy_pct", "parse_status", "reason"])
    else:
        calls = calls_frame(notes[["date", "headline_id", "rollout_index", "response"]], market_data.universe())
        cutoff = knowledge_cutoff(day, wall_clock)
        symbols = sorted({s for s in calls["symbol"].dropna()} | {BENCHMARK})
        start, end = price_range(sorted(set(notes["date"])), config.horizon)
        table, _ = market_data.price_table(symbols, start, end, cutoff)
        outcomes = outcome_rows(calls.drop(columns=["response"]), table, cutoff, config.horizon, config.cost_bps)
    result = matured_batch(
        notes, outcomes, day, parent_version, checkpoints, config, advantage_scale, temperature, tokenizer, replays
    )
    result.window = batch.window
    return result
