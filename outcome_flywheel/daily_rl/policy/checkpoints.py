"""The policy's dated checkpoints: where they live, how a day finds its parent, publishing and verifying.

Checkpoint folder `$FLYWHEEL_DATA_DIR/checkpoints/policy/D/` holds `checkpoint.json` and:
- kind "base": nothing else; the policy of that day is the frozen base model (the first
  partition, and any day before the first training step);
- kind "lora": a PEFT adapter (`adapter_config.json`, `adapter_model.safetensors`);
- kind "full": a full Hugging Face model folder (full fine-tune, `lora=None`).
`policy_version` = "D@<sha256 of the weight files, 12 hex>" ("D@base" for the base), stamped on
every rollout the checkpoint generates. `latest` is a symlink to the newest dated folder.
Publishing (a dated folder, `latest`) runs inside `fencing.publishing`: a training that lost the
trainer lock meanwhile (frozen past its lease) publishes nothing (`FencedOut`)."""

from __future__ import annotations

import hashlib
import json
import shutil
import uuid
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING

from outcome_flywheel.fencing import publishing
from outcome_flywheel.storage import atomic_symlink, atomic_write_bytes, publish_dir

if TYPE_CHECKING:
    from outcome_flywheel.models.interface import ModelBackend


CHECKPOINT_FILE = "checkpoint.json"


# -- checkpoints -----------------------------------------------------------------------------
def read_checkpoint(folder: Path) -> dict | None:
    path = Path(folder) / CHECKPOINT_FILE
    return json.loads(path.read_text()) if path.exists() else None


class UnverifiedCheckpoint(RuntimeError):
    """The parent checkpoint failed its blocking checks: nothing may train from it."""


def parent_checkpoint(root: Path, day: str, pinned: str | None = None) -> tuple[Path, dict] | None:
    """The checkpoint day D trains from: the newest dated before D (normally D-1), or the newest
    distillation of it that passed its gate (`<D-1>.distill-<run>`, tier 3: what `latest` serves
    since); None = start from the base. `pinned`: the parent a first run of D chose (D's own
    checkpoint.json), kept while it is still one of these, so a re-run of D reproduces it even after
    a later distillation of D-1.

    A checkpoint whose day failed its blocking checks (`verified: false`) is refused, not skipped:
    its rollouts are the ones `day` scores, so that day has to be fixed and re-run first.
    """
    if not root.is_dir():
        return None
    dated = sorted(p.name for p in root.iterdir() if p.is_dir() and _is_date(p.name) and p.name < day)
    for name in reversed(dated):
        info = read_checkpoint(root / name)
        if info is not None:
            if info.get("verified") is False:
                raise UnverifiedCheckpoint(
                    f"checkpoint {name} failed its blocking checks (checkpoint.json verified=false): re-run {name} first"
                )
            chain = distilled_chain(root, name, info)
            names = [name] + [n for n, _ in chain]
            if pinned in names:
                return root / pinned, ([info] + [i for _, i in chain])[names.index(pinned)]
            return (root / chain[-1][0], chain[-1][1]) if chain else (root / name, info)
    return None


def distilled_chain(root: Path, name: str, info: dict) -> list[tuple[str, dict]]:
    """The verified distillations descending from checkpoint `name` (`<name>.distill-<run>`, each
    from the one before: a distillation trains `latest`), oldest first. Of two distillations of
    the same parent, the later published continues the chain. A distillation of an earlier
    version of `name` (the day re-run since) is not its descendant."""
    children: dict[str, list[tuple[float, str, dict]]] = {}
    for folder in root.glob(f"{name}.distill-*"):
        child = read_checkpoint(folder)
        if child is not None and child.get("verified") is True and child.get("parent_version"):
            when = (folder / CHECKPOINT_FILE).stat().st_mtime
            children.setdefault(child["parent_version"], []).append((when, folder.name, child))
    chain, version = [], info.get("policy_version")
    while version in children:
        _, child_name, child = max(children.pop(version), key=lambda c: (c[0], c[1]))
        chain.append((child_name, child))
        version = child["policy_version"]
    return chain


def behaviour_versions(root: Path, parent: tuple[Path, dict] | None) -> list[str]:
    """The policy versions whose rollouts a day may train from `parent`: its own and, for a distilled
    parent, those of the dated checkpoint and distillations it descends from (their notes are
    off-policy for it: pi_old = the parent, recomputed, with the truncated IS weight), oldest first."""
    if parent is None:
        return []
    folder, info = parent
    dated = folder.name.split(".distill-")[0]
    if dated == folder.name:
        return [info["policy_version"]]
    dated_info = read_checkpoint(root / dated) or {}
    versions = [dated_info.get("policy_version")] + [
        i["policy_version"] for _, i in distilled_chain(root, dated, dated_info)
    ]
    versions = (
        versions[: versions.index(info["policy_version"]) + 1]
        if info["policy_version"] in versions
        else [info["policy_version"]]
    )
    return [v for v in versions if v]  # oldest first, the parent last: a note's staleness is its distance to the end


def _is_date(name: str) -> bool:
    try:
        date.fromisoformat(name)
        return True
    except ValueError:
        return False


def weights_digest(folder: Path) -> str:
    digest = hashlib.sha256()
    for file in sorted(Path(folder).glob("*.safetensors")):
        digest.update(file.name.encode())
        digest.update(file.read_bytes())
    return digest.hexdigest()


def load_policy(model_backend, folder: Path | None, info: dict | None, dtype: str | None = None) -> "ModelBackend":
    """A checkpoint as a trainable policy (`models` is a `ModelLoader`); `dtype`: its compute
    precision (None: the loader's FLYWHEEL_DTYPE)."""
    if info is None or info["kind"] == "base":
        return model_backend.load(dtype=dtype)
    if info["kind"] == "lora":
        return model_backend.load(adapter_path=folder, dtype=dtype)
    if info["kind"] == "full":  # trained with fp32 master weights: keep them (see use_master_weights)
        return model_backend.load(model_path=folder, master_weights=True, dtype=dtype)
    raise ValueError(f"unknown checkpoint kind {info['kind']!r} in {folder}")


@dataclass
class StagedCheckpoint:
    """A day's checkpoint written to its staging folder, not yet published: `policy_version` is known
    (the rollouts are stamped with it) while nothing under the dated folders has changed."""

    day: str
    folder: Path
    info: dict


def stage_checkpoint(policy: "ModelBackend", root: Path, day: str, info: dict, is_base: bool) -> StagedCheckpoint:
    """The day's policy saved into a staging folder beside `root/D/`, its version from the saved weights."""
    staging = root / f".{day}.{uuid.uuid4().hex}.staging"
    staging.mkdir(parents=True)
    if is_base:
        info = {**info, "kind": "base", "policy_version": f"{day}@base"}
    else:
        policy.save(staging)
        policy.weights_saved_as(staging)  # a vLLM sampler serves these files (the dated folder once published)
        info = {
            **info,
            "kind": "lora" if policy.has_adapter else "full",
            "policy_version": f"{day}@{weights_digest(staging)[:12]}",
        }
    info = {**info, "verified": False}
    atomic_write_bytes(staging / CHECKPOINT_FILE, json.dumps(info, indent=1, sort_keys=True).encode())
    return StagedCheckpoint(day, staging, info)


def stage_parent(root: Path, day: str, parent_dir: Path, parent_info: dict, info: dict) -> StagedCheckpoint:
    """Checkpoint D = the parent's weights, unchanged, with the parent's `policy_version` (the gate
    rejected D's update): the parent's files are copied, not re-saved, so nothing can drift."""
    staging = root / f".{day}.{uuid.uuid4().hex}.staging"
    staging.mkdir(parents=True)
    for item in Path(parent_dir).iterdir():
        if item.name == CHECKPOINT_FILE:
            continue
        (shutil.copytree if item.is_dir() else shutil.copy2)(item, staging / item.name)
    info = {**info, "kind": parent_info["kind"], "policy_version": parent_info["policy_version"], "verified": False}
    atomic_write_bytes(staging / CHECKPOINT_FILE, json.dumps(info, indent=1, sort_keys=True).encode())
    return StagedCheckpoint(day, staging, info)


def publish_staged(root: Path, staged: StagedCheckpoint) -> dict:
    """The staged folder becomes `root/D/` in one rename, not yet verified: `mark_verified` moves
    `latest` once the day's blocking checks pass."""
    _publish(staged.folder, root / staged.day, f"policy checkpoint {staged.day}")
    return staged.info


def publish_checkpoint(policy: "ModelBackend", root: Path, day: str, info: dict, is_base: bool) -> dict:
    """Stage and publish the day's policy at once (distillation, tests)."""
    info = publish_staged(root, stage_checkpoint(policy, root, day, info, is_base))
    if not is_base:
        policy.weights_saved_as(root / day)
    return info


def _publish(staging: Path, final: Path, what: str) -> None:
    """`publish_dir` under the trainer lock's fence; a fenced-out training's staging folder is removed."""
    try:
        with publishing(what):
            publish_dir(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def republish_parent(root: Path, day: str, parent_dir: Path, parent_info: dict, info: dict) -> dict:
    """Stage and publish the parent's weights as D's at once (tests)."""
    return publish_staged(root, stage_parent(root, day, parent_dir, parent_info, info))


def mark_verified(root: Path, day: str) -> dict:
    """The day's checks passed: record it in `checkpoint.json` and move `latest` to it."""
    final = root / day
    with publishing(f"policy checkpoint {day} (verified, `latest`)"):
        info = {**(read_checkpoint(final) or {}), "verified": True}
        atomic_write_bytes(final / CHECKPOINT_FILE, json.dumps(info, indent=1, sort_keys=True).encode())
        latest = root / "latest"
        current = latest.resolve().name if latest.is_symlink() else ""
        if not _is_date(current) or current <= day:  # a backfill of an older day leaves `latest` alone
            atomic_symlink(final, latest)
    return info


class CheckpointStore:
    """The dated checkpoints under one root: the daily recipe's one handle on them (read at the
    start of a day, staged in the middle, published and verified at the end)."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def info(self, day: str) -> dict | None:
        return read_checkpoint(self.root / day)

    def parent(self, day: str) -> tuple[Path, dict] | None:
        """`parent_checkpoint`, a re-run keeping the parent its first run chose (a distillation may have come since)."""
        return parent_checkpoint(self.root, day, pinned=(self.info(day) or {}).get("parent_checkpoint"))

    def lineage(self, parent: tuple[Path, dict] | None) -> list[str]:
        return behaviour_versions(self.root, parent)

    def version_of(self, day: str) -> str | None:
        return (self.info(day) or {}).get("policy_version")

    def rejected(self, day: str) -> bool:
        return (self.info(day) or {}).get("gate") == "rejected"

    def load(self, models, folder: Path | None, info: dict | None, dtype: str | None = None) -> "ModelBackend":
        return load_policy(models, folder, info, dtype)

    def stage(self, policy: "ModelBackend", day: str, info: dict, is_base: bool) -> StagedCheckpoint:
        return stage_checkpoint(policy, self.root, day, info, is_base)

    def stage_parent(self, day: str, parent: tuple[Path, dict], info: dict) -> StagedCheckpoint:
        return stage_parent(self.root, day, parent[0], parent[1], info)

    def publish(self, staged: StagedCheckpoint) -> dict:
        return publish_staged(self.root, staged)

    def mark_verified(self, day: str) -> dict:
        return mark_verified(self.root, day)
