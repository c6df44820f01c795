"""What a day's update trained on, as rows: the judged step's ledger rows and the day's
`price_training` row (the delayed step: price reward, staleness, importance ratios, clip fraction).
Columns: docs/daily_rl.md, "Delayed rewards"."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from outcome_flywheel.daily_rl.reward.signals import DELAYED_SIGNALS, RewardConfig

# The `price_training` table's stored columns, in order: column -> (type, description) as the Dagster catalog
# shows them (assets/catalog.py reads them from here).
PRICE_TRAINING_COLUMN_SCHEMA: dict[str, tuple[str, str]] = {
    "date": ("string", "Training day D."),
    "price_groups_trained": ("int", "Headline groups trained on price at D."),
    "price_groups_dropped": ("int", "Groups dropped at D (stale, or only no_data notes)."),
    "price_notes_trained": ("int", "Notes trained on price at D."),
    "price_groups_replayed": (
        "int",
        "Groups first trained on price at an earlier day and trained again at D (pooled).",
    ),
    "price_notes_replayed": ("int", "Notes of those groups trained again at D."),
    "price_notes_waiting": ("int", "Notes in groups still pending at D (they wait)."),
    "price_notes_no_data": ("int", "Notes dropped for no_data (never trained on price)."),
    "mean_price_reward": ("float", "Mean price signal of the notes trained on price at D."),
    "staleness_min": ("float", "Least policy updates since sampling over the trained groups."),
    "staleness_mean": ("float", "Mean of it over the trained groups."),
    "staleness_max": ("float", "Most of it over the trained groups."),
    "is_ratio_mean": (
        "float",
        (
            "Mean sequence IS ratio pi_parent / pi_behaviour of the price examples (before truncation), over the "
            "tokens the update forwarded (the call line under trim_unread_tail)."
        ),
    ),
    "is_ratio_p05": ("float", "Its 5th percentile."),
    "is_ratio_p50": ("float", "Its median."),
    "is_ratio_p95": ("float", "Its 95th percentile."),
    "is_ratio_max": ("float", "Its largest value."),
    "is_truncated_fraction": ("float", "Share of price examples whose IS ratio was above tis_cap (truncated)."),
    "clip_fraction": ("float", "GSPO clip fraction of D's whole update (judged and matured examples)."),
    "counterfactual_notes": (
        "int",
        "Price examples carrying the counterfactual side term (calls on the headline's company; price_counterfactual_c > 0).",
    ),
    "side_probability_own": (
        "float",
        "Mean probability of those calls' own side phrase over the update's steps that carry the term.",
    ),
    "side_probability_other": ("float", "Mean probability of their opposite side phrase, teacher-forced, likewise."),
    "side_lean_share": (
        "float",
        "The lean target's p (side_lean_target > 0): the share of the update's side pairs where long did better, one win and one loss added (NaN: off or no side pair).",
    ),
    "side_lean_margin_first": (
        "float",
        "The side pairs' mean margin toward long, log pi(long) - log pi(short), on the update's first step that read it (lean target on; NaN: off).",
    ),
    "side_lean_margin_last": ("float", "The same on the update's last step that read it: where the day left the lean."),
    "tis_cap": ("float", "The truncation cap C of the IS weight."),
    "max_staleness": ("float", "The staleness limit in policy updates."),
}
PRICE_TRAINING_COLUMNS = list(PRICE_TRAINING_COLUMN_SCHEMA)


def judged_ledger(
    day: str,
    rollouts: pd.DataFrame,
    scores: pd.DataFrame,
    reward: RewardConfig,
    parent_version: str | None,
    is_ratios: dict,
    lineage: Sequence[str] = (),
) -> list[dict]:
    """One `judged` ledger row per scored note of D-1: the immediate signals it was trained on
    (weighted and present), or dropped with the judge's reason when its group was unusable.
    `lineage`: the versions from the notes' sampler to the parent (a distilled parent: the
    distillations in between are the notes' staleness)."""
    if scores.empty:
        return []
    weighted = [k for k, w in reward.weights.items() if float(w) != 0.0 and k not in DELAYED_SIGNALS]
    sampler = dict(zip(zip(rollouts["headline_id"], rollouts["rollout_index"].astype(int)), rollouts["policy_version"]))
    rows = []
    for r in scores.itertuples():
        present = [
            s
            for s in weighted
            if not (s == "human" and _missing(r.human_signal))
            and not (s == "relevance" and _missing(r.relevance_signal))
        ]
        key = (str(r.prediction_date), str(r.headline_id), int(r.rollout_index))
        rows.append(
            dict(
                date=day,
                note_date=r.prediction_date,
                headline_id=r.headline_id,
                rollout_index=int(r.rollout_index),
                step="judged",
                signals=",".join(present),
                status="trained" if r.usable else "dropped",
                reason=None if r.usable else (r.unusable_reason or "unusable group"),
                policy_version=parent_version,
                behavior_policy_version=sampler.get((r.headline_id, int(r.rollout_index))),
                staleness_updates=_distance(lineage, sampler.get((r.headline_id, int(r.rollout_index)))),
                staleness_days=1,
                signal_value=float(r.reward),
                advantage=float(r.advantage),
                is_ratio=is_ratios.get(key, np.nan),
            )
        )
    return rows


def _distance(lineage: Sequence[str], version) -> int:
    """Policy updates from `version` to the end of `lineage` (0 for the parent itself or no lineage)."""
    return len(lineage) - 1 - list(lineage).index(version) if version in lineage else 0


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and value != value)


def finite_steps(stats, name: str) -> np.ndarray:
    """A per-step metric's values over the steps that have it (a step without it reports NaN)."""
    values = np.asarray(stats.extra.get(name, []) if stats else [], dtype=float)
    return values[np.isfinite(values)]


def step_mean(stats, name: str) -> float:
    """The mean of a per-step metric over the steps that have it (NaN: none)."""
    values = finite_steps(stats, name)
    return float(values.mean()) if len(values) else float("nan")


def step_value(stats, name: str, index: int) -> float:
    """A per-step metric at `index` of the steps that have it (0: the first, -1: the last; NaN: none)."""
    values = finite_steps(stats, name)
    return float(values[index]) if len(values) else float("nan")


def price_training_row(day: str, ledger: pd.DataFrame, matured, stats, gspo, max_staleness: int | None) -> dict:
    """The day's delayed-step record: groups and notes trained / dropped / waiting, the mean price
    reward, staleness of the trained groups, the distribution of the sequence IS ratio over the price
    examples (before truncation) and its truncated share, the update's GSPO clip fraction, and the
    counterfactual side term's notes and side probabilities, and the lean target's p and margins."""
    price = ledger[ledger["step"] == "matured"]
    trained = price[price["status"] == "trained"]
    replayed = ledger[(ledger["step"] == "replay") & (ledger["status"] == "trained")]
    groups = price.groupby(["note_date", "headline_id"])["status"].agg(lambda s: (s == "trained").any()).astype(bool)
    stale = trained.groupby(["note_date", "headline_id"])["staleness_updates"].first()
    ratios = trained["is_ratio"].dropna().to_numpy(dtype=float)
    nan = float("nan")
    q = np.percentile(ratios, [5, 50, 95]) if len(ratios) else [nan] * 3
    cap = gspo.tis_cap if gspo.tis_cap is not None else nan
    return dict(
        date=day,
        price_groups_trained=int(groups.sum()),
        price_groups_dropped=int((~groups).sum()),
        price_notes_trained=int(len(trained)),
        price_groups_replayed=int(replayed.groupby(["note_date", "headline_id"]).ngroups),
        price_notes_replayed=int(len(replayed)),
        price_notes_waiting=int(matured.waiting_notes),
        price_notes_no_data=int(matured.no_data_notes),
        mean_price_reward=float(trained["signal_value"].mean()) if len(trained) else nan,
        staleness_min=float(stale.min()) if len(stale) else nan,
        staleness_mean=float(stale.mean()) if len(stale) else nan,
        staleness_max=float(stale.max()) if len(stale) else nan,
        is_ratio_mean=float(ratios.mean()) if len(ratios) else nan,
        is_ratio_p05=float(q[0]),
        is_ratio_p50=float(q[1]),
        is_ratio_p95=float(q[2]),
        is_ratio_max=float(ratios.max()) if len(ratios) else nan,
        is_truncated_fraction=float((ratios > cap).mean()) if len(ratios) else nan,
        clip_fraction=float(np.mean(stats.extra.get("clip_fraction", [nan]))) if stats else nan,
        counterfactual_notes=int(sum(e.counterfactual is not None for e in matured.examples)),
        side_probability_own=step_mean(stats, "side_probability_own"),
        side_probability_other=step_mean(stats, "side_probability_other"),
        side_lean_share=step_mean(stats, "side_lean_share"),
        side_lean_margin_first=step_value(stats, "side_lean_margin", 0),
        side_lean_margin_last=step_value(stats, "side_lean_margin", -1),
        tis_cap=float(cap),
        max_staleness=float(max_staleness) if max_staleness is not None else nan,
    )
