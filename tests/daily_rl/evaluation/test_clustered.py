"""The headline-clustered bootstrap (evaluation/clustered.py): it covers the truth at its level on clustered data,
its standard error is wider than the naive one when a headline's notes are correlated, and it is fast."""

from __future__ import annotations

import math
import time

import numpy as np
import pandas as pd
import pytest

from outcome_flywheel.daily_rl.evaluation.clustered import (
    clustered_difference,
    clustered_interval,
    gap_of,
    mean_of,
    naive_se,
)

DATASETS = 200
LEVEL = 0.95
# 3 binomial sds of a coverage share over 200 datasets: sqrt(0.95 * 0.05 / 200) = 0.0154
TOLERANCE = 3 * math.sqrt(LEVEL * (1 - LEVEL) / DATASETS)


def _clustered(rng, clusters=60, per=8, mu=0.0, between=1.0, within=1.0, days=5) -> pd.DataFrame:
    """`clusters` headlines over `days` days, `per` notes each: x = mu + headline effect + note noise."""
    effect = np.repeat(rng.normal(0, between, clusters), per)
    return pd.DataFrame(
        dict(
            date=np.repeat([f"2025-11-{(c % days) + 1:02d}" for c in range(clusters)], per),
            headline_id=np.repeat([f"h{c // days}" for c in range(clusters)], per),
            x=mu + effect + rng.normal(0, within, clusters * per),
        )
    )


def _covers(result: dict, truth: float) -> bool:
    return result["low"] <= truth <= result["high"]


def test_the_interval_covers_the_true_mean_at_its_level():
    rng = np.random.default_rng(0)
    covered = [
        _covers(clustered_interval(_clustered(rng, mu=0.3), mean_of("x"), n_boot=1000, seed=i), 0.3)
        for i in range(DATASETS)
    ]
    assert abs(np.mean(covered) - LEVEL) <= TOLERANCE, np.mean(covered)


def test_a_naive_interval_over_notes_would_not_cover():
    """The same data, each note its own cluster: the interval is too narrow and covers far less than 95%."""
    rng = np.random.default_rng(1)
    covered = []
    for i in range(DATASETS):
        frame = _clustered(rng).assign(note=lambda f: np.arange(len(f)))
        covered.append(_covers(clustered_interval(frame, mean_of("x"), cluster="note", n_boot=200, seed=i), 0.0))
    assert np.mean(covered) < LEVEL - 3 * TOLERANCE


def test_the_share_gap_covers_the_truth():
    """A long share that differs by news (0.7 on good news, 0.4 on bad), with a per-headline tilt: the gap +0.3."""
    rng = np.random.default_rng(2)
    covered = []
    for i in range(DATASETS):
        clusters, per = 60, 8
        good = np.repeat(rng.random(clusters) < 0.5, per)
        tilt = np.repeat(rng.normal(0, 0.15, clusters), per)
        p = np.clip(np.where(good, 0.7, 0.4) + tilt, 0, 1)
        frame = pd.DataFrame(
            dict(
                date="2025-11-03",
                headline_id=np.repeat([f"h{c}" for c in range(clusters)], per),
                long=(rng.random(clusters * per) < p).astype(float),
                good=good,
                bad=~good,
            )
        )
        truth = 0.7 - 0.4  # the tilt is symmetric around 0 and small enough that clipping is rare
        covered.append(_covers(clustered_interval(frame, gap_of("long", "good", "bad"), n_boot=1000, seed=i), truth))
    assert abs(np.mean(covered) - LEVEL) <= TOLERANCE + 0.01, np.mean(covered)  # + the clip's small bias


def test_the_paired_difference_covers_the_truth():
    """Policy and base share each headline's effect (they answer the same prompt); the policy is 0.2 higher."""
    rng = np.random.default_rng(3)
    covered = []
    for i in range(DATASETS):
        base = _clustered(rng, between=1.0, within=0.5)
        effect = base["x"].to_numpy()
        policy = base.assign(x=effect + 0.2 + rng.normal(0, 0.3, len(base)))
        result = clustered_difference(policy, base, mean_of("x"), n_boot=1000, seed=i)
        covered.append(_covers(result, 0.2))
    assert abs(np.mean(covered) - LEVEL) <= TOLERANCE, np.mean(covered)


def test_the_paired_difference_is_narrower_than_the_unpaired_one_and_drops_unshared_clusters():
    rng = np.random.default_rng(4)
    base = _clustered(rng, between=1.0, within=0.3)
    policy = base.assign(x=base["x"] + 0.5)
    extra = pd.DataFrame(dict(date="2099-01-01", headline_id="only-policy", x=[100.0] * 8))
    paired = clustered_difference(pd.concat([policy, extra]), base, mean_of("x"), seed=0)
    assert paired["clusters"] == 60 and paired["n"] == 2 * len(base)
    assert paired["estimate"] == pytest.approx(0.5)
    assert paired["high"] - paired["low"] < 1e-9 + 1e-6  # the same headlines, a constant shift: no spread at all
    unpaired = clustered_interval(policy, mean_of("x"))["se"]
    assert unpaired > 0.05


def test_the_clustered_se_is_wider_than_the_naive_one_when_notes_are_correlated():
    rng = np.random.default_rng(5)
    correlated = _clustered(rng, between=1.0, within=0.5)
    result = clustered_interval(correlated, mean_of("x"))
    naive = naive_se(correlated["x"])
    # design effect 1 + (m - 1) rho with m = 8, rho = 0.8: the se is ~2.6x the naive one
    assert result["se"] > 1.8 * naive
    independent = _clustered(rng, between=0.0, within=1.0)
    ratio = clustered_interval(independent, mean_of("x"))["se"] / naive_se(independent["x"])
    assert 0.8 < ratio < 1.25  # no correlation: about the naive se


def test_a_generic_statistic_gives_the_same_resamples_as_the_vectorised_one():
    rng = np.random.default_rng(6)
    frame = _clustered(rng, clusters=20, per=3)
    fast = clustered_interval(frame, mean_of("x"), n_boot=200, seed=7)
    slow = clustered_interval(frame, lambda f: float(f["x"].mean()), n_boot=200, seed=7)
    for key in ("estimate", "low", "high", "se"):
        assert fast[key] == pytest.approx(slow[key], rel=1e-9)
    diff_fast = clustered_difference(frame, frame.assign(x=frame["x"] * 2), mean_of("x"), n_boot=100, seed=1)
    diff_slow = clustered_difference(
        frame, frame.assign(x=frame["x"] * 2), lambda f: float(f["x"].mean()), n_boot=100, seed=1
    )
    assert diff_fast["se"] == pytest.approx(diff_slow["se"], rel=1e-9)


def test_undefined_statistics_and_missing_columns():
    frame = pd.DataFrame(dict(date="d", headline_id=["a", "a", "b"], x=[np.nan, np.nan, 1.0]))
    result = clustered_interval(frame, mean_of("x"), n_boot=500)
    assert result["estimate"] == 1.0 and result["undefined_resamples"] > 0  # resamples of "a" alone: no value
    assert result["low"] == result["high"] == 1.0
    one = clustered_interval(frame[frame["headline_id"] == "b"], mean_of("x"))
    assert one["clusters"] == 1 and math.isnan(one["low"])
    with pytest.raises(ValueError, match="cluster columns"):
        clustered_interval(frame.drop(columns="date"), mean_of("x"))


def test_two_thousand_resamples_over_a_thousand_notes_are_fast():
    rng = np.random.default_rng(8)
    frame = _clustered(rng, clusters=125, per=8).assign(good=lambda f: f["x"] > 0, bad=lambda f: f["x"] <= 0)
    started = time.perf_counter()
    clustered_interval(frame, mean_of("x"), n_boot=2000)
    clustered_interval(frame, gap_of("x", "good", "bad"), n_boot=2000)
    clustered_difference(frame, frame, mean_of("x"), n_boot=2000)
    assert time.perf_counter() - started < 1.0
