"""The `daily_update` step: one day of the daily loop (`run_daily_update`: judge, GSPO training, gate,
checkpoint, rollout generation, KL, verify) in its own process, reported through Dagster Pipes.

Extras (from the asset): `warehouse`, `models`, `judge`, `market_data` (or None), `settings`
(`DailyUpdateSettings`) and `tracking` (`Tracker`, or absent: no MLflow record), each as its dataclass's
JSON. The partition key is the day. Reported: the three keys' materializations with their metadata (the
checkpoint's carries the MLflow run's link), the four blocking checks and the gate's check (WARN when it
rejected the update). `latest` moves only once the day's blocking checks passed
(`policy/verify.py`): a process that dies before that leaves it where it was.
"""

from __future__ import annotations

import os
import time

import pandas as pd

from outcome_flywheel.daily_rl.day import DailyUpdateResult, run_daily_update
from outcome_flywheel.daily_rl.day_record import record_day
from outcome_flywheel.daily_rl.day_settings import DailyUpdateSettings
from outcome_flywheel.daily_rl.judge.llm_judge import Judge
from outcome_flywheel.daily_rl.policy.prompt_tables import variant_table
from outcome_flywheel.daily_rl.policy.verify import DAILY_UPDATE_CHECKS, UPDATE_ACCEPTED_BY_GATE, gate_check
from outcome_flywheel.daily_rl.reward.rollout_scores import position_bias
from outcome_flywheel.market_data import MarketData
from outcome_flywheel.models.loader import ModelLoader
from outcome_flywheel.steps.codec import from_payload
from outcome_flywheel.steps.entry import main
from outcome_flywheel.steps.metadata import counts_table, mapping_table, md, num, path, present
from outcome_flywheel.storage import Warehouse
from outcome_flywheel.tracking import Tracker
from outcome_flywheel.training_audit import current

# check -> the key it belongs to (the checks are declared in verify.py)
CHECK_ASSET = {check.name: check.asset for check in DAILY_UPDATE_CHECKS}


def run(pipes) -> None:
    extras = pipes.extras
    warehouse = from_payload(Warehouse, extras["warehouse"])
    models = from_payload(ModelLoader, extras["models"])
    judge = from_payload(Judge, extras["judge"])
    market_data = from_payload(MarketData, extras["market_data"]) if extras.get("market_data") else None
    settings = from_payload(DailyUpdateSettings, extras["settings"])
    day = pipes.partition_key
    pipes.log.info(
        f"daily_update {day}: {models.base_model} on {models.backend}/{models.device}, process {os.getpid()}"
    )
    started = time.perf_counter()
    result = run_daily_update(warehouse, models, judge, day, settings, market_data)
    entry = current()
    if entry is not None:  # the audit row: what the day trained from (a distilled parent: its notes were off-policy)
        entry.inputs.update(
            parent_checkpoint=result.checkpoint.get("parent_checkpoint"),
            parent_version=result.checkpoint.get("parent_version"),
            policy_version=result.checkpoint.get("policy_version"),
        )
    pipes.log.info(
        f"daily_update {day}: gate {result.gate.verdict}, {len(result.rollouts)} rollouts, "
        f"{time.perf_counter() - started:.1f} s in the step"
    )
    pipes.report_asset_materialization(
        asset_key="rollout_scores", metadata=scores_metadata(result, judge, models, settings)
    )
    # the MLflow run and the registry's mirror (outcome_flywheel/tracking/): a failed record is a warning
    tracker = from_payload(Tracker, extras["tracking"]) if extras.get("tracking") else None
    on_record = record_day(tracker, result, settings, models, judge, pipes.run_id, pipes.log.warning) if tracker else {}
    pipes.report_asset_materialization(
        asset_key="policy_checkpoint", metadata={**checkpoint_metadata(result), **record_metadata(on_record)}
    )
    pipes.report_asset_materialization(asset_key="rollouts", metadata=rollouts_metadata(result))
    pipes.report_asset_materialization(asset_key="prompt_evolver", metadata=evolver_metadata(result))
    for name, check in result.checks.items():
        pipes.report_asset_check(
            check_name=name,
            asset_key=CHECK_ASSET[name],
            passed=bool(check["passed"]),
            metadata=present(check["metadata"]) or None,
        )
    gate = gate_check(result.gate)  # not blocking: a rejected update is a warning, the day goes on
    pipes.report_asset_check(
        check_name=UPDATE_ACCEPTED_BY_GATE.name,
        asset_key=UPDATE_ACCEPTED_BY_GATE.asset,
        passed=gate["passed"],
        severity="WARN",
        metadata=gate["metadata"],
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


if __name__ == "__main__":
    main("daily_update", run)
