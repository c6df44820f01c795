"""Which adapter a training trains, in words, for every trainer (GSPO, SFT, DPO): a policy that already
holds a LoRA adapter (a checkpoint's, carried from the parent) trains that one, with its own rank and
targets, so the configured LoRA settings apply to a fresh adapter only. The record says so instead of
letting a run config's settings look applied."""

from __future__ import annotations

from dataclasses import replace

from outcome_flywheel.models.interface import LoraSettings, ModelBackend


def lora_adapter(
    backend: ModelBackend, requested: LoraSettings | None, held: str = "LoRA carried from the parent"
) -> tuple[str, bool]:
    """What the update trains, in words (`policy_training.lora_adapter`), and whether the configured LoRA
    settings were set aside; `held` names an adapter the policy already has. Call it before the trainer adds
    a fresh adapter."""

    def spell(s: LoraSettings) -> str:
        return f"r {s.r}, alpha {s.alpha:g}, dropout {s.dropout:g}, {' '.join(sorted(s.target_modules))}"

    def in_order(s: LoraSettings) -> LoraSettings:  # LoraSettings' own equality, the targets as a set
        return replace(s, target_modules=sorted(s.target_modules))

    if not backend.has_adapter:
        return ("fresh LoRA: " + spell(requested), False) if requested else ("every weight (no LoRA)", False)
    carried = backend.adapter_settings()
    text = held + (": " + spell(carried) if carried else "")
    if requested is None:  # full fine-tuning was asked for, but the parent's adapter is what trains
        return text + "; full fine-tuning applies to a policy without an adapter only", True
    differs = carried is not None and in_order(requested) != in_order(carried)
    if differs:
        text += f"; the configured {spell(requested)} applies to a fresh adapter only"
    return text, differs
