"""`rollout_pairs`: best-vs-worst preference pairs from each judged group, with exports."""

from typing import Optional

import dagster as dg
from pydantic import Field

from assets.catalog import OWNERS, TABLE_KINDS, table_metadata
from assets.partitions import daily_rl_partitions
from outcome_flywheel.daily_rl.reward.pairs import (
    DEFAULT_MIN_REWARD_GAP,
    PAIR_COLUMNS,
    build_rollout_pairs,
    pair_exports,
)
from outcome_flywheel.storage import Warehouse, atomic_write_bytes

PREVIOUS_DAY = dg.TimeWindowPartitionMapping(start_offset=-1, end_offset=-1)
EXPORT_DIR = ("exports", "rollout_pairs")


class RolloutPairsConfig(dg.Config):
    min_reward_gap: Optional[float] = Field(
        default=None,
        ge=0,
        description=(
            f"A group's best and worst notes make a pair only when their rewards differ by at least this. Default: {DEFAULT_MIN_REWARD_GAP}."
        ),
    )


@dg.asset(
    partitions_def=daily_rl_partitions,
    group_name="daily_rl",
    deps=["rollout_scores", dg.AssetDep("rollouts", partition_mapping=PREVIOUS_DAY)],
    pool="duckdb",
    kinds=TABLE_KINDS,
    owners=OWNERS,
    metadata=table_metadata("rollout_pairs", PAIR_COLUMNS),
)
def rollout_pairs(
    context: dg.AssetExecutionContext, config: RolloutPairsConfig, warehouse: dg.ResourceParam[Warehouse]
):
    """For each judged group scored on D (D-1's notes): the best note over the worst (tie-breaks: reward,
    then structure, then the shorter note), kept when the reward gap is at least 0.3 (run config);
    groups without that contrast go to `rollout_no_contrast` with the reason; duplicates dropped.
    Exported for TRL, NeMo-RL and Together/OpenAI under exports/rollout_pairs/D/, with `pairs.meta.json`
    (rollout ids, scores, seed, policy version of each line)."""
    day = context.partition_key
    scores = warehouse.read("rollout_scores", day)
    prediction_day = str(scores["prediction_date"].iloc[0]) if len(scores) else None
    rollouts = warehouse.read("rollouts", prediction_day) if prediction_day else scores.iloc[0:0]
    gap = config.min_reward_gap if config.min_reward_gap is not None else DEFAULT_MIN_REWARD_GAP
    pairs, no_contrast = build_rollout_pairs(scores, rollouts, gap)
    warehouse.write("rollout_pairs", pairs, partition=day)
    warehouse.write("rollout_no_contrast", no_contrast, partition=day)
    folder = warehouse.path(*EXPORT_DIR, day)
    for name, data in pair_exports(pairs).items():
        atomic_write_bytes(folder / name, data)
    reasons = (
        no_contrast["reason"].str.replace(r"[0-9.]+ <", "gap <", regex=True).value_counts() if len(no_contrast) else {}
    )
    return dg.MaterializeResult(
        metadata={
            "dagster/row_count": len(pairs),
            "groups": int(scores["headline_id"].nunique()) if len(scores) else 0,
            "no_contrast": len(no_contrast),
            "min_reward_gap": gap,
            "mean_reward_gap": round(float(pairs["reward_gap"].mean()), 4) if len(pairs) else 0.0,
            "no_contrast_reasons": dg.MetadataValue.json({k: int(v) for k, v in dict(reasons).items()}),
            "export_dir": dg.MetadataValue.path(str(folder)),
        }
    )
