"""Per-day summary of the daily loop and its figures (PNG, matplotlib's Agg backend, no display)."""

from __future__ import annotations

import io
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.dates as mdates  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

SUMMARY_COLUMNS = [
    "date", "headlines", "rollouts", "mean_structure", "finished_share", "scored", "usable_share", "reward_n", "reward_avg",
    "reward_min", "reward_max", "reward_negatives", "negative_advantages", "trained", "steps", "loss", "kl_to_base",
    "grad_norm_median", "grad_norm_iqr", "clip_fraction", "policy_version", "gate", "gate_reason",
]


def day_summary(day: str, headlines: pd.DataFrame, rollouts: pd.DataFrame, scores: pd.DataFrame, training: pd.DataFrame) -> dict:
    """One row: what came in, what was generated, how it was scored, how training went."""
    t = training.iloc[0].to_dict() if not training.empty else {}
    usable = scores[scores["usable"].astype(bool)] if not scores.empty else scores
    rewards = usable["reward"] if len(usable) else pd.Series(dtype=float)
    return dict(
        date=day,
        headlines=int(len(headlines)),
        rollouts=int(len(rollouts)),
        mean_structure=float(rollouts["structure_score"].mean()) if len(rollouts) else np.nan,
        # share of notes that ended on their own (not at the length cap): a collapse shows here first
        finished_share=float(rollouts["finished"].astype(bool).mean()) if len(rollouts) else np.nan,
        scored=int(len(scores)),
        usable_share=float(scores["usable"].astype(bool).mean()) if len(scores) else np.nan,
        reward_n=int(len(rewards)),
        reward_avg=float(rewards.mean()) if len(rewards) else np.nan,
        reward_min=float(rewards.min()) if len(rewards) else np.nan,
        reward_max=float(rewards.max()) if len(rewards) else np.nan,
        reward_negatives=int((rewards < 0).sum()),
        negative_advantages=int((usable["advantage"] < 0).sum()) if len(usable) else 0,
        trained=bool(t.get("trained", False)),
        steps=int(t.get("steps", 0) or 0),
        loss=float(t.get("loss", np.nan)),
        kl_to_base=float(t.get("kl_to_base", np.nan)),
        grad_norm_median=float(t.get("grad_norm_median", np.nan)),
        grad_norm_iqr=float(t.get("grad_norm_iqr", np.nan)),
        clip_fraction=float(t.get("clip_fraction", np.nan)),
        policy_version=str(t.get("policy_version", "")),
        gate=str(t.get("gate", "")),
        gate_reason=str(t.get("gate_reason", "")),
    )


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _dates(summary: pd.DataFrame):
    return pd.to_datetime(summary["date"])


MAX_DATE_LABELS = 14


def _date_axis(ax, dates: pd.Series) -> None:
    """One tick per day (a label every k-th day past MAX_DATE_LABELS days), half a day of margin."""
    n = int(dates.nunique()) if len(dates) else 0
    every = max(1, math.ceil(n / MAX_DATE_LABELS))
    ax.xaxis.set_major_locator(mdates.DayLocator(interval=every))
    ax.xaxis.set_minor_locator(mdates.DayLocator())
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%b %d"))
    if n:
        half = pd.Timedelta(hours=12)
        ax.set_xlim(dates.min() - half, dates.max() + half)
    ax.grid(axis="y", alpha=0.3)
    ax.set_xlabel("partition day")
    ax.figure.autofmt_xdate()


def reward_figure(summary: pd.DataFrame) -> bytes:
    """Mean reward of the scored rollouts (min-max band) and mean structure score of the day's rollouts."""
    fig, ax = plt.subplots(figsize=(7, 3.2))
    x = _dates(summary)
    ax.fill_between(x, summary["reward_min"], summary["reward_max"], alpha=0.15, color="C0", label="reward min-max")
    ax.plot(x, summary["reward_avg"], "o-", color="C0", label="mean reward (scored day)")
    ax.plot(x, summary["mean_structure"], "s--", color="C2", label="mean structure score (rollouts)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_ylabel("[0, 1]")
    ax.set_title("Reward and structure per day")
    ax.legend(fontsize=8, loc="lower right")
    _date_axis(ax, x)
    return _png(fig)


def kl_figure(summary: pd.DataFrame) -> bytes:
    """Per-token KL(policy || base) on each day's own rollouts."""
    fig, ax = plt.subplots(figsize=(7, 3.2))
    x = _dates(summary)
    ax.plot(x, summary["kl_to_base"], "o-", color="C3")
    ax.set_ylabel("nats / token")
    ax.set_title("KL to the base model (policy's own samples)")
    _date_axis(ax, x)
    return _png(fig)


def pass_through_figure(summary: pd.DataFrame) -> bytes:
    """Share of scored rollouts in groups the judge answered (the rest are not trained on)."""
    fig, ax = plt.subplots(figsize=(7, 3.2))
    x = _dates(summary)
    share = summary["usable_share"]
    scored = share.notna().to_numpy()
    ax.bar(x[scored], share[scored], width=0.6, color="C1")
    for day in x[~scored]:  # the first day (and a day after a gap) has no rollouts of D-1 to score
        ax.text(day, 0.03, "nothing\nscored", ha="center", va="bottom", fontsize=7, color="0.4")
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("usable share")
    ax.set_title("Judge pass-through per day")
    _date_axis(ax, x)
    return _png(fig)


FIGURES = {"reward": reward_figure, "kl": kl_figure, "pass_through": pass_through_figure}

AB_METRICS = {
    "structure_score": "structure (policy - base)", "judge_win_rate": "judge win rate - 0.5",
    "hit_rate": "hit rate (policy - base)", "mean_vs_spy_pct": "mean vs SPY, pp (policy - base)",
}


def ab_figure(evals: pd.DataFrame) -> bytes:
    """Per day and metric: the policy-minus-base difference with its 95% interval (for the judge: win
    rate - 0.5); a dashed zero line is "no difference"."""
    fig, axes = plt.subplots(1, len(AB_METRICS), figsize=(12, 2.9), sharex=True)
    for ax, (metric, title) in zip(axes, AB_METRICS.items()):
        rows = evals[evals["metric"] == metric].sort_values("date") if len(evals) else evals
        x = pd.to_datetime(rows["date"]) if len(rows) else pd.Series(dtype="datetime64[ns]")
        if len(rows):
            shift = 0.5 if metric == "judge_win_rate" else 0.0  # its interval is of the win rate
            mid, low, high = rows["difference"].to_numpy(float), rows["ci_low"].to_numpy(float) - shift, rows["ci_high"].to_numpy(float) - shift
            ok = ~np.isnan(low) & ~np.isnan(high) & ~np.isnan(mid)
            ax.errorbar(x[ok], mid[ok], yerr=[mid[ok] - low[ok], high[ok] - mid[ok]], fmt="o", capsize=3, color="C0")
            for day in x[~ok]:
                ax.text(day, 0, "n/a", ha="center", va="bottom", fontsize=7, color="0.4")
        ax.axhline(0, color="0.5", linestyle="--", linewidth=1)
        ax.set_title(title, fontsize=9)
        _date_axis(ax, x)
        ax.set_xlabel("")
    fig.suptitle("Policy vs base, 95% intervals", fontsize=10)
    return _png(fig)


def equity_figure(daily: pd.DataFrame) -> bytes:
    """Equity of the policy's book, the base's book and SPY over the back-test's days (start 1.0)."""
    fig, ax = plt.subplots(figsize=(7, 3.2))
    x = pd.to_datetime(daily["date"]) if len(daily) else pd.Series(dtype="datetime64[ns]")
    for column, label, style in (("policy_equity", "policy book", "o-"), ("base_equity", "base book", "s--"), ("spy_equity", "SPY", "^:")):
        if len(daily):
            ax.plot(x, daily[column], style, label=label)
    if not len(daily):
        ax.text(0.5, 0.5, "no matured day yet", ha="center", va="center", transform=ax.transAxes, color="0.4")
    ax.axhline(1.0, color="0.6", linewidth=0.8)
    ax.set_ylabel("equity (start 1.0)")
    ax.set_title("Back-test: daily long/short books that follow the calls (net of costs)")
    if len(daily):
        ax.legend(fontsize=8, loc="best")
    _date_axis(ax, x)
    return _png(fig)
