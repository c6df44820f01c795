"""Headline-clustered bootstrap intervals (plain numpy and pandas, no Dagster).

The notes of one headline share its prompt and its outcome, so they are not independent: a bootstrap over
notes gives an interval that is too narrow. This one resamples the clusters (by default a headline of a day,
`(date, headline_id)`) with replacement and keeps each cluster's notes together.

- `clustered_interval(frame, statistic)`: the statistic of the notes with its percentile interval and bootstrap
  standard error.
- `clustered_difference(policy, base, statistic)`: statistic(policy) - statistic(base), paired by cluster: only the
  clusters both sides have are used, and one resample draws the same clusters for both sides.

`statistic` is any `frame -> float`. The statistics most figures need (a mean, a share, a difference of two
conditional means) are `SumsStatistic`s (`mean_of`, `gap_of`): a function of per-note column sums, so every
resample is one matrix product of multinomial cluster counts with per-cluster sums (2000 resamples over
~1000 notes take a few milliseconds). Any other callable is evaluated on each resampled frame (correct, slower).
Resamples whose statistic is undefined (e.g. no notes of the kind the mean is over) are dropped and counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import pandas as pd

CLUSTER = ("date", "headline_id")


@dataclass(frozen=True)
class SumsStatistic:
    """A statistic that is `combine(column sums)`: `summands(frame)` gives per-note values (n, k) whose sums over
    the notes, (k,), `combine` maps to the statistic; `combine` also takes (..., k) arrays of many resamples."""

    summands: Callable[[pd.DataFrame], np.ndarray]
    combine: Callable[[np.ndarray], np.ndarray]
    name: str = ""

    def __call__(self, frame: pd.DataFrame) -> float:
        return float(self.combine(np.asarray(self.summands(frame), dtype=float).sum(axis=0)))


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def _values(frame: pd.DataFrame, column: str, where: str | None) -> tuple[np.ndarray, np.ndarray]:
    """(values with NaN as 0, weight 1 where the value counts): NaN and rows where `where` is False drop out."""
    x = pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=float)
    keep = ~np.isnan(x)
    if where is not None:
        keep &= frame[where].fillna(False).to_numpy(dtype=bool)
    return np.where(keep, x, 0.0), keep.astype(float)


def mean_of(column: str, where: str | None = None) -> SumsStatistic:
    """Mean of `column` over the notes where it is not NaN (and `where`, a boolean column, holds)."""

    def summands(frame):
        x, w = _values(frame, column, where)
        return np.column_stack([x, w])

    return SumsStatistic(summands, lambda s: _ratio(s[..., 0], s[..., 1]), f"mean({column})")


def gap_of(column: str, first: str, second: str) -> SumsStatistic:
    """mean(column | first) - mean(column | second), `first` and `second` boolean columns (e.g. the long share of
    company calls on good news minus that on bad news)."""

    def summands(frame):
        a, wa = _values(frame, column, first)
        b, wb = _values(frame, column, second)
        return np.column_stack([a, wa, b, wb])

    return SumsStatistic(
        summands,
        lambda s: _ratio(s[..., 0], s[..., 1]) - _ratio(s[..., 2], s[..., 3]),
        f"mean({column}|{first}) - mean({column}|{second})",
    )


def cluster_codes(frame: pd.DataFrame, cluster: Sequence[str] | str = CLUSTER) -> tuple[np.ndarray, pd.Index]:
    """(per-row cluster code 0..C-1, the clusters' keys). A missing cluster column is a clear error."""
    cols = [cluster] if isinstance(cluster, str) else list(cluster)
    missing = [c for c in cols if c not in frame.columns]
    if missing:
        raise ValueError(f"cluster columns {missing} are not in the frame (it has {list(frame.columns)})")
    keys = frame[cols[0]].astype(str)
    for c in cols[1:]:
        keys = keys + "|" + frame[c].astype(str)
    codes, uniques = pd.factorize(keys.to_numpy(dtype=object), sort=True)
    return codes, pd.Index(uniques)


def _cluster_sums(frame: pd.DataFrame, stat: SumsStatistic, codes: np.ndarray, n_clusters: int) -> np.ndarray:
    values = np.asarray(stat.summands(frame), dtype=float).reshape(len(frame), -1)
    sums = np.zeros((n_clusters, values.shape[1]))
    np.add.at(sums, codes, values)
    return sums


def _draws(rng: np.random.Generator, n_clusters: int, n_boot: int) -> np.ndarray:
    """(n_boot, C) counts: how often each cluster is drawn in each resample of C clusters with replacement."""
    return rng.multinomial(n_clusters, np.full(n_clusters, 1.0 / n_clusters), size=n_boot).astype(float)


def _generic(frame: pd.DataFrame, statistic, codes: np.ndarray, counts: np.ndarray) -> np.ndarray:
    rows = [np.flatnonzero(codes == c) for c in range(counts.shape[1])]
    out = np.empty(len(counts))
    for b, draw in enumerate(counts.astype(int)):
        picked = np.repeat(np.arange(len(draw)), draw)
        index = np.concatenate([rows[c] for c in picked]) if len(picked) else np.array([], dtype=int)
        out[b] = statistic(frame.iloc[index])
    return out


def _summary(estimate: float, boot: np.ndarray, level: float, clusters: int, n: int) -> dict:
    ok = boot[np.isfinite(boot)]
    alpha = (1.0 - level) / 2.0
    if len(ok) < 2 or not math.isfinite(estimate):
        low = high = se = math.nan
    else:
        low, high = (float(v) for v in np.quantile(ok, [alpha, 1.0 - alpha]))
        se = float(ok.std(ddof=1))
    return dict(
        estimate=float(estimate),
        low=low,
        high=high,
        se=se,
        clusters=int(clusters),
        n=int(n),
        level=level,
        n_boot=int(len(boot)),
        undefined_resamples=int(len(boot) - len(ok)),
    )


def clustered_interval(
    frame: pd.DataFrame,
    statistic: Callable[[pd.DataFrame], float],
    cluster: Sequence[str] | str = CLUSTER,
    n_boot: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> dict:
    """statistic(frame) with a cluster bootstrap interval: dict(estimate, low, high, se, clusters, n, ...).
    `low`/`high` are the percentile interval at `level`, `se` the sd of the resampled statistics; NaN when the
    frame has fewer than 2 clusters or the statistic is undefined."""
    codes, keys = cluster_codes(frame, cluster)
    n_clusters = len(keys)
    estimate = float(statistic(frame)) if len(frame) else math.nan
    if n_clusters < 2:
        return _summary(estimate, np.array([]), level, n_clusters, len(frame))
    counts = _draws(np.random.default_rng(seed), n_clusters, n_boot)
    if isinstance(statistic, SumsStatistic):
        with np.errstate(invalid="ignore", divide="ignore"):
            boot = statistic.combine(counts @ _cluster_sums(frame, statistic, codes, n_clusters))
    else:
        boot = _generic(frame, statistic, codes, counts)
    return _summary(estimate, np.asarray(boot, dtype=float), level, n_clusters, len(frame))


def clustered_difference(
    policy: pd.DataFrame,
    base: pd.DataFrame,
    statistic: Callable[[pd.DataFrame], float],
    cluster: Sequence[str] | str = CLUSTER,
    n_boot: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> dict:
    """statistic(policy) - statistic(base) over the clusters both have, with a paired cluster bootstrap interval
    (each resample draws the same clusters for both sides). Also returns `policy` and `base`, each side's statistic
    over those clusters."""
    cols = [cluster] if isinstance(cluster, str) else list(cluster)
    p_codes, p_keys = cluster_codes(policy, cols)
    b_codes, b_keys = cluster_codes(base, cols)
    shared = p_keys.intersection(b_keys)
    # codes into `shared` (-1: a cluster only one side has, dropped)
    p_map, b_map = shared.get_indexer(p_keys)[p_codes], shared.get_indexer(b_keys)[b_codes]
    policy, base = policy[p_map >= 0], base[b_map >= 0]
    p_map, b_map = p_map[p_map >= 0], b_map[b_map >= 0]
    n_clusters = len(shared)
    p_est = float(statistic(policy)) if len(policy) else math.nan
    b_est = float(statistic(base)) if len(base) else math.nan
    estimate = p_est - b_est
    if n_clusters < 2:
        boot = np.array([])
    else:
        counts = _draws(np.random.default_rng(seed), n_clusters, n_boot)
        if isinstance(statistic, SumsStatistic):
            with np.errstate(invalid="ignore", divide="ignore"):
                boot = statistic.combine(counts @ _cluster_sums(policy, statistic, p_map, n_clusters))
                boot = boot - statistic.combine(counts @ _cluster_sums(base, statistic, b_map, n_clusters))
        else:
            boot = _generic(policy, statistic, p_map, counts) - _generic(base, statistic, b_map, counts)
    out = _summary(estimate, np.asarray(boot, dtype=float), level, n_clusters, len(policy) + len(base))
    return dict(out, policy=p_est, base=b_est)


def naive_se(values: np.ndarray) -> float:
    """The standard error of a mean that treats every note as independent (what the clustered one replaces)."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    return float(values.std(ddof=1) / math.sqrt(len(values))) if len(values) > 1 else math.nan
