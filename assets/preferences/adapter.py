"""`preference_adapter`: LoRA weighted DPO on the base model from the training split of `dpo_dataset`,
trained by the step process `outcome_flywheel.preferences.adapter_step` (docs/pipes.md)."""

import shutil
import time
from datetime import datetime, timezone
from typing import Optional

import dagster as dg
import pandas as pd
from pydantic import Field

from assets.catalog import MODEL_KINDS, OWNERS, column_names, table_metadata
from outcome_flywheel.models.interface import LoraSettings
from outcome_flywheel.models.loader import ModelLoader
from outcome_flywheel.models.train.dpo_config import WeightedDPOConfig
from outcome_flywheel.preferences.adapter_step import STEP as ADAPTER_STEP
from outcome_flywheel.preferences.adapter_step import SUMMARY_KEY
from outcome_flywheel.preferences.pool import restore_pool
from outcome_flywheel.preferences.status import ADAPTERS_DIR
from outcome_flywheel.preferences.weighting import dataset_fingerprint
from outcome_flywheel.steps.codec import to_payload
from outcome_flywheel.storage import Warehouse
from outcome_flywheel.tracking import Tracker
from resources.settings import mirrored
from resources.steps import StepRunnerResource

HISTORY_TABLE = "preference_training_history"


class PreferenceAdapterConfig(dg.Config):
    """Run config; a field left unset takes `WeightedDPOConfig`'s default (the one source of truth)."""

    learning_rate: Optional[float] = mirrored(WeightedDPOConfig, "learning_rate", optional=True)
    epochs: Optional[int] = mirrored(WeightedDPOConfig, "epochs", optional=True)
    beta: Optional[float] = mirrored(WeightedDPOConfig, "beta", optional=True)
    batch_size: Optional[int] = mirrored(WeightedDPOConfig, "batch_size", optional=True)
    lora_r: Optional[int] = Field(
        default=None, description=f"LoRA rank. Default: {WeightedDPOConfig().lora.r} (WeightedDPOConfig.lora)."
    )
    lora_alpha: Optional[int] = Field(
        default=None,
        description=f"LoRA alpha (scale = alpha / r). Default: {WeightedDPOConfig().lora.alpha} (WeightedDPOConfig.lora).",
    )
    max_grad_norm: Optional[float] = mirrored(WeightedDPOConfig, "max_grad_norm", optional=True)
    completion_unit: Optional[str] = mirrored(WeightedDPOConfig, "completion_unit", optional=True)
    seed: Optional[int] = Field(
        default=None, description="Seeds the LoRA init and the batch order. Default: FLYWHEEL_SEED."
    )


def adapter_run_id(dagster_run_id: str, now: datetime) -> str:
    """Sortable and unique: UTC time then the Dagster run id's first 8 characters."""
    return f"{now:%Y%m%dT%H%M%SZ}-{dagster_run_id[:8]}"


@dg.asset(
    group_name="flywheel",
    deps=["dpo_dataset", "base_model"],
    pool="accelerator",
    kinds=MODEL_KINDS,
    owners=OWNERS,
    # Every training run is a row of `preference_training_history`: its columns are shown here.
    metadata=table_metadata(HISTORY_TABLE, column_names(HISTORY_TABLE)),
    check_specs=[
        dg.AssetCheckSpec(
            "loss_is_finite",
            asset="preference_adapter",
            blocking=True,
            description="Every DPO step's loss is finite and below 1e6 (a diverged run does not feed holdout_eval).",
        )
    ],
)
def preference_adapter(
    context: dg.AssetExecutionContext,
    config: PreferenceAdapterConfig,
    model_backend: dg.ResourceParam[ModelLoader],
    warehouse: dg.ResourceParam[Warehouse],
    step_runner: StepRunnerResource,
    tracking: dg.ResourceParam[Tracker],
):
    """LoRA adapter (r=8) trained with outcome-weighted DPO (beta 0.02, plans scored line by line) on
    the training split of `dpo_dataset`: exact per-pair weights, reference = the base with the
    adapter disabled. Trained by a step process (`step_runner`, docs/pipes.md) that saves it in
    PEFT layout under adapters/preference/<run>/ and moves the `latest` pointer only after a
    successful run. Every run (failed and killed ones too) appends a row to `preference_training_history`."""
    pairs_df = warehouse.read("dpo_dataset")
    train = pairs_df[pairs_df["split"] == "train"] if len(pairs_df) else pairs_df
    default_lora = WeightedDPOConfig().lora
    cfg = WeightedDPOConfig.with_overrides(
        learning_rate=config.learning_rate,
        epochs=config.epochs,
        beta=config.beta,
        batch_size=config.batch_size,
        max_grad_norm=config.max_grad_norm,
        completion_unit=config.completion_unit,
        lora=LoraSettings(r=config.lora_r or default_lora.r, alpha=config.lora_alpha or default_lora.alpha),
        seed=model_backend.seed if config.seed is None else config.seed,
    )
    started_at = datetime.now(timezone.utc)
    run = adapter_run_id(context.run_id, started_at)
    root = warehouse.path(*ADAPTERS_DIR)
    history = {
        "run": run,
        "dagster_run_id": context.run_id,
        "started_at": started_at.isoformat(),
        "base_model": model_backend.base_model,
        "backend": model_backend.backend,
        "n_pairs": int(len(train)),
        "n_holdout": int(len(pairs_df) - len(train)),
        "dataset_fingerprint": dataset_fingerprint(pairs_df) if len(pairs_df) else "",
        "learning_rate": cfg.learning_rate,
        "beta": cfg.beta,
        "epochs": cfg.epochs,
        "lora_r": cfg.lora.r,
        "completion_unit": cfg.completion_unit,
        "steps": 0,
        "loss_first": float("nan"),
        "loss_last": float("nan"),
        "wall_s": float("nan"),
        "status": "failed",
        "error": "",
        "adapter_path": "",
    }
    t0 = time.perf_counter()
    try:
        if train.empty:
            raise ValueError(
                "dpo_dataset has no training pairs: materialise operator_decisions, decision_outcomes and dpo_dataset first"
            )
        extras = {
            "warehouse": to_payload(warehouse),
            "models": to_payload(model_backend),
            "config": cfg.as_dict(),
            "run": run,
            "dataset_fingerprint": history["dataset_fingerprint"],
            "tracking": to_payload(tracking),  # the step records the training in MLflow
        }
        invocation = step_runner.run_step(context, ADAPTER_STEP, extras)
        figures = [m[SUMMARY_KEY] for m in invocation.get_custom_messages() if isinstance(m, dict) and SUMMARY_KEY in m]
        if not figures:
            raise dg.Failure(description="the preference_adapter step ended without reporting its training figures")
        history.update(status="succeeded", **figures[-1])
    except Exception as err:
        history["error"] = f"{type(err).__name__}: {err}"[:2000]
        raise
    finally:
        # A killed step leaves its copy of the pair pool (backups_dpo_dataset, run=<run>) unrestored:
        # the pool is written back from it and the copy removed (`restore_pool`; docs/tiers.md, "Safety").
        try:
            note = (
                f"dpo_dataset restored from backups_dpo_dataset run={run}: the step ended without restoring it (killed?)"
                if restore_pool(warehouse, "dpo_dataset", run)
                else ""
            )
        except Exception as err:  # the history row is still written; the next training removes the copy
            note = f"dpo_dataset not restored from backups_dpo_dataset run={run}: {type(err).__name__}: {err}"
        if note:
            context.log.warning(note)
            history["error"] = f"{history['error']}; {note}"[:2000] if history["error"] else note
        history["wall_s"] = round(time.perf_counter() - t0, 3)
        history["finished_at"] = datetime.now(timezone.utc).isoformat()
        warehouse.write(
            HISTORY_TABLE, pd.DataFrame([history])[column_names(HISTORY_TABLE, history)], partition=run, key="run"
        )
        # A killed step leaves its staging folder behind (its own cleanup never ran).
        for staging in root.glob(f".staging-{run}-*") if root.exists() else ():
            shutil.rmtree(staging, ignore_errors=True)
    yield from invocation.get_results()
