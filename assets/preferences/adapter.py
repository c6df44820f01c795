"""`preference_adapter`: LoRA weighted DPO on the base model from the training split of `dpo_dataset`."""

import json
import shutil
import time
import uuid
from datetime import datetime, timezone
from typing import Optional

import dagster as dg
import pandas as pd
from pydantic import Field

from assets.catalog import MODEL_KINDS, OWNERS, column_names, table_metadata
from outcome_flywheel.preferences.scoring import training_pairs
from outcome_flywheel.preferences.status import ADAPTERS_DIR, TRAIN_INFO, prompt_context_keys
from outcome_flywheel.preferences.weighting import dataset_fingerprint
from outcome_flywheel.models import LoraSettings, ModelLoader
from outcome_flywheel.models.dpo_config import WeightedDPOConfig
from outcome_flywheel.storage import Warehouse, atomic_symlink, publish_dir
from resources.settings import mirrored

HISTORY_TABLE = "preference_training_history"


class PreferenceAdapterConfig(dg.Config):
    """Run config; a field left unset takes `WeightedDPOConfig`'s default (the one source of truth)."""

    learning_rate: Optional[float] = mirrored(WeightedDPOConfig, "learning_rate", optional=True)
    epochs: Optional[int] = mirrored(WeightedDPOConfig, "epochs", optional=True)
    beta: Optional[float] = mirrored(WeightedDPOConfig, "beta", optional=True)
    batch_size: Optional[int] = mirrored(WeightedDPOConfig, "batch_size", optional=True)
    lora_r: Optional[int] = Field(default=None, description=f"LoRA rank. Default: {WeightedDPOConfig().lora.r} (WeightedDPOConfig.lora).")
    lora_alpha: Optional[int] = Field(
        default=None, description=f"LoRA alpha (scale = alpha / r). Default: {WeightedDPOConfig().lora.alpha} (WeightedDPOConfig.lora).",
    )
    max_grad_norm: Optional[float] = mirrored(WeightedDPOConfig, "max_grad_norm", optional=True)
    completion_unit: Optional[str] = mirrored(WeightedDPOConfig, "completion_unit", optional=True)
    seed: Optional[int] = Field(default=None, description="Seeds the LoRA init and the batch order. Default: FLYWHEEL_SEED.")


def _config_table(config: dict, prefix: str = "") -> str:
    """The trainer's settings as a two-column markdown table (nested settings as `lora.r`...)."""
    rows = []
    for key, value in config.items():
        if isinstance(value, dict):
            rows += [line for line in _config_table(value, f"{prefix}{key}.").splitlines()[2:]]
        else:
            rows.append(f"| {prefix}{key} | {', '.join(map(str, value)) if isinstance(value, (list, tuple)) else value} |")
    return "| setting | value |\n| --- | --- |\n" + "\n".join(rows)


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
    check_specs=[dg.AssetCheckSpec(
        "loss_is_finite", asset="preference_adapter", blocking=True,
        description="Every DPO step's loss is finite and below 1e6 (a diverged run does not feed holdout_eval).",
    )],
)
def preference_adapter(context: dg.AssetExecutionContext, config: PreferenceAdapterConfig, model_backend: dg.ResourceParam[ModelLoader], warehouse: dg.ResourceParam[Warehouse]):
    """LoRA adapter (r=8) trained with outcome-weighted DPO (beta 0.02, plans scored line by line) on
    the training split of `dpo_dataset`: exact per-pair weights, reference = the base with the
    adapter disabled. Saved
    in PEFT layout under adapters/preference/<run>/; the `latest` pointer moves only after a
    successful run. Every run (failed ones too) appends a row to `preference_training_history`."""
    pairs_df = warehouse.read("dpo_dataset")
    train = pairs_df[pairs_df["split"] == "train"] if len(pairs_df) else pairs_df
    default_lora = WeightedDPOConfig().lora
    cfg = WeightedDPOConfig.with_overrides(
        learning_rate=config.learning_rate, epochs=config.epochs, beta=config.beta,
        batch_size=config.batch_size, max_grad_norm=config.max_grad_norm, completion_unit=config.completion_unit,
        lora=LoraSettings(r=config.lora_r or default_lora.r, alpha=config.lora_alpha or default_lora.alpha),
        seed=model_backend.seed if config.seed is None else config.seed,
    )
    started_at = datetime.now(timezone.utc)
    run = adapter_run_id(context.run_id, started_at)
    root = warehouse.path(*ADAPTERS_DIR)
    final = root / run
    staging = root / f".staging-{run}-{uuid.uuid4().hex[:6]}"
    history = {
        "run": run, "dagster_run_id": context.run_id, "started_at": started_at.isoformat(),
        "base_model": model_backend.base_model, "backend": model_backend.backend,
        "n_pairs": int(len(train)), "n_holdout": int(len(pairs_df) - len(train)),
        "dataset_fingerprint": dataset_fingerprint(pairs_df) if len(pairs_df) else "",
        "learning_rate": cfg.learning_rate, "beta": cfg.beta, "epochs": cfg.epochs, "lora_r": cfg.lora.r,
        "completion_unit": cfg.completion_unit,
        "steps": 0, "loss_first": float("nan"), "loss_last": float("nan"), "wall_s": float("nan"),
        "status": "failed", "error": "", "adapter_path": "",
    }
    t0 = time.perf_counter()
    try:
        if train.empty:
            raise ValueError("dpo_dataset has no training pairs: materialise operator_decisions, decision_outcomes and dpo_dataset first")
        pairs = training_pairs(pairs_df)
        backend = model_backend.load()
        # The trainer seeds, then adds the LoRA adapter, so a re-run gives the same adapter.
        stats = backend.train_weighted_dpo(pairs, cfg)
        staging.mkdir(parents=True)
        backend.save(staging)
        info = {
            "run": run, "config": cfg.as_dict(), "base_model": model_backend.base_model,
            "base_model_dir": str(model_backend.base_model_dir()), "dataset_fingerprint": history["dataset_fingerprint"],
            "n_pairs": len(pairs), "steps": stats.steps,
            # How a new proposal's prompt must be rendered to be scored like these pairs.
            "prompt_context_keys": list(prompt_context_keys()), "losses": stats.losses, "wall_s": stats.wall_s,
            # decision_id -> verdict trained on: the sensor counts pairs new since this adapter.
            "trained": dict(zip(train["decision_id"], train["verdict"])),
        }
        (staging / TRAIN_INFO).write_text(json.dumps(info, indent=1, sort_keys=True))
        publish_dir(staging, final)
        atomic_symlink(final, root / "latest")  # only now: a failed run never moves `latest`
        history.update(
            status="succeeded", steps=stats.steps, loss_first=float(stats.losses[0]), loss_last=float(stats.losses[-1]),
            adapter_path=str(final),
        )
    except Exception as err:
        history["error"] = f"{type(err).__name__}: {err}"[:2000]
        raise
    finally:
        history["wall_s"] = round(time.perf_counter() - t0, 3)
        history["finished_at"] = datetime.now(timezone.utc).isoformat()
        warehouse.write(HISTORY_TABLE, pd.DataFrame([history])[column_names(HISTORY_TABLE, history)], partition=run, key="run")
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    acc = stats.extra.get("rewards_accuracy", [])
    yield dg.MaterializeResult(
        metadata={
            "run": run,
            "adapter_path": dg.MetadataValue.path(str(final)),
            "n_pairs": len(pairs),
            "steps": stats.steps,
            "loss_first": round(float(stats.losses[0]), 4),
            "loss_last": round(float(stats.losses[-1]), 4),
            "mean_loss_last_epoch": round(float(pd.Series(stats.losses[-max(1, len(stats.losses) // cfg.epochs):]).mean()), 4),
            **({"rewards_accuracy_last_epoch": round(float(pd.Series(acc[-max(1, len(acc) // cfg.epochs):]).mean()), 4)} if acc else {}),
            "wall_seconds": round(stats.wall_s, 2),
            "learning_rate": cfg.learning_rate, "beta": cfg.beta, "epochs": cfg.epochs, "lora_r": cfg.lora.r,
            "config": dg.MetadataValue.md(_config_table(cfg.as_dict())),
        }
    )
    finite = all(pd.notna(stats.losses)) and all(abs(x) < 1e6 for x in stats.losses)
    yield dg.AssetCheckResult(check_name="loss_is_finite", passed=bool(finite), metadata={"loss_last": float(stats.losses[-1])})
