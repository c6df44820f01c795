"""`daily_update`: the daily outcome RL step as one non-subsettable multi-asset.

The loop is a cycle (policy -> rollouts -> scores -> policy). Dagster accepts a cycle only as an
asset depending on its own earlier partition, so all three keys live in one multi-asset and each
depends on the day's `headlines` and on its own previous partition (docs/daily_rl.md, "Why one
multi-asset": other shapes break asset backfills or run days out of order). The work itself is
`outcome_flywheel.daily_rl.update.run_daily_update`: score, train, generate, verify.
"""

from typing import Optional

import dagster as dg
import pandas as pd
from pydantic import Field

from assets.catalog import MODEL_KINDS, OWNERS, TABLE_KINDS, column_names, table_metadata
from assets.partitions import daily_rl_partitions
from outcome_flywheel.daily_rl.gate import GateConfig
from outcome_flywheel.daily_rl.judge import Judge
from outcome_flywheel.daily_rl.loop import ROLLOUT_COLUMNS, SCORE_COLUMNS, position_bias
from outcome_flywheel.daily_rl.matured import longest_wait_days
from outcome_flywheel.daily_rl.rewards import REWARD_SIGNALS, PriceReward, RewardConfig
from outcome_flywheel.daily_rl.update import DailyUpdateError, DailyUpdateResult, DailyUpdateSettings, run_daily_update
from outcome_flywheel.models import LoraSettings, ModelLoader
from outcome_flywheel.market_data import MarketData
from outcome_flywheel.models.gspo_config import GSPOConfig
from outcome_flywheel.settings import env
from outcome_flywheel.storage import Warehouse
from resources.settings import field_default, mirrored, set_fields

KEYS = ("rollout_scores", "policy_checkpoint", "rollouts")
# The body reads D-1 (rollouts to score, the parent) and every earlier day whose notes' prices can
# mature by D: the longest wait from a note's day to its exit close on the XNYS calendar. One mapping
# per key (Dagster refuses two deps on one key); an asset backfill still runs the days in order.
PRICE_WINDOW_DAYS = longest_wait_days(int(env("FLYWHEEL_OUTCOME_HORIZON")))
EARLIER_DAYS = dg.TimeWindowPartitionMapping(start_offset=-PRICE_WINDOW_DAYS, end_offset=-1)

_DESCRIPTIONS = {
    "rollout_scores": "Yesterday's rollouts scored against today's headlines: judge rank (iterative A-H selection), "
                      "rank reward, structure score, reward = 0.5/0.5 mix, group-normalised advantage, usable flag.",
    "policy_checkpoint": "The policy of day D: yesterday's checkpoint trained with GSPO on today's usable scores and on "
                         "earlier days' notes whose price matured by D (truncated IS, staleness limit; LoRA by default), "
                         "saved under checkpoints/policy/D/ with `latest` moved atomically. Each day's training is recorded "
                         "as one row of the table `policy_training` (its columns below), what each note trained on in "
                         "`reward_ledger` and the delayed step in `price_training`.",
    "rollouts": "Notes sampled by today's checkpoint for each of today's headlines (8 each by default; temperature 0.8, "
                "top-p 0.95, top-k 50), with the sampled token ids and per-token behaviour log-probs at the sampling "
                "temperature (log-softmax of logits / T, before top-k/top-p): the behaviour policy GSPO uses as pi_old.",
}


# Column schema shown per key: the table each key writes (policy_checkpoint: its record `policy_training`).
_TABLES = {
    "rollout_scores": table_metadata("rollout_scores", SCORE_COLUMNS),
    "policy_checkpoint": table_metadata("policy_training", column_names("policy_training")),  # also writes reward_ledger, price_training
    "rollouts": table_metadata("rollouts", ROLLOUT_COLUMNS),
}


class DailyUpdateConfig(dg.Config):
    """Run config of `daily_update`; a field left out falls back to `DailyUpdateSettings` / `GSPOConfig`."""

    outcome_headlines_date: Optional[str] = mirrored(DailyUpdateSettings, "outcome_headlines_date")
    rollouts_per_headline: Optional[int] = mirrored(DailyUpdateSettings, "rollouts_per_headline")
    max_new_tokens: Optional[int] = mirrored(DailyUpdateSettings, "max_new_tokens")
    objective: Optional[str] = mirrored(GSPOConfig, "objective", optional=True)
    learning_rate: Optional[float] = mirrored(GSPOConfig, "learning_rate", optional=True)
    batch_size: Optional[int] = mirrored(GSPOConfig, "batch_size", optional=True)
    epochs: Optional[int] = mirrored(GSPOConfig, "epochs", optional=True)
    full_fine_tune: bool = Field(default=False, description="Train every weight instead of a LoRA adapter.")
    lora_r: Optional[int] = Field(default=None, description=f"LoRA rank. Default: {field_default(LoraSettings, 'r')} (LoraSettings).")
    lora_alpha: Optional[int] = Field(default=None, description=f"LoRA alpha (scale = alpha / r). Default: {field_default(LoraSettings, 'alpha')} (LoraSettings).")
    reward_weights: Optional[dict[str, float]] = Field(default=None, description=(
        f"Weight of each named reward signal ({', '.join(f'{k}: {v}' for k, v in REWARD_SIGNALS.items())}). "
        f"Default: {dict(RewardConfig().weights)} (RewardConfig); recorded in rollout_scores."
    ))
    reward_clip_min: Optional[float] = mirrored(RewardConfig, "clip_min", optional=True)
    reward_clip_max: Optional[float] = mirrored(RewardConfig, "clip_max", optional=True)
    gate_enabled: Optional[bool] = mirrored(GateConfig, "enabled", optional=True)
    gate_max_kl_to_parent: Optional[float] = mirrored(GateConfig, "max_kl_to_parent", optional=True)
    gate_max_probe_regression: Optional[float] = mirrored(GateConfig, "max_probe_regression", optional=True)
    gate_probe_headlines: Optional[int] = mirrored(GateConfig, "probe_headlines", optional=True)
    price_scale_pct: Optional[float] = mirrored(PriceReward, "scale_pct", optional=True)
    price_no_trade: Optional[float] = mirrored(PriceReward, "no_trade", optional=True)
    price_unparseable: Optional[float] = mirrored(PriceReward, "unparseable", optional=True)
    price_max_staleness: Optional[int] = mirrored(DailyUpdateSettings, "max_staleness")
    tis_cap: Optional[float] = mirrored(GSPOConfig, "tis_cap", optional=True)

    def settings(self) -> DailyUpdateSettings:
        lora = None if self.full_fine_tune else LoraSettings(**{k: v for k, v in (("r", self.lora_r), ("alpha", self.lora_alpha)) if v is not None})
        gspo = GSPOConfig(**set_fields(self, ("objective", "learning_rate", "batch_size", "epochs", "tis_cap")), lora=lora)
        price = PriceReward(**{k.removeprefix("price_"): v for k, v in set_fields(
            self, ("price_scale_pct", "price_no_trade", "price_unparseable")).items()})
        reward = RewardConfig(**{k.removeprefix("reward_"): v for k, v in set_fields(self, ("reward_weights", "reward_clip_min", "reward_clip_max")).items()})
        gate = GateConfig(**{k.removeprefix("gate_"): v for k, v in set_fields(
            self, ("gate_enabled", "gate_max_kl_to_parent", "gate_max_probe_regression", "gate_probe_headlines")).items()})
        return DailyUpdateSettings(
            **set_fields(self, ("outcome_headlines_date", "rollouts_per_headline", "max_new_tokens")), gspo=gspo, reward=reward, gate=gate,
            price=price, max_staleness=self.price_max_staleness,
        )


def _check(key: str, name: str, description: str) -> dg.AssetCheckSpec:
    return dg.AssetCheckSpec(name, asset=key, blocking=True, description=description)


@dg.multi_asset(
    name="daily_update",
    specs=[
        dg.AssetSpec(
            # Every key has the same deps (an asset backfill refuses keys of different shapes): the day's
            # headlines, the base model (the first policy and the frozen judge), itself the day before.
            key, deps=[dg.AssetDep("headlines"), dg.AssetDep("base_model"), dg.AssetDep(key, partition_mapping=EARLIER_DAYS)],
            partitions_def=daily_rl_partitions, group_name="daily_rl", description=_DESCRIPTIONS[key],
            kinds=MODEL_KINDS if key == "policy_checkpoint" else TABLE_KINDS, owners=OWNERS, metadata=_TABLES[key],
        )
        for key in KEYS
    ],
    partitions_def=daily_rl_partitions,
    can_subset=False,
    pool="accelerator",
    check_specs=[
        _check("rollout_scores", "ranks_are_permutations", "Each headline's ranks are a permutation of 1..N."),
        _check("rollout_scores", "rewards_in_range", "Every structure score and rank reward is in [0, 1], every reward inside its recorded clip range."),
        _check("policy_checkpoint", "loads_and_generates", "The saved checkpoint loads from disk and writes text."),
        _check("rollouts", "generated_by_own_checkpoint", "Every rollout of D carries checkpoint D's policy_version."),
        dg.AssetCheckSpec(
            "update_accepted_by_gate", asset="policy_checkpoint", blocking=False,
            description="The evaluation gate accepted D's update (a WARN when it rejected it: the parent's weights stay D's "
                        "checkpoint and the day goes on; policy_training.gate_reason says why).",
        ),
    ],
)
def daily_update(
    context: dg.AssetExecutionContext,
    config: DailyUpdateConfig,
    warehouse: dg.ResourceParam[Warehouse],
    model_backend: dg.ResourceParam[ModelLoader],
    judge: dg.ResourceParam[Judge],
    market_data: dg.ResourceParam[MarketData],
):
    """Score yesterday's rollouts with the judge, train the policy with GSPO (on them and on earlier
    notes whose price matured), generate today's rollouts."""
    try:
        result = run_daily_update(warehouse, model_backend, judge, context.partition_key, config.settings(), market_data)
    except (DailyUpdateError, ValueError) as err:  # ValueError: a bad run config (reward weights, gate thresholds)
        raise dg.Failure(str(err)) from err
    yield dg.MaterializeResult(asset_key="rollout_scores", metadata=scores_metadata(result, judge.describe(model_backend), config, judge))
    yield dg.MaterializeResult(asset_key="policy_checkpoint", metadata=checkpoint_metadata(result))
    yield dg.MaterializeResult(asset_key="rollouts", metadata=rollouts_metadata(result))
    for name, check in result.checks.items():
        yield dg.AssetCheckResult(asset_key=CHECK_ASSET[name], check_name=name, passed=check["passed"], metadata=check["metadata"])
    gate = result.gate
    yield dg.AssetCheckResult(
        asset_key="policy_checkpoint", check_name="update_accepted_by_gate", passed=gate.verdict != "rejected",
        severity=dg.AssetCheckSeverity.WARN, metadata={"gate": gate.verdict, "reason": gate.reason},
    )


CHECK_ASSET = {
    "ranks_are_permutations": "rollout_scores", "rewards_in_range": "rollout_scores",
    "loads_and_generates": "policy_checkpoint", "generated_by_own_checkpoint": "rollouts",
}


def scores_metadata(result: DailyUpdateResult, judge_name: str, config: DailyUpdateConfig, judge) -> dict:
    scores = result.scores
    bias = position_bias(scores)
    unusable = scores.groupby("headline_id")["unusable_reason"].first() if len(scores) else pd.Series(dtype=str)
    reward = scores["reward"] if len(scores) else pd.Series(dtype=float)
    return _present({
        "dagster/row_count": len(scores), "prediction_date": result.prediction_day, "outcome_headlines_date": result.outcome_day,
        "override": config.outcome_headlines_date is not None, "judge": judge_name,
        "groups": int(scores["headline_id"].nunique()) if len(scores) else 0,
        "judge_retries": int(scores.groupby("headline_id")["judge_retries"].first().sum()) if len(scores) else 0,
        "judge_fallbacks": int(scores.groupby("headline_id")["judge_fallback"].first().sum()) if len(scores) else 0,
        "usable_share": _num(scores["usable"].mean()) if len(scores) else None,
        "unusable_groups": dg.MetadataValue.md(_counts_table(unusable[unusable != ""].value_counts(), "reason", "groups")),
        "judge_mean_rank_by_shown_position": dg.MetadataValue.md(_mapping_table(bias["by_shown_position"], "shown position", "mean rank")),
        "judge_mean_rank_by_rollout_index": dg.MetadataValue.md(_mapping_table(bias["by_rollout_index"], "rollout index", "mean rank")),
        "judge_notes_truncated": int(scores["judge_truncated"].sum()) if len(scores) else 0,
        "judge_prompt_tokens": judge.prompt_tokens,
        "reward_mean": _num(reward.mean()) if len(reward) else None,
        "reward_min": _num(reward.min()) if len(reward) else None,
        "reward_max": _num(reward.max()) if len(reward) else None,
        "reward_weights": scores["reward_weights"].iloc[0] if len(scores) else None,
        "reward_clip": scores["reward_clip"].iloc[0] if len(scores) else None,
        "score_seconds": round(result.timings["score_s"], 2),
    })


def checkpoint_metadata(result: DailyUpdateResult) -> dict:
    info, row = result.checkpoint, result.training_row
    return _present({
        "policy_version": info["policy_version"], "kind": info["kind"], "parent_version": str(info["parent_version"]),
        "path": dg.MetadataValue.path(result.checkpoint_dir), "trained": result.trained,
        "examples": row["examples"], "steps": row["steps"], "loss": _num(row["loss"]),
        "mean_reward": _num(row["mean_reward"]),
        "kl_to_base": _num(row["kl_to_base"], 6),  # exact, per token, at the sampling temperature
        "grad_norm_median": _num(row["grad_norm_median"]), "grad_norm_iqr": _num(row["grad_norm_iqr"]),
        "clip_fraction": _num(row["clip_fraction"]), "train_seconds": round(result.timings["train_s"], 2),
        # stored behaviour log-probs vs pi_old recomputed by the training forward: ~1e-6 in fp32
        "behavior_logprob_gap_max": _num(row["behavior_logprob_gap_max"], 8),
        "sampling_temperature": result.gspo.temperature if result.trained else None,
        "objective": result.gspo.objective, "learning_rate": result.gspo.learning_rate,
        "gate": result.gate.verdict, "gate_reason": result.gate.reason,
        "gate_kl_to_parent": _num(row["gate_kl_to_parent"], 6),
        "gate_probe_structure": _num(row["gate_probe_structure"]),
        "gate_probe_parent_structure": _num(row["gate_probe_parent_structure"]),
        **{k: _num(v) if isinstance(v, float) else v for k, v in result.price_row.items() if k not in ("date", "clip_fraction")},
        "reward_ledger_rows": len(result.ledger),
    })


def rollouts_metadata(result: DailyUpdateResult) -> dict:
    rollouts, row = result.rollouts, result.training_row
    return _present({
        "dagster/row_count": len(rollouts), "headlines": result.headlines, "rollouts_per_headline": result.n_rollouts,
        "max_new_tokens": result.max_new_tokens, "policy_version": result.checkpoint["policy_version"],
        "mean_structure_score": _num(row["mean_structure"]), "generated_tokens": row["generated_tokens"],
        "tokens_per_second": round(row["generated_tokens"] / max(result.timings["generate_s"], 1e-9), 1),
        "generate_seconds": round(result.timings["generate_s"], 2),
        "example": dg.MetadataValue.md(f"```\n{rollouts['response'].iloc[0][:600]}\n```") if len(rollouts) else None,
    })


def _num(value, digits: int = 4) -> float | None:
    """A rounded float for metadata (Dagster plots it); None for NaN (not trained / nothing scored)."""
    value = float(value)
    return round(value, digits) if value == value else None


def _present(metadata: dict) -> dict:
    return {k: v for k, v in metadata.items() if v is not None}


def _mapping_table(values: dict, key: str, value: str) -> str:
    rows = "".join(f"| {k} | {v:.3f} |\n" for k, v in values.items())
    return f"| {key} | {value} |\n| --- | --- |\n{rows}" if rows else "none"


def _counts_table(counts: pd.Series, key: str, value: str) -> str:
    rows = "".join(f"| {k} | {int(v)} |\n" for k, v in counts.items())
    return f"| {key} | {value} |\n| --- | --- |\n{rows}" if rows else "none"
