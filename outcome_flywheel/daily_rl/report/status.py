"""The daily loop's state and history, read from the warehouse and the checkpoint folder (the
service's `/api/rl/status` and `/api/rl/history`, the status page and its figures)."""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from typing import Any

import pandas as pd

from outcome_flywheel.daily_rl.policy.checkpoints import read_checkpoint
from outcome_flywheel.daily_rl.report import charts
from outcome_flywheel.daily_rl.report.summary import hit_rate_by_day
from outcome_flywheel.json_rows import records

CHECKPOINTS = ("checkpoints", "policy")


def daily_status(warehouse) -> dict[str, Any]:
    """The checkpoint `latest` points at (with its gate), the last day's training row, the last
    evaluation against the base, and the last report's reward."""
    latest = warehouse.path(*CHECKPOINTS, "latest")
    checkpoint = None
    if latest.exists():
        info = read_checkpoint(latest.resolve()) or {}
        checkpoint = {
            "path": str(latest.resolve()),
            **{
                k: info.get(k)
                for k in (
                    "date",
                    "policy_version",
                    "kind",
                    "parent_version",
                    "trained",
                    "gate",
                    "gate_reason",
                    "verified",
                )
            },
        }
    training = warehouse.read_all("policy_training")
    last_training = (
        records(
            training.sort_values("date").tail(1),
            ["date", "policy_version", "trained", "examples", "loss", "kl_to_base", "gate", "gate_reason"],
        )
        if len(training)
        else []
    )
    evaluation = warehouse.read_all("policy_eval")
    last_eval: dict[str, Any] | None = None
    if len(evaluation):
        day = evaluation["date"].max()
        rows = evaluation[evaluation["date"] == day]
        last_eval = {
            "date": day,
            "metrics": records(
                rows, ["metric", "status", "policy", "base", "difference", "ci_low", "ci_high", "n", "label"]
            ),
        }
    report = warehouse.read_all("daily_report")
    last_report = (
        records(
            report.sort_values("date").tail(1),
            ["date", "headlines", "rollouts", "mean_structure", "reward_avg", "trained", "gate"],
        )
        if len(report)
        else []
    )
    return {
        "latest_checkpoint": checkpoint,
        "last_training": last_training[0] if last_training else None,
        "last_evaluation": last_eval,
        "last_report": last_report[0] if last_report else None,
        "days_scored": int(report["date"].nunique()) if len(report) else 0,
    }


PRICE_HISTORY = {
    "mean_price_reward": "mean_price_reward",
    "price_notes_trained": "price_notes_trained",
    "staleness_mean": "staleness_mean",
    "clip_fraction": "clip_fraction",
}  # price_training -> history


def daily_history(warehouse) -> list[dict[str, Any]]:
    """One row per day: mean reward, GSPO loss, KL to the base, the gate, structure of policy and base, the hit
    rate of the day's matured calls (policy, base), and the delayed price step (mean price reward, notes trained on
    price, mean staleness, the GSPO clip fraction of the day's update)."""
    report = warehouse.read_all("daily_report")
    training = warehouse.read_all("policy_training")
    if report.empty and training.empty:
        return []
    days = sorted(set(report.get("date", pd.Series(dtype=str))) | set(training.get("date", pd.Series(dtype=str))))
    frame = pd.DataFrame({"date": days})
    if len(report):
        frame = frame.merge(report[["date", "reward_avg", "mean_structure"]], on="date", how="left")
    if len(training):
        frame = frame.merge(
            training[["date", "policy_version", "trained", "loss", "kl_to_base", "gate"]], on="date", how="left"
        )
    evaluation = warehouse.read_all("policy_eval")
    if len(evaluation):
        structure = evaluation[evaluation["metric"] == "structure_score"][["date", "policy", "base", "label"]]
        structure = structure.rename(
            columns={"policy": "structure_policy", "base": "structure_base", "label": "structure_label"}
        )
        frame = frame.merge(structure, on="date", how="left")
    hits = hit_rate_by_day(warehouse.read_all("rollout_outcomes"))
    if len(hits):
        frame = frame.merge(hits[["date", "policy_hit_rate", "base_hit_rate"]], on="date", how="left")
    price = warehouse.read_all("price_training")
    if len(price):
        present = [c for c in PRICE_HISTORY if c in price.columns]
        frame = frame.merge(price[["date"] + present].rename(columns=PRICE_HISTORY), on="date", how="left")
    return records(frame, list(frame.columns))


# -- figures of the status page ----------------------------------------------------------------------------------

FIGURE_TABLES = ("daily_report", "rollout_outcomes", "price_training")
_figure_cache: OrderedDict = OrderedDict()
_figure_lock = threading.Lock()


def _v(value, digits: int = 3) -> str:
    return "none" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{float(value):.{digits}f}"


def _span(frame: pd.DataFrame) -> str:
    days = sorted(frame["date"].astype(str))
    return f"{len(days)} day{'s' if len(days) != 1 else ''} from {days[0]} to {days[-1]}"


def _alts(report: pd.DataFrame, hits: pd.DataFrame, price: pd.DataFrame) -> dict[str, str]:
    """Alt text of each figure: what it shows, over which days, and the last day's numbers (for a reader who
    cannot see the picture)."""
    alts = {}
    if len(report):
        last = report.iloc[-1]
        alts["reward"] = (
            f"Line chart of the mean reward (with its min-max band) and the mean structure score per day, "
            f"{_span(report)}; on {last['date']}: mean reward {_v(last['reward_avg'])}, structure {_v(last['mean_structure'])}."
        )
        alts["kl"] = (
            f"Line chart of the per-token KL of each day's policy to the base, {_span(report)}; "
            f"on {last['date']}: {_v(last['kl_to_base'], 4)} nats per token."
        )
    if len(hits):
        last = hits.iloc[-1]
        alts["hit_rate"] = (
            f"Line chart of the hit rate of each day's matured calls, policy vs base, {_span(hits)}; on {last['date']}: "
            f"policy {_v(last['policy_hit_rate'])} over {int(last['policy_calls'])} calls, base {_v(last['base_hit_rate'])} "
            f"over {int(last['base_calls'])}; 0.5 is a coin flip."
        )
    if len(price):
        last = price.iloc[-1]
        get = last.get
        alts["price"] = (
            f"Line chart of the mean price reward of the notes trained on price per training day, {_span(price)}; "
            f"on {last['date']}: {_v(get('mean_price_reward'))} over {_v(get('price_notes_trained'), 0)} notes, "
            f"{_v(get('price_notes_waiting'), 0)} waiting."
        )
        alts["off_policy"] = (
            f"Two line charts per training day, {_span(price)}: staleness of the groups trained on price and "
            f"the clip fraction; on {last['date']}: mean staleness {_v(get('staleness_mean'), 1)} policy updates "
            f"(max {_v(get('staleness_max'), 0)}, limit {_v(get('max_staleness'), 0)}), clip fraction "
            f"{_v(get('clip_fraction'))}, IS ratio truncated in {_v(get('is_truncated_fraction'))}."
        )
    return alts


FIGURE_TITLES = {
    "reward": "Reward and structure per day",
    "kl": "KL to the base model",
    "hit_rate": "Hit rate of each day's calls, policy vs base",
    "price": "Price reward per training day",
    "off_policy": "Staleness of the price step and the update's clip fraction",
}


def _draw(warehouse) -> list[dict[str, Any]]:
    report = warehouse.read_all("daily_report")
    report = report.sort_values("date").reset_index(drop=True) if len(report) else report
    hits = hit_rate_by_day(warehouse.read_all("rollout_outcomes"))
    price = warehouse.read_all("price_training")
    price = price.sort_values("date").reset_index(drop=True) if len(price) else price
    makers = {
        "reward": lambda: charts.reward_figure(report),
        "kl": lambda: charts.kl_figure(report),
        "hit_rate": lambda: charts.hit_rate_figure(hits),
        "price": lambda: charts.price_reward_figure(price),
        "off_policy": lambda: charts.off_policy_figure(price),
    }
    alts = _alts(report, hits, price)
    figures = []
    for name, make in makers.items():
        if name in ("reward", "kl") and report.empty:
            continue  # nothing reported yet: no empty axes
        figures.append(
            {
                "name": name,
                "title": FIGURE_TITLES[name],
                "png": make(),
                "alt": alts.get(name, f"{FIGURE_TITLES[name]}: nothing recorded yet."),
            }
        )
    return figures


def daily_figures(warehouse, cache_size: int = 4) -> list[dict[str, Any]]:
    """The status page's figures (name, title, alt text, PNG bytes): reward and structure, KL to the base, the hit
    rate of each day's calls, the price reward, the price step's staleness and the update's clip fraction. Drawn once per state
    of the tables they read (their files' names, sizes and times), so a page view does not redraw unchanged
    figures. Empty when nothing has been reported or trained on price yet."""
    try:
        key = (warehouse.url, tuple(f for t in FIGURE_TABLES for f in warehouse.files(t)))  # locations, sizes, times
    except FileNotFoundError:  # a partition rewritten (temp file + rename) while we looked: draw, do not cache
        return _draw(warehouse)
    if len(key[1]) == 0:
        return []
    with _figure_lock:
        if key in _figure_cache:
            _figure_cache.move_to_end(key)
            return _figure_cache[key]
    figures = _draw(warehouse)
    with _figure_lock:
        _figure_cache[key] = figures
        while len(_figure_cache) > cache_size:
            _figure_cache.popitem(last=False)
    return figures
