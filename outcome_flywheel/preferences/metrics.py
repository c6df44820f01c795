"""How well the adapter's style score separates what the operator approved: AUC with a bootstrap
interval and an honest label, rejected winners, drift, and the comment shown with a style score.

AUC = Mann-Whitney U / (n1 * n2) over (style score, decision == approve): the chance that a random
approved proposal scores above a random not-approved one (ties count half).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np
import pandas as pd

USEFUL = 0.65
MARGINAL = 0.55
DRIFT_THRESHOLD = 0.55
DRIFT_WINDOW = 3

LABEL_USEFUL = "useful"
LABEL_MARGINAL = "marginal"
LABEL_NONE = "no useful signal yet"


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def approval_auc(scores: Sequence[float], approved: Sequence[bool]) -> float:
    """U / (n1 n2) from scipy's Mann-Whitney U of approved scores against the others; NaN with one class."""
    from scipy.stats import mannwhitneyu  # imported where it is used: scipy.stats is ~0.8 s of loading the definitions

    s = np.asarray(scores, dtype=float)
    a = np.asarray(approved, dtype=bool)
    pos, neg = s[a], s[~a]
    if len(pos) == 0 or len(neg) == 0:
        return float("nan")
    u = mannwhitneyu(pos, neg, alternative="two-sided").statistic
    return float(u) / (len(pos) * len(neg))


def bootstrap_auc_ci(
    scores: Sequence[float], approved: Sequence[bool], n_boot: int = 2000, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Percentile bootstrap interval of the AUC (resampling decisions; one-class resamples skipped)."""
    s = np.asarray(scores, dtype=float)
    a = np.asarray(approved, dtype=bool)
    if a.all() or not a.any():
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    stats = []
    n = len(s)
    for _ in range(n_boot):
        idx = rng.integers(0, n, n)
        sa = a[idx]
        if sa.all() or not sa.any():
            continue
        stats.append(_fast_auc(s[idx], sa))
    if not stats:
        return float("nan"), float("nan")
    lo, hi = np.percentile(stats, [(1 - level) / 2 * 100, (1 + level) / 2 * 100])
    return float(lo), float(hi)


def _fast_auc(s: np.ndarray, a: np.ndarray) -> float:
    # Rank-sum form of the same U (average ranks for ties), vectorised for the bootstrap.
    from scipy.stats import rankdata

    ranks = rankdata(s)
    n1 = int(a.sum())
    n2 = len(s) - n1
    u = ranks[a].sum() - n1 * (n1 + 1) / 2
    return float(u / (n1 * n2))


def auc_label(auc: float, ci_low: float | None = None) -> str:
    """useful > 0.65, marginal 0.55-0.65, else no useful signal yet. When an interval is given and
    its lower end does not clear 0.5, the label is `no useful signal yet` whatever the point value:
    a small holdout can land at 0.6 by chance."""
    if auc is None or math.isnan(auc):
        return LABEL_NONE
    if ci_low is not None and not math.isnan(ci_low) and ci_low <= 0.5:
        return LABEL_NONE
    if auc > USEFUL:
        return LABEL_USEFUL
    if auc >= MARGINAL:
        return LABEL_MARGINAL
    return LABEL_NONE


@dataclass
class AucReport:
    auc: float
    auc_low: float
    auc_high: float
    n_holdout: int
    n_approved: int
    label: str

    def as_dict(self) -> dict:
        return asdict(self)


def auc_report(scores: Sequence[float], approved: Sequence[bool], n_boot: int = 2000, seed: int = 0) -> AucReport:
    auc = approval_auc(scores, approved)
    lo, hi = bootstrap_auc_ci(scores, approved, n_boot=n_boot, seed=seed)
    return AucReport(
        auc=auc,
        auc_low=lo,
        auc_high=hi,
        n_holdout=len(scores),
        n_approved=int(np.sum(approved)),
        label=auc_label(auc, lo),
    )


def rejected_winners(scored: pd.DataFrame, top: int = 5) -> pd.DataFrame:
    """Proposals the operator rejected that the adapter scores >= 0.5 and that beat SPY afterwards:
    highest score first (then the larger excess return)."""
    m = (scored["decision"] == "reject") & (scored["style_match_score"] >= 0.5) & (scored["vs_spy_pct"] > 0)
    cols = ["decision_id", "decision_date", "style_match_score", "vs_spy_pct", "proposal_plan"]
    cols = [c for c in cols if c in scored.columns]
    return (
        scored.loc[m, cols]
        .sort_values(["style_match_score", "vs_spy_pct"], ascending=False)
        .head(top)
        .reset_index(drop=True)
    )


def drift_level(aucs: Sequence[float], window: int = DRIFT_WINDOW, threshold: float = DRIFT_THRESHOLD) -> dict:
    """Mean of the last `window` AUCs (oldest first in `aucs`); below `threshold` -> `high`."""
    vals = [a for a in aucs if a is not None and not math.isnan(a)]
    if not vals:
        return {"mean_auc_last": float("nan"), "n_evals": 0, "drift": "unknown"}
    last = vals[-window:]
    mean = float(np.mean(last))
    return {"mean_auc_last": mean, "n_evals": len(last), "drift": "high" if mean < threshold else "low"}


# The sentence shown with a style-match score, by the lowest edge the score reaches. The score,
# sigmoid(beta * margin against holding), is not centred on 0.5: the adapter learns that plans beat
# holding more often than not (approvals, and turned-down plans that rallied, trained as swaps), so
# with the default WeightedDPOConfig the holdout proposals an operator approved score a median
# 0.70-0.82 and those it turned down 0.56-0.71 (the bundled sample and the ticker, size and mix
# operators of benchmarks/flywheel_auc.py; tiny-local). Edges from those holdouts:
#   0.75  about the median approved score: as high as a typical past approval;
#   0.66  the edge that best splits approved from turned-down (mean balanced accuracy 0.71 over the
#         four operators; 0.60-0.80 each), so the typical approval and the typical rejection differ;
#   0.50  below it the adapter prefers holding to the plan.
# Re-measure when the trainer's defaults (beta, epochs, learning rate) change.
STYLE_BANDS: tuple[tuple[float, str], ...] = (
    (0.75, "Consistent with your past approvals."),
    (0.66, "Leans towards your past approvals."),
    (0.50, "Leans away from your past approvals; worth a second look."),
    (float("-inf"), "Inconsistent with your past pattern; review carefully."),
)
NO_STYLE_SCORE = "No preference adapter yet; no style score."
BAND_NAMES = (
    "consistent",
    "leans-towards",
    "leans-away",
    "inconsistent",
)  # one per STYLE_BANDS row (the page's colours)


def style_comment(score: float | None) -> str:
    """The sentence shown with a style-match score (`STYLE_BANDS`); no score: no adapter yet."""
    if score is None or math.isnan(score):
        return NO_STYLE_SCORE
    return next(comment for edge, comment in STYLE_BANDS if score >= edge)


def style_band(score: float | None) -> str:
    """The band name of a score (`BAND_NAMES`, by the `STYLE_BANDS` edges), `none` without a score."""
    if score is None or math.isnan(score):
        return "none"
    return next(name for (edge, _), name in zip(STYLE_BANDS, BAND_NAMES) if score >= edge)
