"""Rewards of the daily loop (docs/daily_rl.md, "How one day works", step 2).

rank reward  r_k = 1 - (k - 1) / (N - 1)        k = the judge's rank of the note in its group of N
reward       R   = clip(sum_s w_s * signal_s)    named signals in [0, 1]: `structure` and `judge_rank`
                                                  (r_k), default w = 0.5 / 0.5, clip [0, 1]; plus
                                                  `human` where people rated the note (below)
advantage    A_i = (R_i - mean(R)) / (std(R) + eps) within the headline's group (GRPO/GSPO style)
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

STRUCTURE_WEIGHT = 0.5
# The signals a day's reward can weigh, each in [0, 1]; what each one measures.
REWARD_SIGNALS = {
    "structure": "fraction of the six required sections the note has",
    "judge_rank": "the judge's rank of the note in its group, as r_k = 1 - (k-1)/(N-1)",
    "human": "people's thumbs / stars on the note (feedback.records.human_signal), only where it has feedback",
}
# Signals only some notes have. Where one is missing its weight drops out and the rest are
# rescaled to the always-present signals' total weight, so rated and unrated notes share one scale
# and a day without feedback gets exactly the rewards it would have got before.
SPARSE_SIGNALS = ("human",)
HUMAN_WEIGHT = 0.5


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
        default_factory=lambda: {"structure": STRUCTURE_WEIGHT, "judge_rank": 1.0 - STRUCTURE_WEIGHT, "human": HUMAN_WEIGHT},
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
            raise ValueError(f"reward clip must be finite with clip_min < clip_max, got [{self.clip_min}, {self.clip_max}]")

    def combine(self, signals: Mapping[str, float | None]) -> float:
        """R = clip(sum of weight * signal) over the weighted signals (each in [0, 1]; every dense
        signal must be given). A sparse signal (`human`) that is missing or None drops out and the
        given ones are rescaled: R = clip(sum_given w x / sum_given w * sum_dense w)."""
        total, given_weight, dense_weight = 0.0, 0.0, 0.0
        for name, weight in self.weights.items():
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
