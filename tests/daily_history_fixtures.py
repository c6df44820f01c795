"""Eight days of the daily loop's tables, written by the test (seeded): what the report's and the status page's
curves read. Shapes follow the real tables: `daily_report` (SUMMARY_COLUMNS), `policy_training`, `policy_eval`
(ab_stats comparisons, so each label agrees with its interval), `rollout_outcomes` (policy and base calls, the
last two days pending), and `price_training` (the delayed price step's per-day row, docs/daily_rl.md)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from outcome_flywheel.daily_rl.evaluation.ab import sessions_of
from outcome_flywheel.daily_rl.evaluation.ab_stats import (
    comparisons_frame,
    paired_comparison,
    session_comparison,
    win_rate_comparison,
)
from outcome_flywheel.daily_rl.report.summary import SUMMARY_COLUMNS
from outcome_flywheel.storage import Warehouse

DAYS = [f"2025-11-{d:02d}" for d in range(3, 11)]
PENDING_DAYS = DAYS[-2:]
PRICE_DAYS = DAYS[2:]  # the first price step trains on day 3: notes of day 1 matured
HEADLINES = 12


def history_tables(seed: int = 7) -> dict[str, pd.DataFrame]:
    rng = np.random.default_rng(seed)
    summary, training, evals, outcomes, price = [], [], [], [], []
    for i, day in enumerate(DAYS):
        version = f"{day}@{i:012x}" if i else f"{day}@base"
        structure = 0.78 + 0.025 * i + rng.normal(0, 0.01)
        kl = 0.0 if i == 0 else 0.004 + 0.006 * i + rng.normal(0, 1e-4)
        loss = float("nan") if i == 0 else 0.001 + rng.normal(0, 2e-4)
        reward = (
            dict(reward_n=0, reward_avg=np.nan, reward_min=np.nan, reward_max=np.nan)
            if i == 0
            else dict(reward_n=96, reward_avg=0.62 + 0.01 * i + rng.normal(0, 0.005), reward_min=0.21, reward_max=0.97)
        )
        row = dict(
            date=day,
            headlines=HEADLINES,
            rollouts=8 * HEADLINES,
            mean_structure=structure,
            finished_share=1.0,
            scored=0 if i == 0 else 96,
            usable_share=np.nan if i == 0 else 0.9,
            reward_negatives=0,
            negative_advantages=0 if i == 0 else 44,
            trained=i > 0,
            steps=0 if i == 0 else 6,
            loss=loss,
            kl_to_base=kl,
            grad_norm_median=np.nan,
            grad_norm_iqr=np.nan,
            clip_fraction=np.nan if i == 0 else 0.45,
            policy_version=version,
            gate="not_trained" if i == 0 else "accepted",
            gate_reason="",
            **reward,
        )
        summary.append(row)
        training.append(
            dict(
                date=day,
                policy_version=version,
                trained=i > 0,
                examples=0 if i == 0 else 96,
                loss=loss,
                kl_to_base=kl,
                gate=row["gate"],
                gate_reason="loss finite; KL to the parent within budget",
            )
        )
        policy_structure = rng.normal(structure, 0.05, HEADLINES)
        base_structure = rng.normal(0.78, 0.05, HEADLINES)
        share_policy = rng.binomial(8, min(0.9, 0.3 + 0.08 * i), HEADLINES) / 8
        share_base = rng.binomial(8, 0.3, HEADLINES) / 8
        for source in ("policy", "base"):
            for h in range(HEADLINES):
                for k in range(2):
                    move = rng.normal(0.1 if source == "policy" else 0.0, 1.2)
                    status = "pending" if day in PENDING_DAYS else "matured"
                    outcomes.append(
                        dict(
                            date=day,
                            source=source,
                            headline_id=f"{day}-h{h}",
                            rollout_index=k,
                            symbol="NVDA",
                            side="long",
                            status=status,
                            vs_spy_pct=move if status == "matured" else np.nan,
                            entry_date=day,
                            look_ahead=False,
                        )
                    )
        so_far = sessions_of(pd.DataFrame(outcomes).query("status == 'matured'")).assign(
            hit=lambda f: (f["vs_spy_pct"] > 0).astype(float)
        )
        wins = int(rng.binomial(HEADLINES, 0.5))
        frame = comparisons_frame(
            [
                paired_comparison("structure_score", policy_structure, base_structure),
                win_rate_comparison("judge_win_rate", wins, HEADLINES - wins),
                *(
                    session_comparison(
                        metric, so_far[so_far["source"] == "policy"], so_far[so_far["source"] == "base"], value
                    )
                    for metric, value in (("hit_rate", "hit"), ("mean_vs_spy_pct", "vs_spy_pct"))
                ),
                paired_comparison("headline_company_share", share_policy, share_base),
            ]
        )
        evals.append(frame.assign(date=day, status="complete", policy_version=version))
        if day in PRICE_DAYS:
            j = PRICE_DAYS.index(day)
            trained = 2 * 8 * 3 + 8 * j
            ratios = np.exp(rng.normal(0, 0.05 + 0.02 * j, trained))
            price.append(
                dict(
                    date=day,
                    price_groups_trained=trained // 8,
                    price_groups_dropped=0 if j < 4 else 2,
                    price_notes_trained=trained,
                    price_notes_waiting=16 if j < 5 else 0,
                    price_notes_no_data=2,
                    mean_price_reward=0.48 + 0.01 * j + rng.normal(0, 0.01),
                    staleness_min=1,
                    staleness_mean=1.0 + 0.3 * j,
                    staleness_max=1 + j // 2 + 1,
                    is_ratio_mean=float(ratios.mean()),
                    is_ratio_p05=float(np.quantile(ratios, 0.05)),
                    is_ratio_p50=float(np.median(ratios)),
                    is_ratio_p95=float(np.quantile(ratios, 0.95)),
                    is_ratio_max=float(ratios.max()),
                    is_truncated_fraction=float((ratios > 2.0).mean()) + 0.01 * j,
                    clip_fraction=0.35 + 0.02 * j,
                    tis_cap=2.0,
                    max_staleness=4,
                )
            )
    return {
        "daily_report": pd.DataFrame(summary, columns=SUMMARY_COLUMNS),
        "policy_training": pd.DataFrame(training),
        "policy_eval": pd.concat(evals, ignore_index=True),
        "rollout_outcomes": pd.DataFrame(outcomes),
        "price_training": pd.DataFrame(price),
    }


def write_history(
    warehouse: Warehouse, tables: dict[str, pd.DataFrame] | None = None, upto: str | None = None
) -> dict[str, pd.DataFrame]:
    """Write `tables` (default `history_tables()`) one partition per day, days after `upto` left out."""
    tables = tables if tables is not None else history_tables()
    for name, frame in tables.items():
        for day, part in frame.groupby("date", sort=True):
            if upto is None or day <= upto:
                warehouse.write(name, part.reset_index(drop=True), partition=day)
    return tables
