"""Rewards of the daily loop (docs/daily_rl.md, "How one day works", step 2).

rank reward  r_k = 1 - (k - 1) / (N - 1)       k = the judge's rank of the note in its group of N
reward       R   = 0.5 * structure + 0.5 * r_k  both halves in [0, 1], so R is in [0, 1]
advantage    A_i = (R_i - mean(R)) / (std(R) + eps) within the headline's group (GRPO/GSPO style)
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

STRUCTURE_WEIGHT = 0.5


def rank_reward(rank: int, n: int) -> float:
    """1 for the best of N, 0 for the worst, linear between; a group of one gets 1."""
    if n < 1 or not 1 <= rank <= n:
        raise ValueError(f"rank {rank} is not in 1..{n}")
    if n == 1:
        return 1.0
    return 1.0 - (rank - 1) / (n - 1)


def mixed_reward(structure: float, outcome: float, structure_weight: float = STRUCTURE_WEIGHT) -> float:
    """R = w * structure + (1 - w) * outcome."""
    for name, value in (("structure", structure), ("outcome", outcome)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name} reward {value} is outside [0, 1]")
    return structure_weight * structure + (1.0 - structure_weight) * outcome


def group_advantages(rewards: Sequence[float], eps: float = 1e-4) -> np.ndarray:
    """Group-normalised advantages: zero mean, unit (population) std; all zeros for equal rewards."""
    r = np.asarray(rewards, dtype=np.float64)
    if r.size == 0:
        return r
    std = r.std()
    if std < 1e-8:
        return np.zeros_like(r)
    return (r - r.mean()) / (std + eps)
