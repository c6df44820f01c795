"""Rewards of the daily loop (docs/daily_rl.md, "How one day works", step 2, and "Credit").

rank reward  r_k = 1 - (k - 1) / (N - 1)        k = the judge's rank of the note in its group of N
note reward  R   = clip(sum_s w_s * signal_s)    the whole-note signals in [0, 1]: `structure` and
                                                  `judge_rank` (r_k), default w = 0.5 / 0.5, clip [0, 1];
                                                  plus `human` where people rated the note and `scorer`
                                                  (the online note scorer; off unless weighted)
relevance    1 if the call is on a company the headline names, else 0 (None: it names none)
price        p   = 1 / (1 + exp(-vs_spy_pct / scale))  the matured call; no_trade / unparseable: set values.
             It is delayed: trained days later, in its own step (docs/daily_rl.md).
advantage    A_part = (x - mean(x)) / (std(x) + eps) within the headline's group, for each part
credit       each part judges a span of the note (`SIGNAL_SPANS`): `note` (R) every token, `relevance` and
             `price` the trade call's line. A token's advantage is
                 A_t = sum over parts of share(part) * A_part * [t in the part's span]
             with share(part) = |w_part| / sum of |w_part| over the parts (w_note = the dense note
             signals' total weight), so the shares are the documented mixture and sum to 1.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from outcome_flywheel.daily_rl.judge.ranking import GroupJudgement

STRUCTURE_WEIGHT = 0.5
# The signals a day's reward can weigh, each in [0, 1]; what each one measures.
REWARD_SIGNALS = {
    "structure": "fraction of the six required sections the note has",
    "judge_rank": "the judge's rank of the note in its group, as r_k = 1 - (k-1)/(N-1)",
    "human": "people's thumbs / stars on the note (feedback.records.human_signal), only where it has feedback",
    "relevance": "1 if the call is on a company the headline names, else 0 (daily_rl.notes.relevance); only where it names one",
    "price": "the matured call's vs_spy_pct net of costs through PriceReward's logistic; trained when it matures",
    "scorer": "the online note scorer's sigmoid(score) of the note, its state as of the note's day (daily_rl.note_scorer); "
    "off unless weighted, only where that state and the note's features exist",
}
# Signals only some notes have. Where one is missing its weight drops out and the rest are
# rescaled to the always-present signals' total weight, so rated and unrated notes share one scale
# and a day without feedback gets exactly the rewards it would have got before.
SPARSE_SIGNALS = ("human", "relevance", "scorer")
# Signals known only days after the note (prices): trained in their own step when they mature.
DELAYED_SIGNALS = ("price",)
# What each signal judges: the whole note, or the trade call's line (`notes.calls.call_spans`).
SIGNAL_SPANS = {
    "structure": "note",
    "judge_rank": "note",
    "human": "note",
    "scorer": "note",
    "relevance": "call",
    "price": "call",
}
# The parts of a reward, each with its own group-normalised advantage: the whole-note signals summed
# into R (same span, same time), and each call-line signal on its own (one immediate, one delayed).
PARTS = ("note", "relevance", "price")
HUMAN_WEIGHT = 0.5
# Relevance 1.0 (was 0.5) with the counterfactual side term on: the ablation's winner on tiny-local (issue 46,
# docs/daily_rl.md "The ablation"); it keeps calls on the headline's company while price moves their side.
RELEVANCE_WEIGHT = 1.0
PRICE_WEIGHT = 1.0  # the note part (structure + judge_rank) weighs 1.0: each part carries a third of the credit


def rank_reward(rank: int, n: int) -> float:
    """1 for the best of N, 0 for the worst, linear between; a group of one gets 1."""
    if n < 1 or not 1 <= rank <= n:
        raise ValueError(f"rank {rank} is not in 1..{n}")
    if n == 1:
        return 1.0
    return 1.0 - (rank - 1) / (n - 1)


@dataclass(frozen=True)
class RewardConfig:
    """How a note's reward is made from its named signals: a weighted sum, clipped to a range."""

    weights: Mapping[str, float] = field(
        default_factory=lambda: {
            "structure": STRUCTURE_WEIGHT,
            "judge_rank": 1.0 - STRUCTURE_WEIGHT,
            "human": HUMAN_WEIGHT,
            "relevance": RELEVANCE_WEIGHT,
            "price": PRICE_WEIGHT,
        },
        metadata={"help": f"Weight of each named signal ({', '.join(REWARD_SIGNALS)}); a signal left out weighs 0."},
    )
    clip_min: float = field(default=0.0, metadata={"help": "The reward is clipped to [clip_min, clip_max]."})
    clip_max: float = field(default=1.0, metadata={"help": "Upper end of the reward's range."})

    def __post_init__(self):
        unknown = sorted(set(self.weights) - set(REWARD_SIGNALS))
        if unknown:
            raise ValueError(f"unknown reward signal(s) {unknown}: known are {sorted(REWARD_SIGNALS)}")
        if not all(math.isfinite(float(w)) for w in self.weights.values()):
            raise ValueError(f"reward weights must be finite numbers, got {dict(self.weights)}")
        if not any(float(w) != 0.0 for w in self.weights.values()):
            raise ValueError("at least one reward weight must be non-zero")
        if not (math.isfinite(self.clip_min) and math.isfinite(self.clip_max) and self.clip_min < self.clip_max):
            raise ValueError(
                f"reward clip must be finite with clip_min < clip_max, got [{self.clip_min}, {self.clip_max}]"
            )

    def weighs(self, signal: str) -> bool:
        """Whether `signal` has a non-zero weight (an unweighted signal is neither read nor computed)."""
        return float(self.weights.get(signal, 0.0)) != 0.0

    def part_weights(self) -> dict[str, float]:
        """|weight| of each part: `note` = the note signals' (the dense ones', else the sparse ones'),
        `relevance` and `price` their own."""
        note = [k for k in self.weights if SIGNAL_SPANS[k] == "note"]
        dense = sum(abs(float(self.weights[k])) for k in note if k not in SPARSE_SIGNALS)
        return {
            "note": dense or sum(abs(float(self.weights[k])) for k in note),
            "relevance": abs(float(self.weights.get("relevance", 0.0))),
            "price": abs(float(self.weights.get("price", 0.0))),
        }

    def share(self, part: str) -> float:
        """The part's share of the credit (`note`, `relevance` or `price`): its weight over all parts'. Each
        part's group-normalised advantage is multiplied by it on the tokens of its span."""
        if part not in PARTS:
            raise ValueError(f"unknown reward part {part!r}: known are {PARTS}")
        weights = self.part_weights()
        total = sum(weights.values())
        return weights[part] / total if total else 0.0

    def combine(self, signals: Mapping[str, float | None]) -> float:
        """The note reward R = clip(sum of weight * signal) over the weighted whole-note signals (each in
        [0, 1]; every dense one must be given; the call-line signals, `relevance` and `price`, are their
        own parts). A sparse signal (`human`, `scorer`) that is missing or None drops out and the given
        ones are rescaled: R = clip(sum_given w x / sum_given w * sum_dense w). `scorer` weighs 0 unless
        `weights` names it (left out of the defaults)."""
        total, given_weight, dense_weight = 0.0, 0.0, 0.0
        for name, weight in self.weights.items():
            if SIGNAL_SPANS[name] != "note":
                continue
            sparse = name in SPARSE_SIGNALS
            dense_weight += 0.0 if sparse else float(weight)
            value = signals.get(name)
            if value is None:
                if sparse:
                    continue
                raise ValueError(f"reward signal {name!r} is weighted but was not given")
            value = float(value)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} signal {value} is outside [0, 1]")
            total += float(weight) * value
            given_weight += float(weight)
        if given_weight and given_weight != dense_weight:
            total = total / given_weight * dense_weight
        return min(max(total, self.clip_min), self.clip_max)

    def describe(self) -> dict[str, str]:
        """What each scored row records about how its reward was made."""
        return {
            "reward_weights": json.dumps({k: float(v) for k, v in sorted(self.weights.items())}),
            "reward_clip": json.dumps([self.clip_min, self.clip_max]),
        }


@dataclass(frozen=True)
class PriceReward:
    """The `price` signal of one note, in [0, 1], from its `rollout_outcomes` status and vs_spy_pct."""

    scale_pct: float = field(
        default=1.0, metadata={"help": "Logistic scale in percentage points: vs_spy_pct = +scale -> 0.73."}
    )
    no_trade: float = field(
        default=0.45,
        metadata={"help": "A note that recommends no trade: below a costless coin flip (0.5), far above 0."},
    )
    unparseable: float = field(
        default=0.25,
        metadata={"help": "A note with no usable call (no side, no symbol, unknown symbol, ambiguous, empty)."},
    )

    def __post_init__(self):
        if not (math.isfinite(self.scale_pct) and self.scale_pct > 0):
            raise ValueError(f"price_scale_pct must be a finite number > 0, got {self.scale_pct}")
        for name in ("no_trade", "unparseable"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0.0 <= value <= 1.0):
                raise ValueError(f"price_{name} must be in [0, 1], got {value}")

    def value(
        self, status: str, vs_spy_pct: float | None, parse_status: str | None = None, side: str | None = None
    ) -> float | None:
        """The signal, or None when the note may not train on price (pending: wait; no_data: never)."""
        if status == "matured":
            x = float(vs_spy_pct)
            if not math.isfinite(x):
                raise ValueError(f"a matured call has vs_spy_pct {vs_spy_pct}")
            return 1.0 / (1.0 + math.exp(-x / self.scale_pct)) if abs(x / self.scale_pct) < 700 else float(x > 0)
        if status == "no_call":
            return self.no_trade if parse_status == "no_trade" else self.unparseable
        if status in ("pending", "no_data"):
            return None
        raise ValueError(f"unknown outcome status {status!r}")

    def other_side(self, value: float, cost_bps: float) -> float:
        """The signal the opposite call would have earned, from a matured call's `value`: the other side's
        excess return is known once the call has matured, vs_spy(other) = -vs_spy - 2 cost (each side pays
        the round trip), and vs_spy is the value's logit x scale (0 and 1, beyond float's reach, give 1 - value)."""
        v = float(value)
        if not 0.0 < v < 1.0:
            return 1.0 - v
        x = self.scale_pct * math.log(v / (1.0 - v))
        return self.value("matured", -x - 2.0 * float(cost_bps) / 100.0)


def mixed_reward(structure: float, outcome: float, structure_weight: float = STRUCTURE_WEIGHT) -> float:
    """R = w * structure + (1 - w) * judge rank reward (the default `RewardConfig`)."""
    config = RewardConfig(weights={"structure": structure_weight, "judge_rank": 1.0 - structure_weight})
    return config.combine({"structure": structure, "judge_rank": outcome})


def group_advantages(rewards: Sequence[float], eps: float = 1e-4) -> np.ndarray:
    """Group-normalised advantages: zero mean, unit (population) std; all zeros for equal rewards."""
    r = np.asarray(rewards, dtype=np.float64)
    if r.size == 0:
        return r
    std = r.std()
    if std < 1e-8:
        return np.zeros_like(r)
    return (r - r.mean()) / (std + eps)


def loo_advantages(rewards: Sequence[float], scale: float = 2.0) -> np.ndarray:
    """Leave-one-out advantages (RLOO, Ahmadian et al. 2024): scale * (r_i - mean of the others), no
    std (Dr. GRPO); zeros for a group of one. With rewards in [0, 1] and scale 2, in units of half the range."""
    r = np.asarray(rewards, dtype=np.float64)
    n = r.size
    if n < 2:
        return np.zeros_like(r)
    return scale * (r - (r.sum() - r) / (n - 1))


def token_advantages(n_tokens: int, parts: Sequence[tuple[float, float, Sequence[bool] | None]]) -> list[float]:
    """A_t = sum over parts of share * advantage * [t in span] for a response of `n_tokens` tokens;
    `parts`: (share, group-normalised advantage, span mask or None for the whole note)."""
    out = np.zeros(int(n_tokens), dtype=np.float64)
    for share, advantage, span in parts:
        if span is None:
            out += share * advantage
        else:
            if len(span) != n_tokens:
                raise ValueError(f"a span mask of {len(span)} tokens for a response of {n_tokens}")
            out += share * advantage * np.asarray(span, dtype=np.float64)
    return [float(a) for a in out]


def rank_rewards(judgement: GroupJudgement, reward_of_rank: Callable[[int, int], float]) -> list[float]:
    """Each candidate's rank reward. Candidates the judge never placed (it failed a round) share
    one reward, the mean of the rank rewards left over, so their index order carries none."""
    n = len(judgement.ranks)
    placed = set(judgement.picks)
    left_over = [reward_of_rank(rank, n) for rank in range(len(placed) + 1, n + 1)]
    shared = sum(left_over) / len(left_over) if left_over else 0.0
    return [reward_of_rank(rank, n) if k in placed else shared for k, rank in enumerate(judgement.ranks)]
