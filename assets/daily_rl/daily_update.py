"""`daily_update`: the daily outcome RL step as one non-subsettable multi-asset.

The loop is a cycle (policy -> rollouts -> scores -> policy). Dagster accepts a cycle only as an
asset depending on its own earlier partition, so all three keys live in one multi-asset and each
depends on the day's `headlines` and on its own previous partition (docs/daily_rl.md, "Why one
multi-asset": other shapes break asset backfills or run days out of order). Inside, in order:

1. score    `rollout_scores`(D):    rollouts(D-1) ranked by the judge against headlines(D)
                                    (or headlines(H) with run config `outcome_headlines_date: H`)
2. train    `policy_checkpoint`(D): checkpoint(D-1) + GSPO on the usable scores of D
3. generate `rollouts`(D):          8 notes per headline of D from checkpoint(D)
"""

import json
import time
from datetime import date
from typing import Optional

import dagster as dg
import numpy as np
import pandas as pd
import torch
from pydantic import Field

from outcome_flywheel.daily_rl.judging import is_permutation, stable_seed
from outcome_flywheel.daily_rl.loop import (
    SCORE_COLUMNS, check_behaviour_policy, generate_rollouts, judge_inputs, kl_to_base, load_policy, parent_checkpoint,
    position_bias, previous_day, sampling_temperature, UnverifiedCheckpoint, mark_verified, publish_checkpoint, quartiles,
    read_checkpoint, score_table, training_examples,
)
from assets.partitions import daily_partitions
from outcome_flywheel.daily_rl.judge import Judge
from outcome_flywheel.models import LoraSettings, ModelLoader
from outcome_flywheel.models.torch.gspo import GSPOConfig
from outcome_flywheel.models.prompts import trading_note_messages
from outcome_flywheel.settings import env
from outcome_flywheel.storage import Warehouse

KEYS = ("rollout_scores", "policy_checkpoint", "rollouts")
PREVIOUS_DAY = dg.TimeWindowPartitionMapping(start_offset=-1, end_offset=-1)
TINY_LOCAL_MAX_NEW_TOKENS = 160  # tiny-local's notes end within ~80 tokens

_DESCRIPTIONS = {
    "rollout_scores": "Yesterday's rollouts scored against today's headlines: judge rank (iterative A-H selection), "
                      "rank reward, structure score, reward = 0.5/0.5 mix, group-normalised advantage, usable flag.",
    "policy_checkpoint": "The policy of day D: yesterday's checkpoint trained with GSPO on today's usable scores "
                         "(LoRA by default), saved under checkpoints/policy/D/ with `latest` moved atomically.",
    "rollouts": "Notes sampled by today's checkpoint for each of today's headlines (8 each by default; temperature 0.8, "
                "top-p 0.95, top-k 50), with the sampled token ids and per-token behaviour log-probs at the sampling "
                "temperature (log-softmax of logits / T, before top-k/top-p): the behaviour policy GSPO uses as pi_old.",
}


class DailyUpdateConfig(dg.Config):
    outcome_headlines_date: Optional[str] = Field(
        default=None,
        description="Override re-run: score the previous day's rollouts against the headlines of this day "
                    "(YYYY-MM-DD, must be materialised) instead of the partition's own day.",
    )
    rollouts_per_headline: Optional[int] = Field(default=None, description="Default: FLYWHEEL_ROLLOUTS_PER_HEADLINE or 8.")
    max_new_tokens: Optional[int] = Field(
        default=None, description=f"Default: FLYWHEEL_MAX_NEW_TOKENS, else 512 ({TINY_LOCAL_MAX_NEW_TOKENS} on tiny-local)."
    )
    objective: str = Field(default="gspo", description="gspo | reward_weighted.")
    learning_rate: float = Field(default=2e-3, description="Adam step size (2e-3 suits tiny-local + LoRA; ~1e-4 for 0.6B LoRA).")
    batch_size: int = Field(default=16, description="Sequences per padded minibatch.")
    epochs: int = 1
    full_fine_tune: bool = Field(default=False, description="Train every weight instead of a LoRA adapter.")
    lora_r: int = 8
    lora_alpha: int = 16


def resolved_sizes(config: DailyUpdateConfig, model_backend: dg.ResourceParam[ModelLoader]) -> tuple[int, int]:
    n = config.rollouts_per_headline or int(env("FLYWHEEL_ROLLOUTS_PER_HEADLINE", "8"))
    default_tokens = str(TINY_LOCAL_MAX_NEW_TOKENS if model_backend.is_tiny_local else 512)
    return n, config.max_new_tokens or int(env("FLYWHEEL_MAX_NEW_TOKENS", default_tokens))


def _check(key: str, name: str, description: str) -> dg.AssetCheckSpec:
    return dg.AssetCheckSpec(name, asset=key, blocking=True, description=description)


@dg.multi_asset(
    name="daily_update",
    specs=[
        dg.AssetSpec(
            key, deps=[dg.AssetDep("headlines"), dg.AssetDep(key, partition_mapping=PREVIOUS_DAY)],
            partitions_def=daily_partitions, group_name="daily_rl", description=_DESCRIPTIONS[key],
            kinds={"pytorch"} if key == "policy_checkpoint" else {"parquet"},
        )
        for key in KEYS
    ],
    partitions_def=daily_partitions,
    can_subset=False,
    pool="accelerator",
    check_specs=[
        _check("rollout_scores", "ranks_are_permutations", "Each headline's ranks are a permutation of 1..N."),
        _check("rollout_scores", "rewards_in_unit_interval", "Every reward, structure score and rank reward is in [0, 1]."),
        _check("policy_checkpoint", "loads_and_generates", "The saved checkpoint loads from disk and writes text."),
        _check("rollouts", "generated_by_own_checkpoint", "Every rollout of D carries checkpoint D's policy_version."),
    ],
)
def daily_update(
    context: dg.AssetExecutionContext,
    config: DailyUpdateConfig,
    warehouse: dg.ResourceParam[Warehouse],
    model_backend: dg.ResourceParam[ModelLoader],
    judge: dg.ResourceParam[Judge],
):
    """Score yesterday's rollouts with the judge, train the policy with GSPO, generate today's rollouts."""
    day = context.partition_key
    prediction_day = previous_day(day)
    outcome_day = config.outcome_headlines_date or day
    try:
        date.fromisoformat(outcome_day)
    except ValueError as err:
        raise dg.Failure(f"outcome_headlines_date must be YYYY-MM-DD, got {outcome_day!r}") from err
    if outcome_day <= prediction_day:
        raise dg.Failure(f"outcome headlines ({outcome_day}) must come after the predictions ({prediction_day})")
    n_rollouts, max_new_tokens = resolved_sizes(config, model_backend)
    seed = model_backend.seed
    timings: dict[str, float] = {}

    # The parent is checked first: nothing is scored or written when it may not be trained from.
    ckpt_root = warehouse.path("checkpoints", "policy")
    try:
        parent = parent_checkpoint(ckpt_root, day)
    except UnverifiedCheckpoint as err:
        raise dg.Failure(str(err)) from err

    # 1. score ---------------------------------------------------------------------------
    started = time.perf_counter()
    prev_rollouts = warehouse.read("rollouts", prediction_day)
    try:  # pi_old must be the checkpoint this day trains: else the importance ratios mean nothing
        check_behaviour_policy(prev_rollouts, parent[1]["policy_version"] if parent else None, prediction_day)
    except ValueError as err:
        raise dg.Failure(str(err)) from err
    scores = pd.DataFrame(columns=SCORE_COLUMNS)
    if not prev_rollouts.empty:
        if not warehouse.exists("headlines", outcome_day):
            raise dg.Failure(f"headlines of {outcome_day} are not materialised: materialise `headlines` for that day first")
        outcome_titles = list(warehouse.read("headlines", outcome_day).get("title", pd.Series(dtype=str)))
        judge_backend = judge.load(model_backend)
        inputs = judge_inputs(prev_rollouts, outcome_titles, judge.outcome_context, seed, day)
        judgements = judge.rank(judge_backend, inputs.groups)
        scores = score_table(inputs, judgements, day, prediction_day, outcome_day)
        del judge_backend
    warehouse.write("rollout_scores", scores, partition=day)
    timings["score_s"] = time.perf_counter() - started

    # 2. train ---------------------------------------------------------------------------
    started = time.perf_counter()
    parent_dir, parent_info = parent if parent else (None, None)
    policy = load_policy(model_backend, parent_dir, parent_info)
    examples = training_examples(prev_rollouts, scores)
    gspo_config = GSPOConfig(
        objective=config.objective, learning_rate=config.learning_rate, batch_size=config.batch_size,
        epochs=config.epochs, lora=None if config.full_fine_tune else LoraSettings(r=config.lora_r, alpha=config.lora_alpha),
        seed=stable_seed(seed, day, "shuffle") % (2**31),
        temperature=sampling_temperature(prev_rollouts) if examples else 1.0,
    )
    stats = None
    if examples:
        torch.manual_seed(stable_seed(seed, day, "train") % (2**31))  # LoRA init and anything random: re-runs repeat
        stats = policy.train_gspo(examples, gspo_config)
    is_base = stats is None and (parent_info is None or parent_info["kind"] == "base")
    info = publish_checkpoint(policy, ckpt_root, day, {
        "date": day, "parent_date": parent_info["date"] if parent_info else None,
        "parent_version": parent_info["policy_version"] if parent_info else None,
        "base_model": model_backend.base_model, "backend": model_backend.backend, "trained": stats is not None,
        "examples": len(examples), "objective": config.objective, "learning_rate": config.learning_rate,
        "outcome_headlines_date": outcome_day,
    }, is_base=is_base)
    timings["train_s"] = time.perf_counter() - started

    # 3. generate ------------------------------------------------------------------------
    started = time.perf_counter()
    todays = warehouse.read("headlines", day)
    rollouts = generate_rollouts(policy, todays, day, seed, n_rollouts, max_new_tokens, info["policy_version"])
    warehouse.write("rollouts", rollouts, partition=day)
    timings["generate_s"] = time.perf_counter() - started
    generated_tokens = int(rollouts["n_tokens"].sum()) if not rollouts.empty else 0

    # Exact KL(policy || base) per token over the vocabulary, at the positions the new policy just sampled.
    started = time.perf_counter()
    kl = 0.0
    if not rollouts.empty and not is_base:
        kl = kl_to_base(policy, rollouts, base=None if policy.has_adapter else model_backend.load())
    timings["kl_s"] = time.perf_counter() - started

    grad_median, grad_iqr = quartiles(stats.grad_norms if stats else [])
    usable = scores[scores["usable"]] if not scores.empty else scores
    training_row = dict(
        date=day, policy_version=info["policy_version"], kind=info["kind"], parent_version=info["parent_version"],
        trained=stats is not None, examples=len(examples), steps=stats.steps if stats else 0,
        loss=stats.mean_loss if stats else float("nan"),
        mean_reward=float(usable["reward"].mean()) if len(usable) else float("nan"),
        kl_to_base=kl, grad_norm_median=grad_median, grad_norm_iqr=grad_iqr,
        clip_fraction=float(np.mean(stats.extra.get("clip_fraction", [np.nan]))) if stats else float("nan"),
        behavior_logprob_gap_max=float(stats.extra.get("behavior_logprob_gap_max", np.nan)) if stats else float("nan"),
        train_wall_s=stats.wall_s if stats else 0.0, objective=config.objective, learning_rate=config.learning_rate,
        headlines=len(todays), rollouts=len(rollouts), generated_tokens=generated_tokens,
        mean_structure=float(rollouts["structure_score"].mean()) if len(rollouts) else float("nan"),
        scored=len(scores), usable=len(usable), outcome_headlines_date=outcome_day, **timings,
    )
    warehouse.write("policy_training", pd.DataFrame([training_row]), partition=day)

    # checks -----------------------------------------------------------------------------
    ranks_ok = all(is_permutation(list(g["rank"])) for _, g in scores.groupby("headline_id")) if len(scores) else True
    bounded = ["reward", "structure_score", "outcome_reward"]
    rewards_ok = bool(((scores[bounded] >= 0) & (scores[bounded] <= 1)).all().all()) if len(scores) else True
    on_disk = read_checkpoint(ckpt_root / day) or {}
    own_version = bool(len(rollouts) == 0 or (rollouts["policy_version"] == on_disk.get("policy_version")).all())
    reloaded = load_policy(model_backend, ckpt_root / day, on_disk)
    probe = reloaded.greedy([trading_note_messages("Apple beats quarterly estimates", "")], max_new_tokens=12)[0]
    # The weights on disk, not just the label: they must give the stored behaviour log-probs back.
    logprob_gap = behavior_logprob_gap(reloaded, rollouts.head(8)) if len(rollouts) else 0.0
    logprob_tolerance = 1e-3 if str(getattr(reloaded, "dtype", "float32")).endswith("float32") else 5e-2
    del reloaded

    checks_pass = ranks_ok and rewards_ok and bool(probe.strip()) and own_version and logprob_gap <= logprob_tolerance
    if checks_pass:
        mark_verified(ckpt_root, day)  # only now may the next day train from it, and `latest` move

    reward_stats = _describe(scores["reward"]) if len(scores) else {}
    bias = position_bias(scores)
    unusable = scores.groupby("headline_id")["unusable_reason"].first() if len(scores) else pd.Series(dtype=str)
    yield dg.MaterializeResult(
        asset_key="rollout_scores",
        metadata=_present({
            "dagster/row_count": len(scores), "prediction_date": prediction_day, "outcome_headlines_date": outcome_day,
            "override": config.outcome_headlines_date is not None, "judge": judge.describe(model_backend),
            "groups": int(scores["headline_id"].nunique()) if len(scores) else 0,
            "judge_retries": int(scores.groupby("headline_id")["judge_retries"].first().sum()) if len(scores) else 0,
            "judge_fallbacks": int(scores.groupby("headline_id")["judge_fallback"].first().sum()) if len(scores) else 0,
            "usable_share": _num(scores["usable"].mean()) if len(scores) else None,
            "unusable_groups": dg.MetadataValue.json({str(k): int(v) for k, v in unusable[unusable != ""].value_counts().items()}),
            "judge_mean_rank_by_shown_position": dg.MetadataValue.json(bias["by_shown_position"]),
            "judge_mean_rank_by_rollout_index": dg.MetadataValue.json(bias["by_rollout_index"]),
            "reward": dg.MetadataValue.json(reward_stats), "score_seconds": round(timings["score_s"], 2),
        }),
    )
    yield dg.MaterializeResult(
        asset_key="policy_checkpoint",
        metadata=_present({
            "policy_version": info["policy_version"], "kind": info["kind"], "parent_version": str(info["parent_version"]),
            "path": dg.MetadataValue.path(str(ckpt_root / day)), "trained": stats is not None,
            "examples": len(examples), "steps": training_row["steps"], "loss": _num(training_row["loss"]),
            "mean_reward": _num(training_row["mean_reward"]),
            "kl_to_base": dg.MetadataValue.float(float(kl)),  # exact, per token, at the sampling temperature
            "grad_norm_median": _num(grad_median), "grad_norm_iqr": _num(grad_iqr),
            "clip_fraction": _num(training_row["clip_fraction"]), "train_seconds": round(timings["train_s"], 2),
            # stored behaviour log-probs vs pi_old recomputed by the training forward: ~1e-6 in fp32
            "behavior_logprob_gap_max": _num(training_row["behavior_logprob_gap_max"]),
            "sampling_temperature": gspo_config.temperature if stats else None,
            "objective": config.objective, "learning_rate": config.learning_rate,
        }),
    )
    yield dg.MaterializeResult(
        asset_key="rollouts",
        metadata=_present({
            "dagster/row_count": len(rollouts), "headlines": len(todays), "rollouts_per_headline": n_rollouts,
            "max_new_tokens": max_new_tokens, "policy_version": info["policy_version"],
            "mean_structure_score": _num(training_row["mean_structure"]), "generated_tokens": generated_tokens,
            "tokens_per_second": round(generated_tokens / max(timings["generate_s"], 1e-9), 1),
            "generate_seconds": round(timings["generate_s"], 2),
            "example": dg.MetadataValue.md(f"```\n{rollouts['response'].iloc[0][:600]}\n```") if len(rollouts) else None,
        }),
    )
    yield dg.AssetCheckResult(asset_key="rollout_scores", check_name="ranks_are_permutations", passed=bool(ranks_ok))
    yield dg.AssetCheckResult(asset_key="rollout_scores", check_name="rewards_in_unit_interval", passed=rewards_ok,
                              metadata=reward_stats)
    yield dg.AssetCheckResult(asset_key="policy_checkpoint", check_name="loads_and_generates", passed=bool(probe.strip()),
                              metadata={"sample": probe[:200]})
    yield dg.AssetCheckResult(
        asset_key="rollouts", check_name="generated_by_own_checkpoint",
        passed=bool(own_version and logprob_gap <= logprob_tolerance),
        metadata={"checkpoint_version": str(on_disk.get("policy_version")), "version_matches": own_version,
                  "max_mean_abs_logprob_gap": float(logprob_gap), "tolerance": logprob_tolerance},
    )


def behavior_logprob_gap(policy, rollouts: pd.DataFrame) -> float:
    """Largest per-rollout mean |stored behaviour log-prob - log-prob under `policy`| (teacher forced
    at the sampling temperature, as they were stored)."""
    prompts = [json.loads(p) for p in rollouts["prompt"]]
    responses = [list(r) for r in rollouts["response_ids"]]
    forced = policy.response_logprobs(prompts, responses, temperature=sampling_temperature(rollouts))
    gaps = [float(np.mean(np.abs(np.asarray(b, dtype=np.float64) - f))) for b, f in zip(rollouts["behavior_logprobs"], forced) if len(f)]
    return max(gaps, default=0.0)


def _num(value) -> float | None:
    """Float for metadata; None for NaN (not trained / nothing scored), dropped by `_present`."""
    value = float(value)
    return value if value == value else None


def _present(metadata: dict) -> dict:
    return {k: v for k, v in metadata.items() if v is not None}


def _describe(rewards: pd.Series) -> dict:
    return {
        "n": int(len(rewards)), "avg": round(float(rewards.mean()), 4), "min": round(float(rewards.min()), 4),
        "max": round(float(rewards.max()), 4), "negatives": int((rewards < 0).sum()),
    }
