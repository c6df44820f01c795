"""Real tiny-local policy checkpoints for the serving and export tests, published the way the daily
loop publishes them (`publish_checkpoint`, `republish_parent`, `mark_verified`): each a LoRA adapter
with its own seeded weights."""

from __future__ import annotations

import os
from pathlib import Path

from outcome_flywheel.daily_rl.policy.checkpoints import (
    mark_verified,
    publish_checkpoint,
    read_checkpoint,
    republish_parent,
)
from outcome_flywheel.models.interface import LoraSettings
from outcome_flywheel.models.loader import ModelLoader
from tests.mlx_fixtures import perturb_torch_lora


def tiny_root(parent: Path, tiny_model_dir: Path) -> Path:
    root = parent / "data"
    (root / "models").mkdir(parents=True)
    os.symlink(tiny_model_dir, root / "models" / "tiny-local")
    return root


def loader(root: Path, base_model: str = "tiny-local") -> ModelLoader:
    return ModelLoader(data_dir=str(root), base_model=base_model, backend="torch", device="cpu")


class PolicyPublisher:
    """Publishes policy checkpoints under `root/checkpoints/policy`: one base model with a LoRA
    adapter, its weights moved by a seeded perturbation before each checkpoint."""

    def __init__(self, root: Path, base_model: str = "tiny-local"):
        self.root = root
        self.base_model = base_model
        self.ckpt_root = root / "checkpoints" / "policy"
        self.backend = loader(root, base_model).load()
        self.backend.add_lora(LoraSettings())
        self.last: tuple[Path, dict] | None = None

    def publish(self, day: str, seed: int, verify: bool = True) -> dict:
        """A trained, accepted day (verified unless told not: `latest` moves only when verified)."""
        perturb_torch_lora(self.backend, seed=seed)
        parent = self.last[1]["policy_version"] if self.last else None
        info = publish_checkpoint(
            self.backend,
            self.ckpt_root,
            day,
            {"date": day, "parent_version": parent, "gate": "accepted", "base_model": self.base_model, "trained": True},
            is_base=False,
        )
        return self.verify(day) if verify else info

    def verify(self, day: str) -> dict:
        """The day's checks passed: `latest` moves to it."""
        info = mark_verified(self.ckpt_root, day)
        self.last = (self.ckpt_root / day, info)
        return info

    def reject(self, day: str) -> dict:
        """A day the gate rejected: the parent's files republished with its version, then verified."""
        parent_dir, parent_info = self.last
        republish_parent(
            self.ckpt_root,
            day,
            parent_dir,
            parent_info,
            {"date": day, "parent_version": parent_info["policy_version"], "gate": "rejected", "trained": True},
        )
        return mark_verified(self.ckpt_root, day)

    def info(self, day: str) -> dict:
        return read_checkpoint(self.ckpt_root / day)
