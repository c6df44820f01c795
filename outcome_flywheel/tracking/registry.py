"""A registered model that mirrors the gate: one model version per checkpoint, registered by reference.

Each version's `source` is the checkpoint's folder (a `file://` URI) or its object-store URI: MLflow keeps
the reference, the weights are not copied (under a tracking server, which refuses local paths, a small JSON
artifact naming the folder: `served_source`; the `checkpoint_uri` tag holds the folder either way). The tag `checkpoint` names the checkpoint a version stands for
(a dated folder, a distillation's folder, an adapter run); a candidate the gate rejected keeps a version of
its own, tagged `role=candidate`, `verdict=rejected` and the `reason`. Aliases: `champion` is the version of
the checkpoint `latest` points to, `challenger` the day's candidate (accepted or not). All calls go through
the run's guard (`TrackedRun.call`): a failure ends the record, never the training.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from outcome_flywheel.tracking.tracker import TrackedRun

POLICY_MODEL = "daily-policy"
ADAPTER_MODEL = "preference-adapter"
CHAMPION, CHALLENGER = "champion", "challenger"


@dataclass(frozen=True)
class Version:
    """A model version to have: `checkpoint` (its identity tag), `source` (folder or URI), tags."""

    checkpoint: str
    source: str
    tags: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""


def source_uri(location: str | Path) -> str:
    """A folder as a `file://` URI; a URI (s3://, gs://, ...) as it is."""
    text = str(location)
    return text if "://" in text else Path(text).resolve().as_uri()


def _find(run: TrackedRun, model: str, checkpoint: str):
    found = run.client.search_model_versions(f"name='{model}' and tags.checkpoint='{checkpoint}'")
    return max(found, key=lambda v: int(v.version)) if found else None


def _ensure_model(run: TrackedRun, model: str, description: str) -> None:
    from mlflow.exceptions import MlflowException

    try:
        run.client.get_registered_model(model)
    except MlflowException:
        try:
            run.client.create_registered_model(model, description=description or None)
        except MlflowException:  # made meanwhile by another process
            run.client.get_registered_model(model)


def register(run: TrackedRun, model: str, version: Version, model_description: str = "") -> str | None:
    """The version number of `model` standing for `version.checkpoint` (made now, with this run as its
    run, if there is none; its tags brought up to date if there is). None when not recorded."""

    def _register() -> str:
        _ensure_model(run, model, model_description)
        tags = {
            "checkpoint": version.checkpoint,
            "checkpoint_uri": version.source,
            **{k: str(v) for k, v in version.tags.items() if v is not None},
        }
        existing = _find(run, model, version.checkpoint)
        if existing is not None and existing.tags.get("checkpoint_uri", existing.source) == version.source:
            for key, value in tags.items():
                if existing.tags.get(key) != value:
                    run.client.set_model_version_tag(model, existing.version, key, value)
            return str(existing.version)
        made = run.client.create_model_version(
            model,
            source=served_source(run, version),
            run_id=run.run_id,
            tags=tags,
            description=version.description or None,
        )
        return str(made.version)

    return run.call(f"register {model} {version.checkpoint}", _register) if run.recording else None


def served_source(run: TrackedRun, version: Version) -> str:
    """`version.source`, except a local folder under a tracking server: the server refuses a local path outside
    the run's artifacts, so the run gets a small `registry/<checkpoint>.json` naming the folder (the weights
    stay where they are) and the version's source is that artifact's folder (`runs:/<run>/registry`); the
    folder itself is in the `checkpoint_uri` tag either way."""
    remote = run.tracker.store_uri().startswith(("http://", "https://"))
    if not (remote and version.source.startswith("file:")):
        return version.source
    import tempfile

    name = version.checkpoint.replace("/", "_")
    with tempfile.TemporaryDirectory() as folder:
        note = Path(folder) / f"{name}.json"
        note.write_text(
            json.dumps({"checkpoint": version.checkpoint, "uri": version.source, **version.tags}, default=str)
        )
        run.client.log_artifact(run.run_id, str(note), "registry")
    return f"runs:/{run.run_id}/registry/{name}.json"


def set_alias(run: TrackedRun, model: str, alias: str, number: str | None) -> None:
    if run.recording and number is not None:
        run.call(f"alias {model}@{alias}", lambda: run.client.set_registered_model_alias(model, alias, number))


def aliases(run: TrackedRun, model: str) -> dict[str, str]:
    """alias -> version number of `model` (empty when unknown)."""
    found = (
        run.call(f"read {model}'s aliases", lambda: run.client.get_registered_model(model)) if run.recording else None
    )
    return {alias: str(number) for alias, number in (getattr(found, "aliases", None) or {}).items()}


def mirror(
    run: TrackedRun,
    model: str,
    versions: list[Version],
    champion: Version | None,
    challenger: str | None,
    model_description: str = "",
) -> dict[str, str]:
    """Register `versions` (and `champion`, what `latest` points to, if it is not among them), point
    `champion` at the latter and `challenger` at the version whose checkpoint is `challenger`.
    Returns what the asset's metadata shows: the model and each alias's version."""
    numbers = {v.checkpoint: register(run, model, v, model_description) for v in versions}
    if champion is not None and champion.checkpoint not in numbers:
        numbers[champion.checkpoint] = register(run, model, champion, model_description)
    if champion is not None:
        set_alias(run, model, CHAMPION, numbers.get(champion.checkpoint))
    if challenger is not None:
        set_alias(run, model, CHALLENGER, numbers.get(challenger))
    out = {"mlflow_registered_model": model}
    if champion is not None and numbers.get(champion.checkpoint):
        out["mlflow_champion_version"] = str(numbers[champion.checkpoint])
    if challenger is not None and numbers.get(challenger):
        out["mlflow_challenger_version"] = str(numbers[challenger])
    return out if run.recording else {}
