"""Per-day summary of the daily loop, and the per-day series its report and the status page draw (the
figures themselves are in `charts`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from outcome_flywheel.daily_rl.policy import prompt_evolver as evolver
from outcome_flywheel.models.prompts import BASE_PROMPT_VERSION

# The `daily_report` table's stored columns, in order: column -> (type, description) as the Dagster catalog
# shows them (assets/catalog.py reads them from here).
SUMMARY_COLUMN_SCHEMA: dict[str, tuple[str, str]] = {
    "date": ("string", "Partition day D."),
    "headlines": ("int", "Headlines of D."),
    "rollouts": ("int", "Rollouts generated for D."),
    "mean_structure": ("float", "Mean structure score of D's rollouts."),
    "finished_share": ("float", "Share of D's notes that ended on their own (not at the length cap)."),
    "scored": ("int", "Rollouts of D-1 scored on D."),
    "usable_share": ("float", "Share of scored rollouts in groups the judge answered (pass-through)."),
    "reward_n": ("int", "Usable scored rollouts."),
    "reward_avg": ("float", "Mean reward of the usable scored rollouts."),
    "reward_min": ("float", "Lowest reward."),
    "reward_max": ("float", "Highest reward."),
    "reward_negatives": ("int", "Rewards below 0 (should stay 0)."),
    "negative_advantages": ("int", "Usable rollouts with a negative advantage (pushed down by training)."),
    "trained": ("bool", "GSPO ran on D."),
    "steps": ("int", "Optimiser steps."),
    "loss": ("float", "Mean GSPO loss."),
    "kl_to_base": ("float", "Per-token KL to the base model, nats."),
    "grad_norm_median": ("float", "Median gradient norm."),
    "grad_norm_iqr": ("float", "Interquartile range of the gradient norms."),
    "clip_fraction": ("float", "Share of clipped GSPO ratios."),
    "policy_version": ("string", "Checkpoint of D."),
    "gate": ("string", "Evaluation gate of D's update: accepted, rejected (the parent's weights stay) or not_trained."),
    "gate_reason": ("string", "Why the gate decided so."),
}
SUMMARY_COLUMNS = list(SUMMARY_COLUMN_SCHEMA)


def day_summary(
    day: str, headlines: pd.DataFrame, rollouts: pd.DataFrame, scores: pd.DataFrame, training: pd.DataFrame
) -> dict:
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


def hit_rate_by_day(outcomes: pd.DataFrame) -> pd.DataFrame:
    """Per prediction day: the hit rate (share of matured calls with vs_spy_pct > 0) of the policy's and of the
    base's calls, and how many matured calls each is over. A plain share per day, to draw learning over days;
    the A/B's interval and label are `policy_eval`'s (pooled over sessions). Look-ahead days (`look_ahead`) are
    left out, both sides, as in the A/B."""
    columns = ["date", "policy_hit_rate", "policy_calls", "base_hit_rate", "base_calls"]
    matured = outcomes[outcomes["status"] == "matured"] if len(outcomes) else outcomes
    if "look_ahead" in matured.columns and len(matured):
        flagged = set(matured.loc[matured["look_ahead"].fillna(False).astype(bool), "date"].astype(str))
        matured = matured[~matured["date"].astype(str).isin(flagged)]
    if matured.empty:
        return pd.DataFrame(columns=columns)
    hits = (pd.to_numeric(matured["vs_spy_pct"], errors="coerce") > 0).astype(float)
    grouped = hits.groupby([matured["date"].astype(str), matured["source"]]).agg(["mean", "size"]).unstack("source")
    out = pd.DataFrame({"date": grouped.index})
    for side in ("policy", "base"):
        rate = grouped[("mean", side)] if ("mean", side) in grouped.columns else pd.Series(np.nan, index=grouped.index)
        calls = grouped[("size", side)] if ("size", side) in grouped.columns else pd.Series(0, index=grouped.index)
        out[f"{side}_hit_rate"] = rate.to_numpy(float)
        out[f"{side}_calls"] = calls.fillna(0).astype(int).to_numpy()
    return out[columns].sort_values("date").reset_index(drop=True)


OVER_DAYS_COLUMNS = {  # column -> header of the report's over-days table
    "date": "day",
    "mean_price_reward": "price reward",
    "price_notes_trained": "notes on price",
    "price_notes_waiting": "waiting",
    "staleness_mean": "staleness",
    "staleness_max": "max staleness",
    "clip_fraction": "clip fraction",
    "is_truncated_fraction": "IS truncated",
    "policy_hit_rate": "hit rate policy",
    "base_hit_rate": "hit rate base",
    "policy_calls": "matured calls",
}


def over_days(price: pd.DataFrame, hit_rates: pd.DataFrame) -> pd.DataFrame:
    """One row per day with the price step's figures (`price_training`: reward, staleness, clip fraction) and the
    hit rate of that day's calls (`hit_rate_by_day`); a day missing from one side keeps NaN there."""
    frames = [f for f in (price, hit_rates) if len(f)]
    if not frames:
        return pd.DataFrame(columns=list(OVER_DAYS_COLUMNS))
    merged = frames[0].assign(date=frames[0]["date"].astype(str))
    for other in frames[1:]:
        merged = merged.merge(other.assign(date=other["date"].astype(str)), on="date", how="outer")
    for column in OVER_DAYS_COLUMNS:
        if column not in merged.columns:
            merged[column] = np.nan
    return merged[list(OVER_DAYS_COLUMNS)].sort_values("date").reset_index(drop=True)


def prices_note(source: str, prices_file: str | None, bundled: str | None) -> str:
    """What prices the outcomes come from, in one sentence: on the bundled real closes no edge is expected (a
    headline's news is not what moves these closes the next session in any way a note could learn), a world file
    is synthetic (its sidecar `<file>.world.json` states the rule)."""
    if source == "yfinance":
        return "Prices: Yahoo Finance closes (real)."
    path = Path(prices_file) if prices_file else None
    if path is not None and bundled is not None and path.resolve() == Path(bundled).resolve():
        return (
            "Prices: the bundled real closes (sample_data/prices). No edge over the base is expected on them, and "
            "none is claimed: expect the hit rate near 0.5 and the outcome labels to read 'no detectable difference'. A synthetic world "
            "(`flywheel make-world`) is where the loop can show that it learns from prices."
        )
    if path is not None and path.with_name(path.name + ".world.json").exists():
        return f"Prices: a SYNTHETIC world, `{path.name}` (its rule and planted moves: `{path.name}.world.json`); no row is a real price."
    return f"Prices: file `{path.name if path else prices_file}`."


def _warehouse(data_dir):
    """The demo's warehouse (the summaries read it: the tiers' stages themselves read and write nothing)."""
    from outcome_flywheel.settings import env
    from outcome_flywheel.storage import Warehouse

    return Warehouse(
        data_dir=str(data_dir),
        warehouse_url=env("FLYWHEEL_WAREHOUSE_URL", ""),
        s3_endpoint=env("FLYWHEEL_S3_ENDPOINT", ""),
    )


def prompt_evolver_summary(data_dir) -> str:
    """One line on the prompt evolver's latest state for the demo's summary."""
    warehouse = _warehouse(data_dir)
    days = warehouse.partitions("prompt_evolver")
    if not days:
        return "prompt evolver: no state yet (materialise daily_update)"
    v = warehouse.read("prompt_evolver", days[-1])
    live, written = v[v["status"] == evolver.LIVE], v[v["version"] != BASE_PROMPT_VERSION]
    parts = []
    for r in v[v["pulls"] > 0].sort_values("reward_mean", ascending=False).head(3).itertuples():
        ci = f" [{r.ci_low:.3f}, {r.ci_high:.3f}]" if not pd.isna(r.ci_low) else ""
        parts.append(f"{r.version} {r.reward_mean:.3f}{ci} ({r.pulls} pulls)")
    best = v.loc[v["is_best"], "version"].iloc[0] if v["is_best"].any() else BASE_PROMPT_VERSION
    return (
        f"prompt evolver ({days[-1]}): {int(v['pulls'].sum())} trials, {len(written)} candidates "
        f"({int((written['status'] != evolver.REJECTED).sum())} adopted, {int((written['status'] == evolver.REJECTED).sum())} rejected), "
        f"{len(live)} live, best {best}; " + ("; ".join(parts) or "no scored trials yet")
    )


def distillation_summary(data_dir) -> str:
    """One line for `make demo`: distillation runs, the last one's gate verdict and A/B, and the audit table."""
    from outcome_flywheel.daily_rl.distillation.step import ready_to_distill
    from outcome_flywheel.daily_rl.distillation.train import RUNS_TABLE
    from outcome_flywheel.training_audit import read_audit

    warehouse = _warehouse(data_dir)
    runs = warehouse.read(RUNS_TABLE)  # empty when absent
    audit = read_audit(warehouse)
    tiers = (
        ", ".join(f"{t} {n}" for t, n in audit["tier"].value_counts().sort_index().items()) if len(audit) else "none"
    )
    _, waiting, need = ready_to_distill(warehouse)
    if runs.empty:
        return f"distillation: no run yet ({waiting}/{need} new samples); trainings audited: {tiers}"
    last = runs.iloc[-1]
    ab = json.loads(last["ab"])
    diff = ab.get("difference")
    ab_text = (
        (
            f"A/B structure {ab['policy']:.3f} vs parent {ab['base']:.3f} (diff {diff:+.3f}"
            + (f" [{ab['ci_low']:+.3f}, {ab['ci_high']:+.3f}]" if ab.get("ci_low") is not None else "")
            + f", n={ab['n']}: {ab['label']})"
        )
        if diff is not None
        else f"A/B: {ab.get('label')}"
    )
    return (
        f"distillation: {len(runs)} run(s), last gate {last['gate']} on {int(last['samples'])} samples, {ab_text}; "
        f"{waiting}/{need} new samples; trainings audited: {tiers}"
    )
