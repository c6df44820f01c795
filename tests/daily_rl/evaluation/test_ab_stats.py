"""The A/B statistics of the policy against its base model: labels, paired t-test, win rate, per-headline pairing,
session clusters, overlapping books, and labels that always agree with the stored interval."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from outcome_flywheel.daily_rl.evaluation.ab_stats import (
    LABELS,
    MIN_PAIRS,
    MIN_SESSIONS,
    Comparison,
    comparisons_frame,
    label_for,
    paired_comparison,
    per_headline_pairs,
    session_comparison,
    session_differences,
    session_mean_interval,
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
    policy = [3.0, 5.0, 4.0, 8.0, 6.0, 4.0]
    base = [1.0, 4.0, 4.0, 5.0, 3.0, 2.0]  # differences 2, 1, 0, 3, 3, 2: mean 11 / 6
    c = paired_comparison("structure_score", policy, base)
    ref = stats.ttest_rel(policy, base)
    ci = ref.confidence_interval(confidence_level=0.95)
    assert c.policy == pytest.approx(5.0) and c.base == pytest.approx(19 / 6)
    assert c.difference == pytest.approx(11 / 6)
    assert c.n == 6
    assert c.p_value == pytest.approx(ref.pvalue)
    assert (c.ci_low, c.ci_high) == (pytest.approx(ci.low), pytest.approx(ci.high))
    d = np.array([2.0, 1.0, 0.0, 3.0, 3.0, 2.0])
    half = stats.t.ppf(0.975, 5) * d.std(ddof=1) / math.sqrt(6)
    assert c.ci_low == pytest.approx(11 / 6 - half) and c.ci_high == pytest.approx(11 / 6 + half)
    assert c.ci_low > 0 and c.label == "better"
    assert c.test == "paired t-test over headlines (per-headline means)"
    assert paired_comparison("loss", policy, base, higher_is_better=False).label == "worse"
    assert paired_comparison("x", base, policy).label == "worse"


def test_paired_comparison_covering_zero():
    c = paired_comparison("x", [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [2.0, 1.0, 4.0, 3.0, 6.0, 5.0])  # -1, 1, -1, 1, ...
    assert c.difference == 0.0 and c.ci_low < 0 < c.ci_high
    assert c.label == "no detectable difference"


def test_fewer_than_six_pairs_is_not_enough_data_with_no_interval():
    """Below MIN_PAIRS no exact paired test can reach 5%: no interval, no p-value, "not enough data"."""
    assert MIN_PAIRS == 6
    policy, base = [3.0, 5.0, 4.0, 8.0, 6.0], [1.0, 4.0, 4.0, 5.0, 3.0]  # the t-test alone would say "better"
    assert stats.ttest_rel(policy, base).pvalue < 0.05
    c = paired_comparison("x", policy, base)
    assert c.n == 5 and c.difference == pytest.approx(1.8) and c.label == "not enough data"
    assert math.isnan(c.ci_low) and math.isnan(c.ci_high) and math.isnan(c.p_value)


@pytest.mark.parametrize("shift", [0.0, 0.25, -0.25])
def test_zero_spread_interval_and_label_agree(shift):
    """Every difference equal: the t-test is undefined; the stored interval is the point and the label is read off it
    (the issue: [0.25, 0.25] was stored beside "no detectable difference")."""
    base = np.linspace(0.1, 0.9, 8)
    c = paired_comparison("structure_score", base + shift, base)
    assert c.difference == pytest.approx(shift)
    assert c.ci_low == pytest.approx(shift) and c.ci_high == pytest.approx(shift)
    assert c.label == label_for(c.ci_low, c.ci_high)
    if shift == 0.0:
        assert c.p_value == 1.0 and c.label == "no detectable difference"
    else:  # 8 of 8 on one side: the exact sign test, p = 2 / 2**8
        assert c.p_value == pytest.approx(2 / 2**8) and "sign test" in c.test
        assert c.label == ("better" if shift > 0 else "worse")
    few = paired_comparison("structure_score", base[:5] + shift, base[:5])
    assert few.label == "not enough data" and math.isnan(few.ci_low)


def test_paired_comparison_drops_nan_pairs_and_needs_two():
    c = paired_comparison("x", [1.0, np.nan, 3.0, 5.0], [0.0, 1.0, np.nan, 2.0])
    assert c.n == 2 and c.difference == pytest.approx(2.0)  # pairs (1, 0) and (5, 2)
    assert c.label == "not enough data"
    one = paired_comparison("x", [1.0, np.nan], [0.0, 1.0])
    assert one.n == 1 and one.label == "not enough data" and math.isnan(one.ci_low) and math.isnan(one.p_value)
    none = paired_comparison("x", [], [])
    assert none.n == 0 and none.label == "not enough data" and math.isnan(none.difference)
    with pytest.raises(ValueError):
        paired_comparison("x", [1.0, 2.0], [1.0])


def test_per_headline_pairs_aligns_by_headline_and_drops_one_sided():
    policy = pd.DataFrame(
        {"headline_id": ["h2", "h1", "h1", "h3", "h2", "h5"], "structure_score": [0.4, 0.2, 0.6, 0.9, np.nan, np.nan]}
    )
    base = pd.DataFrame({"headline_id": ["h4", "h2", "h1", "h1", "h5"], "structure_score": [0.7, 0.3, 0.1, 0.3, 0.5]})
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
    ci = ref.proportion_ci(confidence_level=0.95, method="exact")
    assert c.n == 18
    assert c.policy == pytest.approx(15 / 18) and c.base == pytest.approx(3 / 18)
    assert c.difference == pytest.approx(15 / 18 - 0.5)
    assert c.p_value == pytest.approx(ref.pvalue)
    assert (c.ci_low, c.ci_high) == (pytest.approx(ci.low), pytest.approx(ci.high))
    assert c.ci_low > 0.5 and c.label == "better"
    assert "exact binomial" in c.test and "Clopper-Pearson" in c.test and "4 ties" in c.test


def test_win_rate_comparison_labels():
    assert win_rate_comparison("p", 3, 15).label == "worse"
    even = win_rate_comparison("p", 6, 4, ties=100)
    assert even.label == "no detectable difference" and even.n == 10 and even.policy == pytest.approx(0.6)
    empty = win_rate_comparison("p", 0, 0, ties=7)
    assert empty.n == 0 and empty.label == "not enough data" and math.isnan(empty.policy)


def test_four_nil_is_not_better():
    """The issue: 4-0 (exact p = 0.125) was "better" from a Wilson interval. Below 6 decisive pairs the exact test
    cannot reach 5%: "not enough data"; 6-0 (p = 1/32) is the first "better"."""
    four = win_rate_comparison("judge_win_rate", 4, 0)
    assert four.label == "not enough data" and math.isnan(four.ci_low) and math.isnan(four.p_value)
    assert win_rate_comparison("judge_win_rate", 5, 0).label == "not enough data"
    six = win_rate_comparison("judge_win_rate", 6, 0)
    assert six.label == "better" and six.p_value == pytest.approx(1 / 32) and six.ci_low > 0.5
    assert win_rate_comparison("judge_win_rate", 5, 1).label == "no detectable difference"  # p = 0.22


def test_win_rate_label_agrees_with_the_exact_test_everywhere():
    """The stored interval excludes 0.5 exactly when the named test's p < 0.05 (Wilson fails this at 4-0, 8-1, ...)."""
    for n in range(MIN_PAIRS, 41):
        for wins in range(n + 1):
            c = win_rate_comparison("w", wins, n - wins)
            decided = c.label in ("better", "worse")
            assert decided == (c.p_value < 0.05), (wins, n, c)
            assert c.label == label_for(c.ci_low, c.ci_high, 0.5)


def _random_comparisons(rng):
    for _ in range(120):
        n = int(rng.integers(0, 14))
        shift = float(rng.choice([0.0, 0.5, 2.0]))
        p = rng.normal(shift, 1.0, n)
        b = rng.normal(0.0, 1.0, n)
        if rng.random() < 0.2:
            p = b + shift  # zero spread
        yield paired_comparison("x", p, b)
        wins = int(rng.integers(0, 12))
        yield win_rate_comparison("w", wins, int(rng.integers(0, 12)))
        days = int(rng.integers(1, 25))
        frame = pd.DataFrame(
            {
                "session": np.repeat(np.arange(days), 3),
                "headline_id": np.tile(["a", "b", "c"], days),
                "v": rng.normal(0, 1, 3 * days),
            }
        )
        yield session_comparison(
            "s",
            frame.assign(v=frame["v"] + shift),
            frame.assign(v=rng.normal(0, 1, 3 * days)),
            "v",
            horizon=int(rng.choice([1, 2])),
        )


def test_label_interval_and_p_value_always_agree():
    """One rule for every comparison: NaN interval <-> "not enough data"; otherwise the label is the interval's side
    of the null, and "better"/"worse" exactly when p < 0.05."""
    seen = set()
    for c in _random_comparisons(np.random.default_rng(7)):
        null = 0.5 if c.metric == "w" else 0.0
        seen.add(c.label)
        assert c.label == label_for(c.ci_low, c.ci_high, null), c
        assert (c.label == "not enough data") == math.isnan(c.ci_low) == math.isnan(c.p_value), c
        if c.label != "not enough data":
            assert c.ci_low <= c.ci_high
            assert (c.label in ("better", "worse")) == (c.p_value < 0.05), c
    assert seen == set(LABELS)


def test_comparisons_frame_and_as_row():
    c = paired_comparison("a", [1.0, 2.0, 3.0], [0.0, 0.5, 1.5])
    row = c.as_row()
    assert list(row) == ["metric", "policy", "base", "difference", "ci_low", "ci_high", "n", "test", "p_value", "label"]
    df = comparisons_frame([c, win_rate_comparison("b", 5, 1)])
    assert df["metric"].tolist() == ["a", "b"] and list(df.columns) == list(row)
    assert list(comparisons_frame([]).columns) == list(row)
    assert isinstance(c, Comparison)


def test_session_differences_pair_headlines_within_a_session():
    policy = pd.DataFrame(
        {
            "session": ["s1", "s1", "s1", "s2", "s2", "s3"],
            "headline_id": ["a", "a", "b", "a", "c", "a"],
            "v": [1.0, 3.0, 4.0, 5.0, 9.0, 1.0],
        }
    )
    base = pd.DataFrame(
        {"session": ["s1", "s1", "s2", "s2"], "headline_id": ["a", "b", "a", "b"], "v": [0.0, 2.0, 1.0, 7.0]}
    )
    per = session_differences(policy, base, "v")
    # s1: a 2 vs 0, b 4 vs 2 -> policy 3, base 1, difference 2; s2: only a is on both sides (5 vs 1); s3: base has none
    assert per["session"].tolist() == ["s1", "s2"]
    assert per["policy"].tolist() == [3.0, 5.0] and per["base"].tolist() == [1.0, 1.0]
    assert per["difference"].tolist() == [2.0, 4.0] and per["headlines"].tolist() == [2, 1]


def test_session_mean_interval_is_the_t_interval_and_needs_ten_sessions():
    assert MIN_SESSIONS == 10
    x = np.random.default_rng(1).normal(0.3, 1.0, 12)
    low, high, p, method = session_mean_interval(x)
    ref = stats.ttest_1samp(x, 0.0)
    assert (low, high) == (pytest.approx(ref.confidence_interval().low), pytest.approx(ref.confidence_interval().high))
    assert p == pytest.approx(ref.pvalue) and "t-interval" in method
    assert all(math.isnan(v) for v in session_mean_interval(x[:9])[:3])
    # five-session books: 10 x 5 sessions at least
    assert math.isnan(session_mean_interval(np.resize(x, 49), horizon=5)[0])
    assert not math.isnan(session_mean_interval(np.resize(x, 50), horizon=5)[0])


def test_one_session_is_never_enough_whatever_the_headlines_say():
    """The issue's case: two symbols on one day. Every headline rides the same session, so it is one unit."""
    rng = np.random.default_rng(3)
    base = pd.DataFrame(
        {"session": "2025-11-10", "headline_id": [f"h{i}" for i in range(16)], "v": -0.8 + rng.normal(0, 0.01, 16)}
    )  # the base's symbol fell 0.8 pp against SPY
    policy = base.assign(v=1.2 + rng.normal(0, 0.01, 16))  # the policy's rose 1.2 pp
    assert paired_comparison("x", policy["v"], base["v"]).label == "better"  # headlines as units: overclaims
    c = session_comparison("mean_vs_spy_pct", policy, base, "v")
    assert c.n == 1 and c.label == "not enough data" and math.isnan(c.ci_low)
    assert c.difference == pytest.approx(2.0, abs=0.02)  # noise N(0, 0.01) on 16 pairs: SE 0.0035, 0.02 = 5.7 SE


def _false_rate(labels) -> float:
    labels = list(labels)
    return sum(label in ("better", "worse") for label in labels) / len(labels)


def test_null_sessions_with_a_shared_daily_move_hold_the_level():
    """A small null simulation (fixed seed): each session's headlines share that day's move (a few symbols); policy
    and base are exchangeable. Clustered by session the labels are wrong at about the nominal 5%."""
    rng = np.random.default_rng(11)
    labels = []
    for _ in range(200):
        sessions, headlines = 12, 6
        day_move = np.repeat(rng.standard_t(4, sessions), headlines)  # common to every headline of a day
        frame = pd.DataFrame(
            {
                "session": np.repeat(np.arange(sessions), headlines),
                "headline_id": np.tile([f"h{i}" for i in range(headlines)], sessions),
            }
        )
        sign_p, sign_b = rng.choice([-1, 1], sessions * headlines), rng.choice([-1, 1], sessions * headlines)
        policy = frame.assign(v=sign_p * day_move + rng.normal(0, 0.2, len(frame)))
        base = frame.assign(v=sign_b * day_move + rng.normal(0, 0.2, len(frame)))
        labels.append(session_comparison("m", policy, base, "v").label)
    assert "not enough data" not in labels
    assert _false_rate(labels) <= 0.08


def test_overlapping_books_hold_the_level_only_when_the_overlap_is_counted():
    """Five-session books entered every session with a persistent position: consecutive books share 4 of 5 sessions.
    Treated as independent days the t-test says better/worse far too often; the horizon-aware bound does not."""
    rng = np.random.default_rng(5)
    as_h5, as_h1 = [], []
    for _ in range(400):
        steps = rng.normal(0, 1, 64)
        side = np.where(rng.random(60) < 0.9, 1.0, -1.0) * rng.choice([-1, 1])  # mostly one side all along
        books = side * np.array([steps[e + 1 : e + 6].sum() for e in range(60)])
        as_h5.append(label_for(*session_mean_interval(books, horizon=5)[:2]))
        as_h1.append(label_for(*session_mean_interval(books, horizon=1)[:2]))
    assert _false_rate(as_h1) > 0.15
    assert _false_rate(as_h5) <= 0.06
