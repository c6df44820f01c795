"""The daily loop's figures as PNG bytes, drawn server-side with matplotlib for `daily_report` and the
service's status page (one drawing for both: the same curves in the Dagster UI and in the browser).

Each figure is a `matplotlib.figure.Figure` rendered by the Agg canvas, never through pyplot: pyplot keeps
global state, and the service draws from several request threads at once."""

from __future__ import annotations

import io
import math
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from matplotlib.figure import Figure

MAX_DATE_LABELS = 14
WIDE = (7, 3.2)


def _figure(size: tuple[float, float]) -> "Figure":
    """A new figure; matplotlib is imported when the first chart is drawn, not by every process that loads
    the definitions (code servers, run workers: ~0.4 s each)."""
    from matplotlib.figure import Figure

    return Figure(figsize=size)


def png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return buf.getvalue()


def _dates(frame: pd.DataFrame) -> pd.Series:
    return pd.to_datetime(frame["date"]) if len(frame) else pd.Series(dtype="datetime64[ns]")


def _date_axis(ax, dates: pd.Series) -> None:
    """One tick per day (a label every k-th day past MAX_DATE_LABELS days), half a day of margin."""
    import matplotlib.dates as mdates

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


def _nothing(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.4")


def _column(frame: pd.DataFrame, name: str) -> pd.Series:
    """A numeric column, NaN where the frame lacks it (an older table, a day with nothing to say)."""
    return (
        pd.to_numeric(frame[name], errors="coerce") if name in frame.columns else pd.Series(np.nan, index=frame.index)
    )


# -- the daily_report table (one row per day) -----------------------------------------------------------------------


def reward_figure(summary: pd.DataFrame) -> bytes:
    """Mean reward of the scored rollouts (min-max band) and mean structure score of the day's rollouts."""
    fig = _figure(WIDE)
    ax = fig.subplots()
    x = _dates(summary)
    ax.fill_between(x, summary["reward_min"], summary["reward_max"], alpha=0.15, color="C0", label="reward min-max")
    ax.plot(x, summary["reward_avg"], "o-", color="C0", label="mean reward (scored day)")
    ax.plot(x, summary["mean_structure"], "s--", color="C2", label="mean structure score (rollouts)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_ylabel("[0, 1]")
    ax.set_title("Reward and structure per day")
    ax.legend(fontsize=8, loc="lower right")
    _date_axis(ax, x)
    return png(fig)


def kl_figure(summary: pd.DataFrame) -> bytes:
    """Per-token KL(policy || base) on each day's own rollouts."""
    fig = _figure(WIDE)
    ax = fig.subplots()
    x = _dates(summary)
    ax.plot(x, summary["kl_to_base"], "o-", color="C3")
    ax.set_ylabel("nats / token")
    ax.set_title("KL to the base model (policy's own samples)")
    _date_axis(ax, x)
    return png(fig)


def pass_through_figure(summary: pd.DataFrame) -> bytes:
    """Share of scored rollouts in groups the judge answered (the rest are not trained on)."""
    fig = _figure(WIDE)
    ax = fig.subplots()
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
    return png(fig)


FIGURES = {"reward": reward_figure, "kl": kl_figure, "pass_through": pass_through_figure}


# -- policy vs base ------------------------------------------------------------------------------------------------

AB_METRICS = {
    "structure_score": "structure (policy - base)",
    "judge_win_rate": "judge win rate - 0.5",
    "hit_rate": "hit rate (policy - base)",
    "mean_vs_spy_pct": "mean vs SPY, pp (policy - base)",
}


def ab_figure(evals: pd.DataFrame) -> bytes:
    """Per day and metric: the policy-minus-base difference with its 95% interval (for the judge: win
    rate - 0.5); a dashed zero line is "no difference"."""
    fig = _figure((12, 2.9))
    axes = fig.subplots(1, len(AB_METRICS), sharex=True)
    for ax, (metric, title) in zip(axes, AB_METRICS.items()):
        rows = evals[evals["metric"] == metric].sort_values("date") if len(evals) else evals
        x = _dates(rows)
        if len(rows):
            shift = 0.5 if metric == "judge_win_rate" else 0.0  # its interval is of the win rate
            mid, low, high = (
                rows["difference"].to_numpy(float),
                rows["ci_low"].to_numpy(float) - shift,
                rows["ci_high"].to_numpy(float) - shift,
            )
            ok = ~np.isnan(low) & ~np.isnan(high) & ~np.isnan(mid)
            ax.errorbar(x[ok], mid[ok], yerr=[mid[ok] - low[ok], high[ok] - mid[ok]], fmt="o", capsize=3, color="C0")
            for day in x[~ok]:
                ax.text(day, 0, "n/a", ha="center", va="bottom", fontsize=7, color="0.4")
        ax.axhline(0, color="0.5", linestyle="--", linewidth=1)
        ax.set_title(title, fontsize=9)
        _date_axis(ax, x)
        ax.set_xlabel("")
    fig.suptitle("Policy vs base, 95% intervals", fontsize=10)
    return png(fig)


def _calls_range(calls: pd.Series) -> str:
    known = calls[calls > 0]
    if not len(known):
        return "no matured call"
    low, high = int(known.min()), int(known.max())
    return f"{low} matured calls a day" if low == high else f"{low}-{high} matured calls a day"


def hit_rate_figure(by_day: pd.DataFrame) -> bytes:
    """Hit rate (share of matured calls with vs_spy_pct > 0) of each day's calls, policy and base; 0.5 is a coin
    flip; the legend says how many matured calls a day it is over. `by_day`: `summary.hit_rate_by_day`."""
    fig = _figure(WIDE)
    ax = fig.subplots()
    x = _dates(by_day)
    if len(by_day):
        for side, style, color in (("policy", "o-", "C0"), ("base", "s--", "C7")):
            calls = _column(by_day, f"{side}_calls").fillna(0)
            ax.plot(x, _column(by_day, f"{side}_hit_rate"), style, color=color, label=f"{side} ({_calls_range(calls)})")
        ax.legend(fontsize=8, loc="upper right")
    else:
        _nothing(ax, "no matured call yet")
    ax.axhline(0.5, color="0.6", linestyle=":", linewidth=1)
    ax.set_ylim(-0.02, 1.02)
    ax.set_ylabel("hit rate (vs SPY > 0)")
    ax.set_title("Hit rate of each day's calls, policy vs base")
    _date_axis(ax, x)
    return png(fig)


def equity_figure(daily: pd.DataFrame) -> bytes:
    """Equity of the policy's book, the base's book and SPY over the back-test's days (start 1.0)."""
    fig = _figure(WIDE)
    ax = fig.subplots()
    x = _dates(daily)
    for column, label, style in (
        ("policy_equity", "policy book", "o-"),
        ("base_equity", "base book", "s--"),
        ("spy_equity", "SPY", "^:"),
    ):
        if len(daily):
            ax.plot(x, daily[column], style, label=label)
    if not len(daily):
        _nothing(ax, "no matured day yet")
    ax.axhline(1.0, color="0.6", linewidth=0.8)
    ax.set_ylabel("equity (start 1.0)")
    ax.set_title("Back-test: daily long/short books that follow the calls (net of costs)")
    if len(daily):
        ax.legend(fontsize=8, loc="best")
    _date_axis(ax, x)
    return png(fig)


# -- the delayed price step (table price_training, one row per training day) ----------------------------------------


def price_reward_figure(price: pd.DataFrame) -> bytes:
    """Mean price reward of the notes trained on price each day (0.5 = a costless coin flip), with the number of
    notes trained and still waiting; a day with none trained says so."""
    fig = _figure(WIDE)
    ax = fig.subplots()
    x = _dates(price)
    if len(price):
        reward, trained, waiting = (
            _column(price, c) for c in ("mean_price_reward", "price_notes_trained", "price_notes_waiting")
        )
        has = reward.notna().to_numpy() & (trained.fillna(0) > 0).to_numpy()
        ax.plot(x[has], reward[has], "o-", color="C4", label="mean price reward of the notes trained")
        for day, r, n, w, ok in zip(x, reward, trained, waiting, has):
            label = f"{int(n)} trained" if ok else "none\nmatured"
            if w == w and w:
                label += f"\n{int(w)} waiting"
            ax.text(day, (r if ok else 0.5) - 0.05, label, ha="center", va="top", fontsize=7, color="0.35")
        ax.legend(fontsize=8, loc="upper right")
    else:
        _nothing(ax, "no price training yet")
    ax.axhline(0.5, color="0.6", linestyle=":", linewidth=1)
    ax.set_ylim(-0.02, 1.02)
    ax.set_ylabel("price reward [0, 1]")
    ax.set_title("Price reward per training day (notes whose calls matured)")
    _date_axis(ax, x)
    return png(fig)


def off_policy_figure(price: pd.DataFrame) -> bytes:
    """Left: staleness (policy updates between a note's sampler and the day's parent) of the groups trained on
    price, mean with a min-max band, and the limit past which groups are dropped. Right: the share of sequences
    whose IS ratio hit the TIS cap, and the GSPO clip fraction of the day's whole update (judged and matured notes)."""
    fig = _figure((12, 3.1))
    left, right = fig.subplots(1, 2)
    x = _dates(price)
    if len(price):
        low, mean, high = (_column(price, f"staleness_{s}") for s in ("min", "mean", "max"))
        left.fill_between(x, low, high, alpha=0.15, color="C5", label="min-max")
        left.plot(x, mean, "o-", color="C5", label="mean staleness")
        limit = _column(price, "max_staleness").dropna()
        top = float(np.nanmax([high.max(), mean.max(), 1.0]))
        if len(limit):
            left.axhline(
                float(limit.iloc[-1]), color="C3", linestyle="--", linewidth=1, label="max staleness (dropped above)"
            )
            top = max(top, float(limit.iloc[-1]))
        left.set_ylim(0, top * 1.35)  # room for the legend above the curves
        left.legend(fontsize=8, loc="upper left")
        right.plot(x, _column(price, "clip_fraction"), "o-", color="C1", label="clip fraction (the day's GSPO update)")
        right.plot(
            x, _column(price, "is_truncated_fraction"), "s--", color="C6", label="IS ratio truncated (at the cap)"
        )
        right.legend(fontsize=8, loc="upper left")
    else:
        for ax in (left, right):
            _nothing(ax, "no price training yet")
    left.set_ylabel("policy updates")
    left.set_title("Staleness of the groups trained on price", fontsize=10)
    right.set_ylim(-0.02, 1.02) if not len(price) else right.set_ylim(-0.02, 1.15)
    right.set_ylabel("share of sequences")
    right.set_title("Clip fraction of the update, IS ratio truncated in the price step", fontsize=10)
    for ax in (left, right):
        _date_axis(ax, x)
    return png(fig)
