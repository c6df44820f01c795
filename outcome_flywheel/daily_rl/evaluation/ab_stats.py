"""Statistics of the A/B of the trained policy against its frozen base model (plain Python, no Dagster).

Each day the policy and the base write notes for the same headlines with the same prompts and seeds, so the two
sides are paired. Every comparison carries a 95% interval, a p-value from the test that gives that interval, and a
label read off the interval in one place (`label_for`, through `_comparison`): "better" / "worse" when the interval
lies entirely on one side of the null, "no detectable difference" when it covers it, "not enough data" when the
sample is below the minimum, and then the interval and p-value are NaN. So a label always agrees with the stored
interval, and (the test and the interval being dual) p < 0.05 exactly when the label is "better" or "worse".

The unit is what is independent under the null:
- Structure score: the headline. The notes of one headline share a prompt, so a metric is first averaged per headline
  on each side (`per_headline_pairs`) and the per-headline means are compared with a paired t-test
  (`paired_comparison`).
- Judge preference: one matched pair per headline; exact binomial (sign) test against 0.5 with its exact
  (Clopper-Pearson) interval, which at 0.5 rejects exactly when the test does (`win_rate_comparison`).
- Outcomes of the calls (hit rate, vs_spy_pct): the entry session. All of one session's calls ride the same market
  move and a few symbols, so headlines of one day are not independent; the paired per-headline differences are
  averaged per session and the session means are compared across sessions (`session_comparison`,
  `session_mean_interval`). Books held h > 1 sessions overlap; the interval then takes the sessions h apart (which
  do not overlap) as h interleaved series and bounds the variance of the overall mean by assuming them perfectly
  correlated (sd of a weighted mean <= the weighted mean of the sds): conservative, valid whatever the overlap does.

Minimum samples. `MIN_PAIRS` = 6: with fewer pairs no distribution-free paired test (the exact sign test) can reach
two-sided 5% (6 of 6 gives p = 1/32), so a verdict would rest on normality alone. `MIN_SESSIONS` = 10
non-overlapping sessions (h x 10 sessions for h-session books): with fewer, one session's news (an earnings jump)
decides the mean and the t-interval's level rests on a normality the data cannot show; `benchmarks.ab_calibration`
measures the false-label rates at and above these minimums.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Iterable

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

LABELS = ("better", "no detectable difference", "worse", "not enough data")
BETTER, NO_DIFFERENCE, WORSE, NOT_ENOUGH = LABELS
CONFIDENCE = 0.95
MIN_PAIRS = 6
MIN_SESSIONS = 10

PAIRED_TEST = "paired t-test over headlines (per-headline means)"
WIN_RATE_TEST = "exact binomial (sign) test vs 0.5, exact (Clopper-Pearson) interval"
SESSION_TEST = "t-test over entry sessions (per-session mean of per-headline paired differences)"


@dataclass(frozen=True)
class Comparison:
    """One metric, policy vs base. `difference` = policy - base (for a preference: win rate - 0.5)."""

    metric: str
    policy: float
    base: float
    difference: float  # policy - base (NaN when not computable)
    ci_low: float  # 95% interval of the difference (or of the win rate for a preference); NaN: not enough data
    ci_high: float
    n: int  # number of independent units used (headlines, decisive pairs, non-overlapping sessions' days)
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


def label_for(
    ci_low: float,
    ci_high: float,
    null: float = 0.0,
    higher_is_better: bool = True,
    n: int | None = None,
    min_n: int = 2,
) -> str:
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


def _comparison(
    metric: str,
    policy: float,
    base: float,
    difference: float,
    low: float,
    high: float,
    n: int,
    test: str,
    p_value: float,
    min_n: int,
    null: float = 0.0,
    higher_is_better: bool = True,
) -> Comparison:
    """The one place a Comparison gets its label: below `min_n` units the interval and p-value are dropped (NaN),
    and the label is read off the interval that is stored."""
    if n < min_n or _nan(low) or _nan(high):
        low = high = p_value = math.nan
    return Comparison(
        metric,
        float(policy),
        float(base),
        float(difference),
        float(low),
        float(high),
        int(n),
        test,
        float(p_value),
        label_for(low, high, null, higher_is_better),
    )


def _zero_spread_result(d: np.ndarray) -> tuple[float, float, float, str]:
    """(low, high, p, note) when every difference is the same c, where the t-test is undefined: c = 0 -> [0, 0],
    p = 1; c != 0 -> [c, c] with the exact sign test's p (n of n on one side), which is < 0.05 from n = 6 on."""
    from scipy import stats  # imported where a test is taken: ~0.8 s off loading the definitions

    c = float(d.mean())
    if abs(c) <= 1e-12 * max(1.0, float(np.abs(d).max())):
        return 0.0, 0.0, 1.0, " (zero spread, all differences 0)"
    p = float(stats.binomtest(d.size, d.size, 0.5).pvalue)
    return c, c, p, " (zero spread: exact sign test)"


def paired_comparison(
    metric: str,
    policy: ArrayLike,
    base: ArrayLike,
    test_name: str = PAIRED_TEST,
    higher_is_better: bool = True,
    confidence: float = CONFIDENCE,
    min_n: int = MIN_PAIRS,
) -> Comparison:
    """Paired t-test (`scipy.stats.ttest_rel`) on policy - base, with the t interval of the mean difference.

    Pairs with a NaN on either side are dropped; `n` counts the pairs used. Fewer than `min_n` pairs -> NaN interval
    and "not enough data". When every difference is the same the t-test is undefined: see `_zero_spread_result`.
    """
    from scipy import stats  # imported where a test is taken: ~0.8 s off loading the definitions

    p = np.asarray(policy, dtype=float).ravel()
    b = np.asarray(base, dtype=float).ravel()
    if p.shape != b.shape:
        raise ValueError(f"paired_comparison: policy has {p.size} values, base has {b.size}")
    keep = ~(np.isnan(p) | np.isnan(b))
    p, b = p[keep], b[keep]
    n = int(p.size)
    pm = float(p.mean()) if n else math.nan
    bm = float(b.mean()) if n else math.nan
    d = p - b
    diff = float(d.mean()) if n else math.nan
    if n < max(min_n, 2):
        return _comparison(
            metric, pm, bm, diff, math.nan, math.nan, n, test_name, math.nan, min_n, 0.0, higher_is_better
        )
    if zero_spread(d):
        low, high, pv, note = _zero_spread_result(d)
        return _comparison(metric, pm, bm, diff, low, high, n, test_name + note, pv, min_n, 0.0, higher_is_better)
    res = stats.ttest_rel(p, b)
    ci = res.confidence_interval(confidence_level=confidence)
    return _comparison(
        metric,
        pm,
        bm,
        diff,
        float(ci.low),
        float(ci.high),
        n,
        test_name,
        float(res.pvalue),
        min_n,
        0.0,
        higher_is_better,
    )


def per_headline_pairs(
    policy: pd.DataFrame, base: pd.DataFrame, value: str, key: str = "headline_id"
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


def win_rate_comparison(
    metric: str, wins: int, losses: int, ties: int = 0, confidence: float = CONFIDENCE, min_n: int = MIN_PAIRS
) -> Comparison:
    """Head-to-head preference: win rate of the policy = wins / (wins + losses); ties are reported in `test`, not
    counted. Exact binomial test vs 0.5 (`scipy.stats.binomtest`) and its exact (Clopper-Pearson) interval of the
    win rate: at 0.5 the binomial is symmetric, so the interval excludes 0.5 exactly when the two-sided p < 0.05
    (a Wilson interval does not: 4-0, p = 0.125, has a Wilson interval above 0.5). Fewer than `min_n` decisive pairs
    -> "not enough data" (with 5 of 5 the exact test cannot reach 5%). policy = win rate, base = 1 - win rate,
    difference = win rate - 0.5; `n` = wins + losses."""
    from scipy import stats  # imported where a test is taken: ~0.8 s off loading the definitions

    wins, losses, ties = int(wins), int(losses), int(ties)
    if min(wins, losses, ties) < 0:
        raise ValueError("win_rate_comparison: counts must be >= 0")
    n = wins + losses
    test = f"{WIN_RATE_TEST} ({ties} ties not counted)"
    if n == 0:
        return _comparison(metric, math.nan, math.nan, math.nan, math.nan, math.nan, 0, test, math.nan, min_n, 0.5)
    rate = wins / n
    res = stats.binomtest(wins, n, 0.5)
    ci = res.proportion_ci(confidence_level=confidence, method="exact")
    return _comparison(
        metric, rate, 1.0 - rate, rate - 0.5, float(ci.low), float(ci.high), n, test, float(res.pvalue), min_n, 0.5
    )


def session_mean_interval(
    values: ArrayLike, horizon: int = 1, confidence: float = CONFIDENCE, min_sessions: int = MIN_SESSIONS
) -> tuple[float, float, float, str]:
    """(low, high, p-value, method) for the mean of a per-session series in session order (one value per entry
    session), whose books are held `horizon` sessions.

    horizon 1: the one-sample t interval and test (`scipy.stats.ttest_1samp`). horizon h > 1: the values h apart
    do not overlap; the series is split into its h interleaved sub-series (position mod h), and the standard error
    of the overall mean is bounded by sum_o (m_o / n) * sd_o / sqrt(m_o) (exact if the sub-series were perfectly
    correlated, larger than the truth otherwise), with a t of (shortest sub-series - 1) degrees of freedom.
    Fewer than `min_sessions` x h values -> NaN ("not enough data"); zero spread -> `_zero_spread_result`."""
    from scipy import stats  # imported where a test is taken: ~0.8 s off loading the definitions

    x = np.asarray(values, dtype=float)
    x = x[~np.isnan(x)]
    h = max(int(horizon), 1)
    n = int(x.size)
    if n < max(min_sessions, 2) * h:
        return math.nan, math.nan, math.nan, f"none (fewer than {max(min_sessions, 2) * h} sessions)"
    if zero_spread(x):
        low, high, p, note = _zero_spread_result(x[::h])  # the sign test counts non-overlapping books only
        return low, high, p, "none" + note
    mean = float(x.mean())
    if h == 1:
        res = stats.ttest_1samp(x, 0.0)
        ci = res.confidence_interval(confidence_level=confidence)
        return float(ci.low), float(ci.high), float(res.pvalue), "t-interval over sessions"
    subs = [x[o::h] for o in range(h)]
    se = sum(s.size / n * float(s.std(ddof=1)) / math.sqrt(s.size) for s in subs)
    df = min(s.size for s in subs) - 1
    if se <= 0:  # each sub-series flat (values repeat with period h): no spread to measure
        return math.nan, math.nan, math.nan, "none (no spread within the non-overlapping sub-series)"
    t = mean / se
    half = float(stats.t.ppf(0.5 + confidence / 2, df)) * se
    p = float(2 * stats.t.sf(abs(t), df))
    return (
        mean - half,
        mean + half,
        p,
        (
            f"t-interval over sessions, {h}-session books: overlap-robust bound over "
            f"{h} non-overlapping sub-series, {df} df"
        ),
    )


def session_differences(
    policy: pd.DataFrame, base: pd.DataFrame, value: str, session: str = "session", key: str = "headline_id"
) -> pd.DataFrame:
    """Per session (sorted): the mean over the session's paired headlines of the per-headline means of `value`
    (columns `policy`, `base`, `difference`, `headlines`). Headlines on one side only are dropped."""

    def means(df: pd.DataFrame) -> pd.Series:
        if df.empty:
            return pd.Series(dtype=float, index=pd.MultiIndex.from_arrays([[], []], names=[session, key]))
        # one row order on both sides, so equal values give bit-equal means (as in per_headline_pairs)
        df = df.sort_values([c for c in (session, key, "rollout_index") if c in df.columns], kind="stable")
        return pd.to_numeric(df[value], errors="coerce").groupby([df[session], df[key]]).mean().dropna()

    both = pd.concat([means(policy).rename("policy"), means(base).rename("base")], axis=1, join="inner")
    both["difference"] = both["policy"] - both["base"]
    per = both.groupby(level=0, sort=True).agg(
        policy=("policy", "mean"),
        base=("base", "mean"),
        difference=("difference", "mean"),
        headlines=("policy", "size"),
    )
    return per.rename_axis("session").reset_index()[["session", "policy", "base", "difference", "headlines"]]


def session_comparison(
    metric: str,
    policy: pd.DataFrame,
    base: pd.DataFrame,
    value: str,
    horizon: int = 1,
    test_name: str = SESSION_TEST,
    session: str = "session",
    higher_is_better: bool = True,
    min_sessions: int = MIN_SESSIONS,
) -> Comparison:
    """Policy vs base on a per-call value whose calls share sessions: paired per headline, averaged per session,
    compared across sessions with `session_mean_interval`. `n` = the number of sessions."""
    per = session_differences(policy, base, value, session)
    n = len(per)
    pm, bm, dm = (float(per[c].mean()) if n else math.nan for c in ("policy", "base", "difference"))
    low, high, p, method = session_mean_interval(per["difference"].to_numpy(), horizon, min_sessions=min_sessions)
    test = f"{test_name}; {method}"
    return _comparison(
        metric, pm, bm, dm, low, high, n, test, p, max(min_sessions, 2) * max(int(horizon), 1), 0.0, higher_is_better
    )


def comparisons_frame(comparisons: Iterable[Comparison]) -> pd.DataFrame:
    """One row per comparison, columns in the order of `Comparison`'s fields (empty frame keeps them)."""
    return pd.DataFrame([c.as_row() for c in comparisons], columns=COLUMNS)
