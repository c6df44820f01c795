"""`baseline_rollouts`: the frozen base model's notes for day D, matched note for note with `rollouts`(D)."""

import dagster as dg

from assets.catalog import OWNERS, TABLE_KINDS, table_metadata
from assets.partitions import daily_rl_partitions
from outcome_flywheel.daily_rl.evaluation.ab import baseline_rollouts as sample_baseline
from outcome_flywheel.daily_rl.evaluation.ab import matching_problems
from outcome_flywheel.daily_rl.policy.rollouts import ROLLOUT_COLUMNS
from outcome_flywheel.models.loader import ModelLoader
from outcome_flywheel.storage import Warehouse


@dg.asset(
    partitions_def=daily_rl_partitions,
    group_name="daily_rl",
    deps=["rollouts", "base_model"],
    pool="accelerator",
    kinds=TABLE_KINDS,
    owners=OWNERS,
    metadata=table_metadata("baseline_rollouts", ROLLOUT_COLUMNS),
    check_specs=[
        dg.AssetCheckSpec(
            "matched_to_rollouts",
            asset="baseline_rollouts",
            blocking=True,
            description="Every note has a twin in rollouts(D) (same headline and index) with the same prompt, seed, temperature and token budget.",
        )
    ],
)
def baseline_rollouts(
    context: dg.AssetExecutionContext,
    warehouse: dg.ResourceParam[Warehouse],
    model_backend: dg.ResourceParam[ModelLoader],
):
    """The frozen base model's notes for D's headlines: the prompts, group seeds, sampling settings
    (temperature 0.8, top-p 0.95, top-k 50, token budget) and notes per headline of `rollouts`(D), so
    note (headline, k) here is matched with note (headline, k) there and only the weights differ.
    The A/B of `policy_eval` compares the two."""
    day = context.partition_key
    if not warehouse.exists("rollouts", day):
        raise dg.Failure(f"rollouts of {day} are not materialised: run daily_update for {day} first")
    rollouts = warehouse.read("rollouts", day)
    base = model_backend.load()
    version = f"base:{model_backend.base_model}"
    try:
        baseline = sample_baseline(base, rollouts, version)
    except ValueError as err:
        raise dg.Failure(str(err)) from err
    del base
    warehouse.write("baseline_rollouts", baseline, partition=day)
    problems = matching_problems(rollouts, baseline)
    twins = (
        rollouts.merge(baseline, on=["headline_id", "rollout_index"], suffixes=("", "_base"))
        if len(baseline)
        else baseline
    )
    yield dg.MaterializeResult(
        metadata={
            "dagster/row_count": len(baseline),
            "policy_version": version,
            "mean_structure_score": round(float(baseline["structure_score"].mean()), 4) if len(baseline) else 0.0,
            "policy_mean_structure_score": round(float(rollouts["structure_score"].mean()), 4)
            if len(rollouts)
            else 0.0,
            # on a day whose checkpoint is still the base, every note is identical: the A/B then says so
            "identical_to_policy_notes": int((twins["response"] == twins["response_base"]).sum()) if len(twins) else 0,
        }
    )
    yield dg.AssetCheckResult(
        check_name="matched_to_rollouts", passed=not problems, metadata={"problems": "; ".join(problems) or "none"}
    )
