"""AUC (equals scipy's Mann-Whitney U / n1 n2), its interval and label, rejected winners, drift, comments."""

import numpy as np
import pandas as pd
import pytest
from scipy.stats import mannwhitneyu

from outcome_flywheel.preferences.metrics import (
    LABEL_MARGINAL,
    LABEL_NONE,
    LABEL_USEFUL,
    NO_STYLE_SCORE,
    STYLE_BANDS,
    _fast_auc,
    approval_auc,
    auc_label,
    auc_report,
    bootstrap_auc_ci,
    drift_level,
    rejected_winners,
    sigmoid,
    style_comment,
)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_auc_is_mann_whitney_u_over_n1_n2(seed):
    rng = np.random.default_rng(seed)
    scores = np.round(rng.random(60), 1)  # many ties
    approved = rng.random(60) < 0.4
    u = mannwhitneyu(scores[approved], scores[~approved]).statistic
    expected = u / (approved.sum() * (~approved).sum())
    assert approval_auc(scores, approved) == pytest.approx(expected)
    assert _fast_auc(scores, approved) == pytest.approx(expected)


def test_auc_extremes_and_one_class():
    assert approval_auc([0.9, 0.8, 0.1, 0.2], [True, True, False, False]) == 1.0
    assert approval_auc([0.1, 0.2, 0.9, 0.8], [True, True, False, False]) == 0.0
    assert np.isnan(approval_auc([0.1, 0.2], [True, True]))


def test_random_labels_give_an_interval_covering_half_and_no_signal():
    rng = np.random.default_rng(3)
    scores = rng.random(44)
    approved = rng.random(44) < 0.5
    r = auc_report(scores, approved, n_boot=1000)
    assert r.auc_low < 0.5 < r.auc_high
    assert r.label == LABEL_NONE


def test_separable_scores_are_useful():
    rng = np.random.default_rng(4)
    approved = np.array([True] * 20 + [False] * 20)
    scores = np.where(approved, 0.7, 0.4) + rng.normal(0, 0.05, 40)
    r = auc_report(scores, approved, n_boot=500)
    assert r.auc > 0.9 and r.auc_low > 0.5 and r.label == LABEL_USEFUL


def test_labels():
    assert auc_label(0.7) == LABEL_USEFUL
    assert auc_label(0.65) == LABEL_MARGINAL and auc_label(0.55) == LABEL_MARGINAL
    assert auc_label(0.54) == LABEL_NONE
    assert auc_label(0.7, ci_low=0.48) == LABEL_NONE  # the interval still reaches chance


def test_bootstrap_is_reproducible():
    rng = np.random.default_rng(5)
    s, a = rng.random(30), rng.random(30) < 0.5
    assert bootstrap_auc_ci(s, a, n_boot=200, seed=1) == bootstrap_auc_ci(s, a, n_boot=200, seed=1)


def test_rejected_winners_filter_and_order():
    df = pd.DataFrame(
        {
            "decision_id": list("abcdefgh"),
            "decision_date": ["2025-11-26"] * 8,
            "decision": ["reject", "reject", "approve", "reject", "override", "reject", "reject", "reject"],
            "style_match_score": [0.9, 0.4, 0.9, 0.6, 0.9, 0.55, 0.7, 0.8],
            "vs_spy_pct": [1.0, 2.0, 2.0, -1.0, 2.0, 0.5, 3.0, np.nan],
            "proposal_plan": ["p"] * 8,
        }
    )
    assert rejected_winners(df)["decision_id"].tolist() == ["a", "g", "f"]
    assert len(rejected_winners(pd.concat([df] * 3), top=5)) == 5


def test_drift_is_the_mean_of_the_last_three():
    assert drift_level([0.9, 0.5, 0.52, 0.56])["drift"] == "high"  # (0.5 + 0.52 + 0.56) / 3 < 0.55
    d = drift_level([0.3, 0.6, 0.6, 0.6])
    assert d["drift"] == "low" and d["mean_auc_last"] == pytest.approx(0.6) and d["n_evals"] == 3
    assert drift_level([])["drift"] == "unknown"


def test_style_comment_band_edges():
    consistent, towards, away, inconsistent = (comment for _, comment in STYLE_BANDS)
    # Each edge belongs to the band above it; a hair below it, the band below.
    assert [edge for edge, _ in STYLE_BANDS][:3] == [0.75, 0.66, 0.5]
    assert style_comment(1.0) == style_comment(0.75) == consistent
    assert style_comment(0.7499) == style_comment(0.66) == towards
    assert style_comment(0.6599) == style_comment(0.5) == away
    assert style_comment(0.4999) == style_comment(0.0) == inconsistent
    assert len({consistent, towards, away, inconsistent}) == 4
    assert style_comment(float("nan")) == style_comment(None) == NO_STYLE_SCORE
    # The scores an operator's approvals and rejections typically get (medians 0.70-0.82 and
    # 0.56-0.71 on trained adapters) read differently; the old brackets called both "Leans towards".
    assert style_comment(0.74) == towards and style_comment(0.58) == away
    assert sigmoid(0.0) == 0.5 and sigmoid(-800) == pytest.approx(0.0)
