"""The A/B statistics of the policy against its base model: labels, paired t-test, win rate, per-headline pairing."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from outcome_flywheel.daily_rl.ab_stats import (
    LABELS,
    Comparison,
    comparisons_frame,
    label_for,
    paired_comparison,
    per_headline_pairs,
    win_rate_comparison,
)


def test_labels_are_the_four_words():
    assert LABELS == ("better", "no detectable difference", "worse", "not enough data")


@pytest.mark.parametrize(
    "low, high, kwargs, expected",
    [
        (0.1, 0.9, {}, "better"),
        (-0.9, -0.1, {}, "worse"),
        (-0.1, 0.9, {}, "no detectable difference"),
        (0.0, 0.9, {}, "no detectable difference"),  # touching the null is covering it
        (-0.9, 0.0, {}, "no detectable difference"),
        (0.1, 0.9, {"higher_is_better": False}, "worse"),
        (-0.9, -0.1, {"higher_is_better": False}, "better"),
        (0.51, 0.7, {"null": 0.5}, "better"),
        (0.4, 0.7, {"null": 0.5}, "no detectable difference"),
        (0.1, 0.9, {"n": 1}, "not enough data"),
        (0.1, 0.9, {"n": 2}, "better"),
        (0.1, 0.9, {"n": 4, "min_n": 5}, "not enough data"),
        (math.nan, 0.9, {}, "not enough data"),
        (0.1, math.nan, {"n": 10}, "not enough data"),
    ],
)
def test_label_for_boundaries(low, high, kwargs, expected):
    assert label_for(low, high, **kwargs) == expected


def test_paired_comparison_matches_scipy_ttest_rel():
    policy = [3.0, 5.0, 4.0, 8.0, 6.0]
    base = [1.0, 4.0, 4.0, 5.0, 3.0]  # differences 2, 1, 0, 3, 3: mean 1.8
    c = paired_comparison("structure_score", policy, base)
    ref = stats.ttest_rel(policy, base)
    ci = ref.confidence_interval(confidence_level=0.95)
    assert c.policy == pytest.approx(5.2) and c.base == pytest.approx(3.4)
    assert c.difference == pytest.approx(1.8)
    assert c.n == 5
    assert c.p_value == pytest.approx(ref.pvalue)
    assert (c.ci_low, c.ci_high) == (pytest.approx(ci.low), pytest.approx(ci.high))
    # by hand: sd of the differences = sqrt(6.8 / 4), t(0.975, 4) = 2.7764
    half = stats.t.ppf(0.975, 4) * math.sqrt(6.8 / 4) / math.sqrt(5)
    assert c.ci_low == pytest.approx(1.8 - half) and c.ci_high == pytest.approx(1.8 + half)
    assert c.ci_low > 0 and c.label == "better"
    assert c.test == "paired t-test over headlines (per-headline means)"
    assert paired_comparison("loss", policy, base, higher_is_better=False).label == "worse"
    assert paired_comparison("x", base, policy).label == "worse"


def test_paired_comparison_covering_zero():
    c = paired_comparison("x", [1.0, 2.0, 3.0, 4.0], [2.0, 1.0, 4.0, 3.0])  # differences -1, 1, -1, 1
    assert c.difference == 0.0 and c.ci_low < 0 < c.ci_high
    assert c.label == "no detectable difference"


@pytest.mark.parametrize("shift", [0.0, 0.25])
def test_paired_comparison_all_equal_differences_do_not_crash(shift):
    base = np.array([0.1, 0.5, 0.9])
    c = paired_comparison("structure_score", base + shift, base)
    assert c.difference == pytest.approx(shift)
    assert c.ci_low == pytest.approx(shift) and c.ci_high == pytest.approx(shift)
    assert c.p_value == 1.0
    assert c.label == "no detectable difference"


def test_paired_comparison_drops_nan_pairs_and_needs_two():
    c = paired_comparison("x", [1.0, np.nan, 3.0, 5.0], [0.0, 1.0, np.nan, 2.0])
    assert c.n == 2 and c.difference == pytest.approx(2.0)  # pairs (1, 0) and (5, 2)
    one = paired_comparison("x", [1.0, np.nan], [0.0, 1.0])
    assert one.n == 1 and one.label == "not enough data" and math.isnan(one.ci_low) and math.isnan(one.p_value)
    none = paired_comparison("x", [], [])
    assert none.n == 0 and none.label == "not enough data" and math.isnan(none.difference)
    with pytest.raises(ValueError):
        paired_comparison("x", [1.0, 2.0], [1.0])


def test_per_headline_pairs_aligns_by_headline_and_drops_one_sided():
    policy = pd.DataFrame({
        "headline_id": ["h2", "h1", "h1", "h3", "h2", "h5"],
        "structure_score": [0.4, 0.2, 0.6, 0.9, np.nan, np.nan],
    })
    base = pd.DataFrame({
        "headline_id": ["h4", "h2", "h1", "h1", "h5"],
        "structure_score": [0.7, 0.3, 0.1, 0.3, 0.5],
    })
    p, b = per_headline_pairs(policy, base, "structure_score")
    # h1: policy mean 0.4, base 0.2; h2: policy 0.4 (NaN skipped), base 0.3; h3 only policy; h4 only base;
    # h5 has only NaN on the policy side
    assert p.tolist() == pytest.approx([0.4, 0.4])
    assert b.tolist() == pytest.approx([0.2, 0.3])
    e1, e2 = per_headline_pairs(policy.iloc[0:0], base, "structure_score")
    assert e1.size == 0 and e2.size == 0


def test_win_rate_comparison_matches_scipy_binomtest():
    c = win_rate_comparison("judge preference", wins=15, losses=3, ties=4)
    ref = stats.binomtest(15, 18, 0.5)
    ci = ref.proportion_ci(confidence_level=0.95, method="wilson")
    assert c.n == 18
    assert c.policy == pytest.approx(15 / 18) and c.base == pytest.approx(3 / 18)
    assert c.difference == pytest.approx(15 / 18 - 0.5)
    assert c.p_value == pytest.approx(ref.pvalue)
    assert (c.ci_low, c.ci_high) == (pytest.approx(ci.low), pytest.approx(ci.high))
    assert c.ci_low > 0.5 and c.label == "better"
    assert "exact binomial" in c.test and "Wilson" in c.test and "4 ties" in c.test


def test_win_rate_comparison_labels():
    assert win_rate_comparison("p", 3, 15).label == "worse"
    even = win_rate_comparison("p", 6, 4, ties=100)
    assert even.label == "no detectable difference" and even.n == 10 and even.policy == pytest.approx(0.6)
    empty = win_rate_comparison("p", 0, 0, ties=7)
    assert empty.n == 0 and empty.label == "not enough data" and math.isnan(empty.policy)


def test_comparisons_frame_and_as_row():
    c = paired_comparison("a", [1.0, 2.0, 3.0], [0.0, 0.5, 1.5])
    row = c.as_row()
    assert list(row) == ["metric", "policy", "base", "difference", "ci_low", "ci_high", "n", "test", "p_value", "label"]
    df = comparisons_frame([c, win_rate_comparison("b", 5, 1)])
    assert df["metric"].tolist() == ["a", "b"] and list(df.columns) == list(row)
    assert list(comparisons_frame([]).columns) == list(row)
    assert isinstance(c, Comparison)
