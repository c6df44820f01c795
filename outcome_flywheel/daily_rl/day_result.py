"""What one day's update wrote and measured (`DailyUpdateResult`), the rows that record it, and the
Dagster metadata that describes it: the builders sit beside the result they read.

- `day_record_tables`: the day's record step: the `reward_ledger` (what each note trained on and why),
  the `price_training` row (the delayed step) and the `policy_training` row (the update and the gate).
- `scores_metadata`, `checkpoint_metadata`, `rollouts_metadata`, `evolver_metadata`, `record_metadata`:
  each key's materialization metadata, as the `daily_update` step reports it through Pipes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd

from outcome_flywheel.daily_rl.day_settings import DailyUpdateSettings
from outcome_flywheel.daily_rl.day_store import Day, DayTables
from outcome_flywheel.daily_rl.judge.llm_judge import Judge
from outcome_flywheel.daily_rl.policy.gate import not_trained
from outcome_flywheel.daily_rl.policy.prompt_tables import variant_table
from outcome_flywheel.daily_rl.policy.update import PolicyUpdate
from outcome_flywheel.daily_rl.reward.ledger import ledger_frame
from outcome_flywheel.daily_rl.reward.rollout_scores import position_bias
from outcome_flywheel.daily_rl.reward.training_record import judged_ledger, price_training_row, step_mean
from outcome_flywheel.models.loader import ModelLoader
from outcome_flywheel.models.train.gspo import SHARE_PARTS
from outcome_flywheel.steps.metadata import counts_table, mapping_table, md, num, path, present


def quartiles(values: Sequence[float]) -> tuple[float, float]:
    """(median, inter-quartile range); NaN for no values."""
    if not len(values):
        return float("nan"), float("nan")
    q1, med, q3 = np.percentile(np.asarray(values, dtype=float), [25, 50, 75])
    return float(med), float(q3 - q1)


@dataclass
class DailyUpdateResult:
    """Everything one day's update wrote and measured, for the asset's metadata and checks."""

    partition: Day  # the day, its outcome day, seed and parent
    update: PolicyUpdate  # the trainer's config and figures, the gate's verdict
    tables: DayTables  # every table the day wrote
    checkpoint: dict  # checkpoint.json of D as published
    checkpoint_dir: str
    price_row: dict
    training_row: dict
    headlines: int
    n_rollouts: int
    max_new_tokens: int
    timings: dict[str, float]
    checks: dict[str, dict] = field(default_factory=dict)
    prompt_events: list[str] = field(default_factory=list)

    day = property(lambda self: self.partition.day)
    prediction_day = property(lambda self: self.partition.prediction_day)
    outcome_day = property(lambda self: self.partition.outcome_day)
    scores = property(lambda self: self.tables.rollout_scores)
    rollouts = property(lambda self: self.tables.rollouts)
    ledger = property(lambda self: self.tables.reward_ledger)
    prompt_variants = property(lambda self: self.tables.prompt_evolver)  # the prompt evolver's state of D
    gspo = property(lambda self: self.update.gspo)
    gate = property(lambda self: self.update.gate)
    trained = property(lambda self: self.update.trained)
    train_stats = property(lambda self: self.update.stats)  # per-step figures (None: not trained), for MLflow


def checkpoint_info(d: Day, models: ModelLoader, update) -> dict:
    """checkpoint.json of D before it is staged (the stage adds its kind and version)."""
    parent = d.parent_info
    return {
        "date": d.day,
        "parent_date": parent["date"] if parent else None,
        "parent_version": d.parent_version,
        "parent_checkpoint": d.parent_dir.name if d.parent_dir else None,  # a re-run of D trains from the same one
        "base_model": models.base_model,
        "backend": models.backend,
        "trained": update.trained,
        "examples": len(update.examples),
        "objective": update.gspo.objective,
        "learning_rate": update.gspo.learning_rate,
        "outcome_headlines_date": d.outcome_day,
        "gate": update.gate.verdict,
        "gate_reason": update.gate.reason,
    }


def day_record_tables(d, scores, prev_rollouts, matured, update, settings, info, rollouts, headlines, kl, timings):
    """(reward_ledger, price_training row, policy_training row) of day `d` (a `Day`): the record step."""
    lineage_rows = judged_ledger(
        d.day, prev_rollouts, scores, settings.reward, d.parent_version, update.is_ratios, d.lineage
    )
    keyed = [
        {**row, "is_ratio": update.is_ratios.get((row["note_date"], row["headline_id"], row["rollout_index"]), np.nan)}
        for row in matured.ledger
    ]
    ledger = ledger_frame(lineage_rows + keyed)
    stale = settings.matured().max_staleness if matured.window else None
    price_row = price_training_row(d.day, ledger, matured, update.stats, update.gspo, stale)
    training_row = training_summary(
        d.day,
        info,
        update.stats,
        update.examples,
        scores,
        rollouts,
        headlines,
        kl,
        update.gspo,
        d.outcome_day,
        timings,
        update.gate,
    )
    return ledger, price_row, training_row


def training_summary(
    day, info, stats, examples, scores, rollouts, headlines, kl, gspo, outcome_day, timings, gate=None
) -> dict:
    """One `policy_training` row: what the day trained on, how it went and the gate's verdict."""
    grad_median, grad_iqr = quartiles(stats.grad_norms if stats else [])
    usable = scores[scores["usable"]] if not scores.empty else scores
    nan = float("nan")
    return dict(
        date=day,
        policy_version=info["policy_version"],
        kind=info["kind"],
        parent_version=info["parent_version"],
        trained=stats is not None,
        examples=len(examples),
        steps=stats.steps if stats else 0,
        loss=stats.mean_loss if stats else nan,
        mean_reward=float(usable["reward"].mean()) if len(usable) else nan,
        kl_to_base=kl,
        grad_norm_median=grad_median,
        grad_norm_iqr=grad_iqr,
        clip_fraction=float(np.mean(stats.extra.get("clip_fraction", [np.nan]))) if stats else nan,
        kl_penalty=float(np.mean(stats.extra.get("kl", [np.nan]))) if stats else nan,
        kl_reference=str(stats.extra.get("kl_reference", "")) if stats else "",
        optimizer_moments=str(stats.extra.get("optimizer_moments", "")) if stats else "",
        lora_adapter=str(stats.extra.get("lora_adapter", "")) if stats else "",
        behavior_logprob_gap_max=float(stats.extra.get("behavior_logprob_gap_max", np.nan)) if stats else nan,
        train_wall_s=stats.wall_s if stats else 0.0,
        # how the memory budget ran the steps (models/train/memory.py)
        train_micro_batches=stats.micro_batches if stats else 0,
        train_recomputed=stats.layers_recomputed if stats else False,
        # each reward part's pull on the weights (models/train/gspo.py, gradient_shares)
        **{f"grad_share_{p}": float(stats.extra.get(f"grad_share_{p}", nan)) if stats else nan for p in SHARE_PARTS},
        name_counterfactual_notes=sum(e.counterfactual is not None and e.token_part == "relevance" for e in examples),
        name_probability_own=step_mean(stats, "name_probability_own"),
        name_probability_other=step_mean(stats, "name_probability_other"),
        objective=gspo.objective,
        learning_rate=gspo.learning_rate,
        headlines=headlines,
        rollouts=len(rollouts),
        generated_tokens=int(rollouts["n_tokens"].sum()) if len(rollouts) else 0,
        mean_structure=float(rollouts["structure_score"].mean()) if len(rollouts) else nan,
        scored=len(scores),
        usable=len(usable),
        outcome_headlines_date=outcome_day,
        **(gate or not_trained("")).columns(),
        **timings,
    )


def record_metadata(on_record: dict) -> dict:
    """The MLflow record's links as Pipes metadata (the run's URL clickable)."""
    out = present(on_record)
    if out.get("mlflow_run_url"):
        out["mlflow_run_url"] = {"raw_value": out["mlflow_run_url"], "type": "url"}
    return out


def scores_metadata(
    result: DailyUpdateResult, judge: Judge, models: ModelLoader, settings: DailyUpdateSettings
) -> dict:
    scores = result.scores
    bias = position_bias(scores)
    unusable = scores.groupby("headline_id")["unusable_reason"].first() if len(scores) else pd.Series(dtype=str)
    reward = scores["reward"] if len(scores) else pd.Series(dtype=float)
    return present(
        {
            "dagster/row_count": len(scores),
            "prediction_date": result.prediction_day,
            "outcome_headlines_date": result.outcome_day,
            "override": settings.outcome_headlines_date is not None,
            "judge": judge.describe(models),
            "groups": int(scores["headline_id"].nunique()) if len(scores) else 0,
            "judge_retries": int(scores.groupby("headline_id")["judge_retries"].first().sum()) if len(scores) else 0,
            "judge_fallbacks": int(scores.groupby("headline_id")["judge_fallback"].first().sum()) if len(scores) else 0,
            "usable_share": num(scores["usable"].mean()) if len(scores) else None,
            "unusable_groups": md(counts_table(unusable[unusable != ""].value_counts(), "reason", "groups")),
            "judge_mean_rank_by_shown_position": md(
                mapping_table(bias["by_shown_position"], "shown position", "mean rank")
            ),
            "judge_mean_rank_by_rollout_index": md(
                mapping_table(bias["by_rollout_index"], "rollout index", "mean rank")
            ),
            "judge_notes_truncated": int(scores["judge_truncated"].sum()) if len(scores) else 0,
            "judge_prompt_tokens": judge.prompt_tokens,
            "reward_mean": num(reward.mean()) if len(reward) else None,
            "reward_min": num(reward.min()) if len(reward) else None,
            "reward_max": num(reward.max()) if len(reward) else None,
            "reward_weights": scores["reward_weights"].iloc[0] if len(scores) else None,
            "reward_clip": scores["reward_clip"].iloc[0] if len(scores) else None,
            "score_seconds": round(result.timings["score_s"], 2),
        }
    )


def checkpoint_metadata(result: DailyUpdateResult) -> dict:
    info, row = result.checkpoint, result.training_row
    return present(
        {
            "policy_version": info["policy_version"],
            "kind": info["kind"],
            "parent_version": str(info["parent_version"]),
            "parent_checkpoint": str(info.get("parent_checkpoint")),
            "path": path(result.checkpoint_dir),
            "trained": result.trained,
            "examples": row["examples"],
            "steps": row["steps"],
            "loss": num(row["loss"]),
            "mean_reward": num(row["mean_reward"]),
            "kl_to_base": num(row["kl_to_base"], 6),  # exact, per token, at the sampling temperature
            "grad_norm_median": num(row["grad_norm_median"]),
            "grad_norm_iqr": num(row["grad_norm_iqr"]),
            "clip_fraction": num(row["clip_fraction"]),
            "train_seconds": round(result.timings["train_s"], 2),
            # the memory budget's plan: forward-backward parts over all steps, layers recomputed or not
            "micro_batches": row["train_micro_batches"] if result.trained else None,
            "layers_recomputed": row["train_recomputed"] if result.trained else None,
            # stored behaviour log-probs vs pi_old recomputed by the training forward: ~1e-6 in fp32
            "behavior_logprob_gap_max": num(row["behavior_logprob_gap_max"], 8),
            "sampling_temperature": result.gspo.temperature if result.trained else None,
            "objective": result.gspo.objective,
            "learning_rate": result.gspo.learning_rate,
            "gate": result.gate.verdict,
            "gate_reason": result.gate.reason,
            "gate_kl_to_parent": num(row["gate_kl_to_parent"], 6),
            "gate_kl_to_base": num(row["gate_kl_to_base"], 6),
            "gate_probe_structure": num(row["gate_probe_structure"]),
            "gate_probe_parent_structure": num(row["gate_probe_parent_structure"]),
            **{
                k: num(v) if isinstance(v, float) else v
                for k, v in result.price_row.items()
                if k not in ("date", "clip_fraction")
            },
            "reward_ledger_rows": len(result.ledger),
        }
    )


def rollouts_metadata(result: DailyUpdateResult) -> dict:
    rollouts, row = result.rollouts, result.training_row
    return present(
        {
            "dagster/row_count": len(rollouts),
            "headlines": result.headlines,
            "rollouts_per_headline": result.n_rollouts,
            "max_new_tokens": result.max_new_tokens,
            "policy_version": result.checkpoint["policy_version"],
            "mean_structure_score": num(row["mean_structure"]),
            "generated_tokens": row["generated_tokens"],
            "tokens_per_second": round(row["generated_tokens"] / max(result.timings["generate_s"], 1e-9), 1),
            "generate_seconds": round(result.timings["generate_s"], 2),
            "example": md(f"```\n{rollouts['response'].iloc[0][:600]}\n```") if len(rollouts) else None,
        }
    )


def evolver_metadata(result: DailyUpdateResult) -> dict:
    variants = result.prompt_variants
    if variants.empty:
        return {"dagster/row_count": 0}
    best = variants.loc[variants["is_best"], "version"]
    return present(
        {
            "dagster/row_count": len(variants),
            "trials": int(variants["pulls"].sum()),
            "live": int((variants["status"] == "live").sum()),
            "best": str(best.iloc[0]) if len(best) else None,
            "variants": md(variant_table(variants)),
            "events": md("\n".join(f"- {e}" for e in result.prompt_events)) if result.prompt_events else None,
            "assigned_today": md(
                counts_table(
                    result.rollouts.groupby("headline_id")["prompt_version"].first().value_counts(),
                    "variant",
                    "headlines",
                )
            )
            if len(result.rollouts)
            else None,
        }
    )
