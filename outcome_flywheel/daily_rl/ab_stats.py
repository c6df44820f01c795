"""Statistics of the A/B of the trained policy against its frozen base model (plain Python, no Dagster).

Each day the policy and the base write notes for the same headlines with the same prompts and seeds, so the two
sides are paired. The unit of pairing is the headline: the notes of one headline are correlated (same prompt), so a
metric is first averaged per headline on each side (`per_headline_pairs`) and the per-headline means are compared
with a paired t-test (`paired_comparison`). Head-to-head preferences (a judge picks the policy's or the base's note)
are compared with an exact binomial (sign) test against 0.5 (`win_rate_comparison`).

Every comparison carries a 95% interval and a label read off that interval (`label_for`):
"better" / "worse" when the interval lies entirely on one side of the null, "no detectable difference" when it
covers the null, "not enough data" when there are too few paired units or the interval cannot be computed.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Iterable

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike
from scipy import stats

LABELS = ("better", "no detectable difference", "worse", "not enough data")
BETTER, NO_DIFFERENCE, WORSE, NOT_ENOUGH = LABELS

PAIRED_TEST = "paired t-test over headlines (per-headline means)"
WIN_RATE_TEST = "exact binomial (sign) test vs 0.5, Wilson interval"


@dataclass(frozen=True)
class Comparison:
    """One metric, policy vs base. `difference` = policy - base (for a preference: win rate - 0.5)."""

    metric: str
    policy: float
    base: float
    difference: float  # policy - base (NaN when not computable)
    ci_low: float  # 95% interval of the difference (or of the win rate for a preference)
    ci_high: float
    n: int  # number of paired units used
    test: str  # plain words
    p_value: float
    label: str

    def as_row(self) -> dict:
        return asdict(self)


COLUMNS = [f.name for f in fields(Comparison)]


def _nan(x) -> bool:
    return x is None or (isinstance(x, (float, np.floating)) and math.isnan(x))


def zero_spread(x: np.ndarray) -> bool:
    """All values equal up to float rounding (policy + c - base is not exactly c in floating point)."""
    return bool(np.ptp(x) <= 1e-12 * max(1.0, float(np.abs(x).max())))


def label_for(ci_low: float, ci_high: float, null: float = 0.0, higher_is_better: bool = True, n: int | None = None,
              min_n: int = 2) -> str:
    """Label from an interval: entirely above `null` -> "better" ("worse" when lower is better), entirely below ->
    "worse" ("better" when lower is better), covering `null` -> "no detectable difference". Fewer than `min_n`
    units (when `n` is given) or a NaN bound -> "not enough data"."""
    if (n is not None and n < min_n) or _nan(ci_low) or _nan(ci_high):
        return NOT_ENOUGH
    if ci_low > null:
        return BETTER if higher_is_better else WORSE
    if ci_high < null:
        return WORSE if higher_is_better else BETTER
    return NO_DIFFERENCE


def paired_comparison(metric: str, policy: ArrayLike, base: ArrayLike, test_name: str = PAIRED_TEST,
                      higher_is_better: bool = True, confidence: float = 0.95) -> Comparison:
    """Paired t-test (`scipy.stats.ttest_rel`) on policy - base, with the t interval of the mean difference.

    Pairs with a NaN on either side are dropped; `n` counts the pairs used. Fewer than 2 pairs -> NaN interval and
    "not enough data". When every difference is the same (zero spread) the t-test is undefined: the interval is
    zero-width at that difference, p = 1 and the label "no detectable difference" (no claim without spread).
    """
    p = np.asarray(policy, dtype=float).ravel()
    b = np.asarray(base, dtype=float).ravel()
    if p.shape != b.shape:
        raise ValueError(f"paired_comparison: policy has {p.size} values, base has {b.size}")
    keep = ~(np.isnan(p) | np.isnan(b))
    p, b = p[keep], b[keep]
    n = int(p.size)
    pm = float(p.mean()) if n else math.nan
    bm = float(b.mean()) if n else math.nan
    if n < 2:
        return Comparison(metric, pm, bm, pm - bm if n else math.nan, math.nan, math.nan, n, test_name, math.nan,
                          NOT_ENOUGH)
    d = p - b
    diff = float(d.mean())
    if zero_spread(d):
        return Comparison(metric, pm, bm, diff, diff, diff, n, test_name, 1.0, NO_DIFFERENCE)
    res = stats.ttest_rel(p, b)
    ci = res.confidence_interval(confidence_level=confidence)
    low, high = float(ci.low), float(ci.high)
    label = label_for(low, high, 0.0, higher_is_better, n=n, min_n=2)
    return Comparison(metric, pm, bm, diff, low, high, n, test_name, float(res.pvalue), label)


def per_headline_pairs(policy: pd.DataFrame, base: pd.DataFrame, value: str, key: str = "headline_id"
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Per-headline means of `value` on each side (NaN values skipped), for the headlines with a non-NaN mean on
    both sides, aligned by `key` (sorted by key). Returns (policy_means, base_means)."""
    def means(df: pd.DataFrame) -> pd.Series:
        if df.empty:
            return pd.Series(dtype=float)
        # one row order on both sides, so equal values give bit-equal means (a sum's order moves the last bit)
        order = [c for c in (key, "rollout_index") if c in df.columns]
        df = df.sort_values(order, kind="stable")
        return pd.to_numeric(df[value], errors="coerce").groupby(df[key]).mean().dropna()

    both = pd.concat([means(policy).rename("policy"), means(base).rename("base")], axis=1, join="inner")
    both = both.sort_index()
    return both["policy"].to_numpy(dtype=float), both["base"].to_numpy(dtype=float)


def win_rate_comparison(metric: str, wins: int, losses: int, ties: int = 0, confidence: float = 0.95) -> Comparison:
    """Head-to-head preference: win rate of the policy = wins / (wins + losses); ties are reported in `test`, not
    counted. Exact binomial test vs 0.5 (`scipy.stats.binomtest`) and its Wilson interval of the win rate; the label
    is "better" when the interval is above 0.5, "worse" when below. policy = win rate, base = 1 - win rate,
    difference = win rate - 0.5; `n` = wins + losses."""
    wins, losses, ties = int(wins), int(losses), int(ties)
    if min(wins, losses, ties) < 0:
        raise ValueError("win_rate_comparison: counts must be >= 0")
    n = wins + losses
    test = f"{WIN_RATE_TEST} ({ties} ties not counted)"
    if n == 0:
        return Comparison(metric, math.nan, math.nan, math.nan, math.nan, math.nan, 0, test, math.nan, NOT_ENOUGH)
    rate = wins / n
    res = stats.binomtest(wins, n, 0.5)
    ci = res.proportion_ci(confidence_level=confidence, method="wilson")
    low, high = float(ci.low), float(ci.high)
    label = label_for(low, high, 0.5, True, n=n, min_n=1)
    return Comparison(metric, rate, 1.0 - rate, rate - 0.5, low, high, n, test, float(res.pvalue), label)


def comparisons_frame(comparisons: Iterable[Comparison]) -> pd.DataFrame:
    """One row per comparison, columns in the order of `Comparison`'s fields (empty frame keeps them)."""
    return pd.DataFrame([c.as_row() for c in comparisons], columns=COLUMNS)
