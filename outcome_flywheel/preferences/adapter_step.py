"""The `preference_adapter` step: outcome-weighted DPO of a LoRA adapter in its own process, reported
through Dagster Pipes.

Extras (from the asset): `warehouse`, `models` (their dataclasses' JSON), `config`
(`WeightedDPOConfig.as_dict()`), `run` (the adapter's run id) and `dataset_fingerprint` (of the
`dpo_dataset` the asset read: the step refuses a dataset that changed since) and `tracking` (`Tracker`, or
absent: no MLflow record). The adapter is saved
to a staging folder, renamed to adapters/preference/<run>/, and only then does `latest` move: a
process killed while training leaves `latest` where it was, and one that lost the trainer lock
meanwhile (frozen past its lease) publishes nothing (`publish_adapter`, `FencedOut`). Reported: a
custom message with the training's figures (the asset's `preference_training_history` row), the
materialization's metadata (with the MLflow run's link: `record_adapter`) and the `loss_is_finite` check.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import uuid
from contextlib import nullcontext

import pandas as pd

from outcome_flywheel.fencing import publishing
from outcome_flywheel.models.loader import ModelLoader
from outcome_flywheel.models.train.dpo import train_weighted_dpo
from outcome_flywheel.models.train.dpo_config import WeightedDPOConfig
from outcome_flywheel.preferences.pool import pool_backup
from outcome_flywheel.preferences.status import ADAPTERS_DIR, TRAIN_INFO, prompt_context_keys
from outcome_flywheel.preferences.style_match import training_pairs
from outcome_flywheel.preferences.weighting import dataset_fingerprint
from outcome_flywheel.steps import Step
from outcome_flywheel.steps.codec import from_payload
from outcome_flywheel.steps.entry import main
from outcome_flywheel.steps.metadata import md, path
from outcome_flywheel.storage import Warehouse, atomic_symlink, publish_dir
from outcome_flywheel.tracking import Tracker, registry
from outcome_flywheel.tracking.records import step_series

# This step, as its asset names it (the step runner launches `python -m outcome_flywheel.preferences.adapter_step`).
STEP = Step("preference_adapter", "outcome_flywheel.preferences.adapter_step", processes="data_parallel")

SUMMARY_KEY = "training"  # custom message {SUMMARY_KEY: {...}}: the figures of the history row


def run(pipes) -> None:
    extras = pipes.extras
    warehouse = from_payload(Warehouse, extras["warehouse"])
    models = from_payload(ModelLoader, extras["models"])
    cfg = from_payload(WeightedDPOConfig, extras["config"])
    run_id = extras["run"]
    pairs_df = warehouse.read("dpo_dataset")
    found = dataset_fingerprint(pairs_df) if len(pairs_df) else ""
    if found != extras["dataset_fingerprint"]:
        raise ValueError(
            f"dpo_dataset changed after the asset read it (fingerprint {found} != {extras['dataset_fingerprint']}): re-run"
        )
    train = pairs_df[pairs_df["split"] == "train"]
    pairs = training_pairs(pairs_df)
    pipes.log.info(
        f"weighted DPO on {len(pairs)} pairs: {models.base_model} on {models.backend}/{models.device}, process {os.getpid()}"
    )
    root = warehouse.path(*ADAPTERS_DIR)
    final = root / run_id
    staging = root / f".staging-{run_id}-{uuid.uuid4().hex[:6]}"
    tracker = from_payload(Tracker, extras["tracking"]) if extras.get("tracking") else None
    try:
        backend = models.load()
        # The trainer seeds, then adds the LoRA adapter, so a re-run gives the same adapter; the pool
        # is backed up first and restored if the training fails (if this process is killed, by the
        # asset once it has ended: `restore_pool`). A training that raises is a FAILED MLflow run.
        with (
            pool_backup(warehouse, "dpo_dataset", run_id, log=pipes.log.warning),
            failures_recorded(tracker, pipes, run_id, cfg, models),
        ):
            stats = train_weighted_dpo(backend, pairs, cfg)
        staging.mkdir(parents=True)
        backend.save(staging)
        info = {
            "run": run_id,
            "config": cfg.as_dict(),
            "base_model": models.base_model,
            "base_model_dir": str(models.base_model_dir()),
            "dataset_fingerprint": found,
            "n_pairs": len(pairs),
            "steps": stats.steps,
            "lora_adapter": stats.extra["lora_adapter"],  # a fresh adapter on the base, with the configured settings
            # How a new proposal's prompt must be rendered to be scored like these pairs.
            "prompt_context_keys": list(prompt_context_keys()),
            "losses": stats.losses,
            "wall_s": stats.wall_s,
            # decision_id -> verdict trained on: the sensor counts pairs new since this adapter.
            "trained": dict(zip(train["decision_id"], train["verdict"])),
        }
        (staging / TRAIN_INFO).write_text(json.dumps(info, indent=1, sort_keys=True))
        publish_adapter(staging, root, run_id)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    losses = [float(x) for x in stats.losses]
    pipes.log.info(
        f"adapter {run_id}: {stats.steps} steps, loss {losses[0]:.4f} -> {losses[-1]:.4f}, {stats.wall_s:.1f} s"
    )
    pipes.report_custom_message(
        {
            SUMMARY_KEY: {
                "steps": stats.steps,
                "loss_first": losses[0],
                "loss_last": losses[-1],
                "adapter_path": str(final),
            }
        }
    )
    on_record = record_adapter(tracker, pipes, run_id, cfg, models, stats, final, len(pairs)) if tracker else {}
    acc = [float(x) for x in stats.extra.get("rewards_accuracy", [])]
    last_epoch = max(1, len(losses) // cfg.epochs)
    pipes.report_asset_materialization(
        metadata={
            "run": run_id,
            "adapter_path": path(final),
            "n_pairs": len(pairs),
            "steps": stats.steps,
            "loss_first": round(losses[0], 4),
            "loss_last": round(losses[-1], 4),
            "mean_loss_last_epoch": round(float(pd.Series(losses[-last_epoch:]).mean()), 4),
            **(
                {
                    "rewards_accuracy_last_epoch": round(
                        float(pd.Series(acc[-max(1, len(acc) // cfg.epochs) :]).mean()), 4
                    )
                }
                if acc
                else {}
            ),
            "wall_seconds": round(stats.wall_s, 2),
            # the memory budget's plan (models/train/memory.py): parts over all steps, layers recomputed
            "micro_batches": stats.micro_batches,
            "layers_recomputed": stats.layers_recomputed,
            "learning_rate": cfg.learning_rate,
            "beta": cfg.beta,
            "epochs": cfg.epochs,
            "lora_r": cfg.lora.r,
            "config": md(config_table(cfg.as_dict())),
            **{k: {"raw_value": v, "type": "url"} if k == "mlflow_run_url" else v for k, v in on_record.items()},
        }
    )
    finite = all(math.isfinite(x) and abs(x) < 1e6 for x in losses)
    pipes.report_asset_check(check_name="loss_is_finite", passed=finite, metadata={"loss_last": losses[-1]})


def adapter_tags(pipes, run_id: str, models) -> dict:
    return {
        "partition": pipes.partition_key if pipes.is_partition_step else "",
        "dagster_run_id": pipes.run_id,
        "asset_key": "preference_adapter",
        "adapter_run": run_id,
        "base_model": models.base_model,
    }


def failures_recorded(tracker: Tracker | None, pipes, run_id: str, cfg, models):
    """Around the training: an exception is recorded as a FAILED run (its error as tags), then propagates."""
    if tracker is None:
        return nullcontext()
    params = {"dpo": cfg.as_dict(), "models": {"base_model": models.base_model, "backend": models.backend}}
    tags = adapter_tags(pipes, run_id, models)
    return tracker.failures("preferences", f"preference_adapter {run_id}", tags, pipes.log.warning, params)


def record_adapter(tracker: Tracker, pipes, run_id: str, cfg, models, stats, final, n_pairs: int) -> dict:
    """The training's MLflow run (experiment `outcome-flywheel/preferences`: the DPO config, per-step loss,
    grad norm and the trainer's per-step figures) and the adapter as a version of `preference-adapter`
    (by reference to its folder; `champion` = `latest` = this adapter, `challenger` too). Never raises."""
    tags = adapter_tags(pipes, run_id, models)
    run = tracker.start("preferences", f"preference_adapter {run_id}", tags, pipes.log.warning)
    with run:
        try:
            run.params({"dpo": cfg.as_dict(), "models": {"base_model": models.base_model, "backend": models.backend}})
            run.series(step_series(stats))
            run.metrics({"steps": stats.steps, "n_pairs": n_pairs, "wall_s": stats.wall_s})
            version = registry.Version(run_id, registry.source_uri(final), {"role": "adapter", "run": run_id})
            versions = registry.mirror(run, registry.ADAPTER_MODEL, [version], version, run_id)
        except Exception as err:  # noqa: BLE001 - the adapter is published: the record must not fail it
            run.fail(f"record the adapter: {type(err).__name__}: {err}")
            versions = {}
    return {**run.links(), **versions}


def publish_adapter(staging, root, run_id: str):
    """Rename the finished adapter into `root/<run>` and only then move `latest` (a failed run never
    moves it), both under the trainer lock's fence (`fencing.publishing`); returns the folder."""
    final = root / run_id
    with publishing(f"preference adapter {run_id}"):
        publish_dir(staging, final)
        atomic_symlink(final, root / "latest")
    return final


def config_table(config: dict, prefix: str = "") -> str:
    """The trainer's settings as a two-column markdown table (nested settings as `lora.r`...)."""
    rows = []
    for key, value in config.items():
        if isinstance(value, dict):
            rows += [line for line in config_table(value, f"{prefix}{key}.").splitlines()[2:]]
        else:
            rows.append(
                f"| {prefix}{key} | {', '.join(map(str, value)) if isinstance(value, (list, tuple)) else value} |"
            )
    return "| setting | value |\n| --- | --- |\n" + "\n".join(rows)


if __name__ == "__main__":
    main(STEP, run)
