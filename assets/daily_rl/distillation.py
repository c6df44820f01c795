"""Tier 3, distillation (docs/tiers.md): `distill_samples` (a teacher's traces and people's verified
corrections of day D) and `distilled_policy` (one gated SFT run over the unused samples), both run
by the `distillation` step (`outcome_flywheel.daily_rl.distillation.step`) through the step runner."""

from datetime import datetime, timezone
from typing import Optional

import dagster as dg
from pydantic import Field

from assets.catalog import MODEL_KINDS, OWNERS, TABLE_KINDS, table_metadata
from assets.partitions import daily_rl_partitions
from outcome_flywheel.daily_rl.distillation.samples import SAMPLE_COLUMNS, SAMPLES_TABLE
from outcome_flywheel.daily_rl.distillation.step import STEP as DISTILLATION_STEP
from outcome_flywheel.daily_rl.distillation.train import DEFAULT_MIN_SAMPLES, DistillConfig, teacher_name
from outcome_flywheel.models.loader import ModelLoader
from outcome_flywheel.models.train.sft_config import SFTConfig
from outcome_flywheel.steps.codec import to_payload
from outcome_flywheel.storage import Warehouse
from outcome_flywheel.tracking import Tracker
from resources.steps import StepRunnerResource


class DistillSamplesConfig(dg.Config):
    max_new_tokens: int = Field(
        default=256, ge=1, description="Token budget of each teacher answer (reasoning included)."
    )


@dg.asset(
    partitions_def=daily_rl_partitions,
    group_name="distillation",
    deps=["headlines", "rollout_scores", "base_model"],
    pool="accelerator",
    owners=OWNERS,
    kinds=TABLE_KINDS,
    metadata=table_metadata(SAMPLES_TABLE, SAMPLE_COLUMNS),
)
def distill_samples(
    context: dg.AssetExecutionContext,
    config: DistillSamplesConfig,
    model_backend: dg.ResourceParam[ModelLoader],
    warehouse: dg.ResourceParam[Warehouse],
    step_runner: StepRunnerResource,
):
    """The teacher (FLYWHEEL_TEACHER_MODEL, never the policy; default a second tiny-local, seed + 1)
    answers 15% of D's headlines at random plus the 3 most confident judged groups, thinking on; a
    trace with reasoning gives three SFT samples (prompt -> reasoning, prompt -> answer, prompt +
    reasoning -> answer), one without gives one; D's verified corrections give prompt -> answer."""
    extras = {
        "action": "samples",
        "warehouse": to_payload(warehouse),
        "models": to_payload(model_backend),
        "teacher": teacher_name(),
        "max_new_tokens": config.max_new_tokens,
    }
    yield from step_runner.run_step(context, DISTILLATION_STEP, extras).get_results()


class DistilledPolicyConfig(dg.Config):
    learning_rate: Optional[float] = Field(
        default=None, description=f"SFT learning rate. Default: {SFTConfig().learning_rate}."
    )
    epochs: Optional[int] = Field(
        default=None, description=f"Passes over each phase's samples. Default: {SFTConfig().epochs}."
    )
    min_samples: int = Field(
        default=1,
        ge=1,
        description=f"Refuse fewer unused samples (the sensor waits for FLYWHEEL_DISTILL_MIN_SAMPLES, default {DEFAULT_MIN_SAMPLES}).",
    )
    gate_enabled: bool = Field(default=True, description="Gate the distilled candidate as a daily update is gated.")


@dg.asset(
    group_name="distillation",
    deps=["distill_samples", "base_model"],
    pool="accelerator",
    owners=OWNERS,
    kinds=MODEL_KINDS,
    check_specs=[
        dg.AssetCheckSpec(
            "distilled_accepted_by_gate",
            asset="distilled_policy",
            description="The distilled candidate passed the daily loop's evaluation gate (WARN when rejected).",
        )
    ],
)
def distilled_policy(
    context: dg.AssetExecutionContext,
    config: DistilledPolicyConfig,
    model_backend: dg.ResourceParam[ModelLoader],
    warehouse: dg.ResourceParam[Warehouse],
    step_runner: StepRunnerResource,
    tracking: dg.ResourceParam[Tracker],
):
    """One distillation run: the latest verified policy, SFT (LoRA, completion-only) on the unused
    samples in phases (answer, reasoning, consistency), the daily evaluation gate, then a new
    checkpoint `<day>.distill-<run>` published and verified before `latest` moves (accepted only);
    an A/B against the parent in the metadata. Under the single trainer lock, audited in `training_audit`."""
    defaults = SFTConfig()
    sft = SFTConfig(
        learning_rate=config.learning_rate or defaults.learning_rate,
        epochs=config.epochs or defaults.epochs,
        seed=model_backend.seed,
    )
    distill = DistillConfig(sft=sft, min_samples=config.min_samples)
    distill.gate.enabled = config.gate_enabled
    run = f"{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}-{context.run_id[:8]}"
    trigger = context.run.tags.get("flywheel/reason") or f"run {context.run_id[:8]}"
    extras = {
        "action": "train",
        "warehouse": to_payload(warehouse),
        "models": to_payload(model_backend),
        "run": run,
        "config": to_payload(distill),
        "trigger": trigger,
        "training_id": f"distillation:{run}",
        "tracking": to_payload(tracking),  # the step records the run in MLflow
    }
    yield from step_runner.run_step(context, DISTILLATION_STEP, extras).get_results()
