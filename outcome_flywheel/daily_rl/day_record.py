"""One day of the daily loop on the record (MLflow, `outcome_flywheel.tracking`), and the registry's mirror.

A day's run in experiment `outcome-flywheel/daily_rl`: params = the day's settings, the GSPO config it
trained with (seed and temperature as used), the models and the judge; metrics = each optimiser step's loss,
grad norm, clip fraction, KL and the trainer's other per-step figures (step 1, 2, ...), and the day's figures
(`day/*`: the `policy_training` row, the gate's among them; `price/*`: the delayed price step; `reward/*`: the
mean reward of each signal over the usable notes); tags = partition, Dagster run id, asset key, policy
version, parent, gate verdict; artifact = the checkpoint's `checkpoint.json`.

The registered model `daily-policy` mirrors the gate (`tracking/registry.py`): each verified checkpoint of a
day is a version (source: its folder), a rejected candidate a version of its own (`<D>/candidate`, the
verdict and reason as tags, its weights not kept: checkpoint D republishes the parent's); `champion` =
the checkpoint `latest` points to, `challenger` = the day's candidate. Distillations register the same way
(`record_distilled`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np

from outcome_flywheel.daily_rl.policy.checkpoints import CHECKPOINT_FILE, read_checkpoint
from outcome_flywheel.tracking import registry
from outcome_flywheel.tracking.records import step_series
from outcome_flywheel.tracking.registry import POLICY_MODEL, Version
from outcome_flywheel.tracking.tracker import TrackedRun, Tracker

if TYPE_CHECKING:
    from outcome_flywheel.daily_rl.day import DailyUpdateResult

LOOP = "daily_rl"
MODEL_DESCRIPTION = (
    "The daily loop's policy checkpoints, registered by reference to their folders (weights not copied). "
    "champion = what checkpoints/policy/latest points to; challenger = the last day's candidate."
)
# reward signal -> its rollout_scores column (the price signal's figures are the price step's)
SIGNAL_COLUMNS = {
    "structure": "structure_score",
    "judge_rank": "outcome_reward",
    "human": "human_signal",
    "relevance": "relevance_signal",
}


def signal_means(scores) -> dict[str, float]:
    usable = scores[scores["usable"]] if len(scores) else scores
    out = {}
    for signal, column in SIGNAL_COLUMNS.items():
        if column in usable and len(usable):
            values = usable[column].astype(float)
            if values.notna().any():
                out[f"reward/{signal}"] = float(np.nanmean(values))
    if len(usable):
        out["reward/total"] = float(usable["reward"].mean())
    return out


def _numbers(row: Mapping[str, Any], prefix: str) -> dict[str, float]:
    return {
        f"{prefix}/{k}": float(v)
        for k, v in row.items()
        if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
    }


def checkpoint_version(root: Path, name: str, role: str, extra: Mapping[str, Any] | None = None) -> Version | None:
    """The version standing for checkpoint folder `root/name`, if it is verified."""
    info = read_checkpoint(root / name) or {}
    if not info.get("verified"):
        return None
    tags = {
        "role": role,
        "policy_version": info.get("policy_version"),
        "kind": info.get("kind"),
        "day": info.get("date"),
        "parent_version": info.get("parent_version"),
        "base_model": info.get("base_model"),
        "gate": info.get("gate"),
        **(extra or {}),
    }
    return Version(name, registry.source_uri(root / name), tags, f"checkpoint {name} ({info.get('policy_version')})")


def latest_version(root: Path) -> Version | None:
    latest = root / "latest"
    return checkpoint_version(root, latest.resolve().name, "checkpoint") if latest.is_symlink() else None


def mirror_policy(run: TrackedRun, root: Path, name: str, verdict: str, reason: str) -> dict[str, str]:
    """Register checkpoint `name` (and a rejected candidate), move `champion` to `latest`'s and `challenger`
    to the candidate; what the asset's metadata shows."""
    versions, challenger = [], None
    own = checkpoint_version(root, name, "checkpoint", {"verdict": verdict, "reason": reason})
    if own is not None:
        versions.append(own)
        if verdict == "accepted":
            challenger = name
        elif verdict == "rejected":
            info = read_checkpoint(root / name) or {}
            candidate = Version(
                f"{name}/candidate",
                own.source,
                {
                    "role": "candidate",
                    "verdict": verdict,
                    "reason": reason,
                    "day": info.get("date"),
                    "parent_version": info.get("parent_version"),
                    "weights": f"not kept: the gate rejected them; {name} republishes the parent "
                    f"({info.get('policy_version')})",
                },
                f"candidate of {name}, rejected by the gate: {reason}",
            )
            versions.append(candidate)
            challenger = candidate.checkpoint
    return registry.mirror(run, POLICY_MODEL, versions, latest_version(root), challenger, MODEL_DESCRIPTION)


def day_tags(day: str, dagster_run_id: str) -> dict[str, str]:
    """The tags every run of a day carries, recorded or failed: where it came from in Dagster."""
    return {
        "partition": day,
        "dagster_run_id": dagster_run_id,
        "asset_key": "policy_checkpoint",
        "dagster_asset": "daily_update",
    }


def record_day(
    tracker: Tracker,
    result: "DailyUpdateResult",
    settings: Any,
    models: Any,
    judge: Any,
    dagster_run_id: str,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The day's MLflow run and the registry's mirror; returns the links and versions for the metadata
    (or why the record failed). Never raises."""
    info = result.checkpoint
    tags = {
        **day_tags(result.day, dagster_run_id),
        "policy_version": info.get("policy_version"),
        "parent": info.get("parent_version") or "",
        "parent_checkpoint": info.get("parent_checkpoint") or "",
        "gate": result.gate.verdict,
        "kind": info.get("kind"),
    }
    run = tracker.start(LOOP, f"daily_update {result.day}", tags, log)
    on_record: dict[str, Any] = {}
    try:
        run.params(
            {
                "settings": dataclasses.asdict(settings),
                "gspo": dataclasses.asdict(result.gspo),
                "models": {k: getattr(models, k, None) for k in ("base_model", "backend", "device", "dtype", "seed")},
                "judge": judge.describe(models),
                "trained": result.trained,
            }
        )
        run.series(step_series(result.train_stats))
        run.metrics(
            {
                **_numbers(result.training_row, "day"),
                **_numbers(result.price_row, "price"),
                **signal_means(result.scores),
            }
        )
        folder = Path(result.checkpoint_dir)
        run.artifacts([folder / CHECKPOINT_FILE], "checkpoint")
        on_record = mirror_policy(run, folder.parent, folder.name, result.gate.verdict, result.gate.reason)
    except Exception as err:  # noqa: BLE001 - a figure the record cannot take must not fail the day
        run.fail(f"record the day: {type(err).__name__}: {err}")
    finally:
        run.finish()
    return {**run.links(), **on_record}


def record_distilled(
    tracker: Tracker,
    result: Any,
    config: Any,
    root: Path,
    dagster_run_id: str,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """A distillation run (tier 3) in the same experiment: the config, each phase's figures (`phase/<name>/*`),
    the gate's and the A/B's (with its interval); its checkpoint, when the gate accepted it, a version of
    `daily-policy` (champion when `latest` moved to it). Never raises."""
    tags = {
        "partition": "",
        "dagster_run_id": dagster_run_id,
        "asset_key": "distilled_policy",
        "policy_version": result.policy_version or "",
        "parent": result.parent_version,
        "gate": result.gate.verdict,
        "distillation_run": result.run_id,
    }
    run = tracker.start(LOOP, f"distilled_policy {result.run_id}", tags, log)
    on_record: dict[str, Any] = {}
    try:
        run.params({"distill": dataclasses.asdict(config)})
        phases = {
            f"phase/{p['phase']}/{k}": v for p in result.phases for k, v in p.items() if k not in ("phase", "examples")
        }
        phases.update({f"phase/{p['phase']}/examples": p.get("examples") for p in result.phases})
        gate = {k: v for k, v in result.row().items() if k.startswith("gate_")}
        ab = {f"ab/{k}": v for k, v in (result.ab or {}).items()}
        run.metrics({**phases, **gate, **ab, "samples": result.samples, "wall_s": result.wall_s})
        if result.checkpoint:  # `root`: the policy checkpoints' folder
            on_record = mirror_policy(run, root, result.checkpoint, result.gate.verdict, result.gate.reason)
    except Exception as err:  # noqa: BLE001 - the record must not fail the distillation
        run.fail(f"record the distillation: {type(err).__name__}: {err}")
    finally:
        run.finish()
    return {**run.links(), **on_record}
