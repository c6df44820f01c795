"""Tier 3: distillation. Completion-only LoRA SFT of the policy on a teacher's answers and people's
verified corrections (`samples.py`), in a curriculum of phases, gated like a daily update.

A run (`run_distillation`) is given what its step read (`DistillInputs`, `distillation/step.py`): the samples
no run has used yet, the latest verified policy checkpoint (`checkpoints/policy/latest`) as the parent, and
the parent day's rollouts and headlines. It trains the parent phase after phase (answer, then reasoning, then
consistency), each phase its own SFT run on the same weights. The candidate goes through the daily loop's
evaluation gate (`policy/gate.py`: finite loss, KL to the parent at the parent's own rollouts, structure
probe on the latest day's headlines). Accepted: it is published as a new checkpoint
`checkpoints/policy/<parent day>.distill-<run>/` through the same publish path, reloaded from disk and
verified, and only then does `latest` move to it. Rejected: nothing is published. Either way the samples
count as used, and the step writes the run's `distillation_runs` row (`DistillResult.row`), with an A/B of
the candidate against its parent (greedy notes' structure, paired over headlines, `ab_stats`).

What the daily loop does next: the next day's update trains from the distilled checkpoint
(`policy.checkpoints.parent_checkpoint` takes the newest verified distillation of D-1), D's notes off-policy
through the truncated IS weight, since D's own checkpoint sampled them. docs/tiers.md, "Distillation".
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from outcome_flywheel.daily_rl.distillation.samples import PHASES
from outcome_flywheel.daily_rl.evaluation.ab_stats import paired_comparison
from outcome_flywheel.daily_rl.notes.structure import structure_score
from outcome_flywheel.daily_rl.policy.checkpoints import load_policy, mark_verified, publish_checkpoint, read_checkpoint
from outcome_flywheel.daily_rl.policy.gate import GateConfig, GateResult, evaluate_update
from outcome_flywheel.models.interface import TrainStats
from outcome_flywheel.models.prompts import trading_note_messages
from outcome_flywheel.models.train.sft import train_sft
from outcome_flywheel.models.train.sft_config import SFTConfig, SFTExample
from outcome_flywheel.settings import resolve_path

RUNS_TABLE = "distillation_runs"
USED_TABLE = "distill_samples_used"
MIN_SAMPLES_VARIABLE, DEFAULT_MIN_SAMPLES = "FLYWHEEL_DISTILL_MIN_SAMPLES", 100
TEACHER_VARIABLE, DEFAULT_TEACHER = "FLYWHEEL_TEACHER_MODEL", "tiny-local-teacher"
TEACHER_SEED_OFFSET = 1  # the embedded teacher: tiny-local built with seed FLYWHEEL_SEED + 1


class DistillationError(RuntimeError):
    """A distillation run that cannot start (no parent checkpoint, no samples, the teacher is the policy)."""


def min_samples() -> int:
    value = os.environ.get(MIN_SAMPLES_VARIABLE, "") or str(DEFAULT_MIN_SAMPLES)
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{MIN_SAMPLES_VARIABLE}={value!r}: a whole number of samples, at least 1")
    return int(value)


def teacher_name() -> str:
    return os.environ.get(TEACHER_VARIABLE, "") or DEFAULT_TEACHER


def teacher_dir(models, name: str | None = None, build: bool = True, log=print) -> Path:
    """The teacher's model folder. `tiny-local-teacher`: a second tiny-local (seed + 1) built into
    `$FLYWHEEL_DATA_DIR/models/tiny-local-teacher`; a local model name, a folder or a hub id as the
    policy's base model would be. Never the policy's own base model."""
    from outcome_flywheel.models.loader import ModelLoader

    name = name or teacher_name()
    if name == DEFAULT_TEACHER:
        from outcome_flywheel.models.provision.tiny_local import TinyLocalConfig, ensure_tiny_local

        path = resolve_path(models.data_dir) / "models" / DEFAULT_TEACHER
        if build:
            ensure_tiny_local(path, TinyLocalConfig(seed=models.seed + TEACHER_SEED_OFFSET), log=log)
    else:
        path = ModelLoader(
            base_model=name, backend=models.backend, device=models.device, data_dir=models.data_dir
        ).base_model_dir()
    if Path(path).resolve() == Path(models.base_model_dir()).resolve():
        raise DistillationError(
            f"{TEACHER_VARIABLE}={name!r} is the policy's own base model: a teacher must be another model"
        )
    return Path(path)


def fresh_samples(samples: pd.DataFrame, used: pd.DataFrame) -> pd.DataFrame:
    """The samples (`distill_samples`, every day) no distillation run has trained on yet (`used`)."""
    if samples.empty:
        return samples
    samples = samples.drop_duplicates("sample_id", keep="last")
    return samples[~samples["sample_id"].isin(set(used["sample_id"]))].reset_index(drop=True)


@dataclass
class DistillInputs:
    """What a run is given, read by its step (`distillation/step.py`) before it starts."""

    samples: pd.DataFrame  # the unused samples
    checkpoints: Path  # checkpoints/policy: the run publishes its candidate here
    parent_dir: Path  # the latest verified checkpoint
    parent_info: dict
    rollouts: pd.DataFrame  # the parent's day's notes: the gate's KL is taken at them
    headlines: pd.DataFrame  # the parent's day's headlines: the gate's probe and the A/B


@dataclass
class DistillConfig:
    """One distillation run's settings (run config of `distilled_policy`)."""

    sft: SFTConfig = field(
        default_factory=SFTConfig, metadata={"help": "The SFT trainer's settings, shared by every phase."}
    )
    gate: GateConfig = field(default_factory=GateConfig, metadata={"help": "The evaluation gate, as a daily update's."})
    ab_headlines: int = field(
        default=16, metadata={"help": "Headlines of the latest day in the A/B (after the gate's probe)."}
    )
    ab_max_new_tokens: int = field(default=160, metadata={"help": "Token budget of each greedy A/B note."})
    min_samples: int = field(
        default=1,
        metadata={
            "help": "Refuse a run with fewer unused samples (the sensor waits for FLYWHEEL_DISTILL_MIN_SAMPLES)."
        },
    )


@dataclass
class DistillResult:
    run_id: str
    parent_version: str
    checkpoint: str  # folder name under checkpoints/policy ("" when rejected)
    policy_version: str
    gate: GateResult
    phases: list[dict]
    ab: dict
    samples: int
    wall_s: float

    def row(self) -> dict:
        g = self.gate
        return dict(
            run_id=self.run_id,
            parent_version=self.parent_version,
            checkpoint=self.checkpoint,
            policy_version=self.policy_version,
            samples=self.samples,
            phases=json.dumps(self.phases),
            gate=g.verdict,
            gate_reason=g.reason,
            gate_kl_to_parent=g.kl_to_parent,
            gate_probe_structure=g.probe_structure,
            gate_probe_parent_structure=g.probe_parent_structure,
            ab=json.dumps(self.ab),
            wall_s=round(self.wall_s, 3),
        )

    def used_rows(self, samples: pd.DataFrame) -> pd.DataFrame:
        """`distill_samples_used` rows: the run's samples count as used, accepted or not."""
        return pd.DataFrame({"sample_id": samples["sample_id"], "run_id": self.run_id})


def phase_examples(samples: pd.DataFrame, phase: str) -> list[SFTExample]:
    rows = samples[samples["phase"] == phase].sort_values("sample_id")
    return [
        SFTExample(
            prompt=json.loads(r.prompt), completion=r.completion, prefix=r.prefix or "", end_turn=phase != "reasoning"
        )
        for r in rows.itertuples(index=False)
    ]


def latest_parent(root: Path) -> tuple[Path, dict]:
    latest = root / "latest"
    info = read_checkpoint(latest) if latest.exists() else None
    if info is None or not info.get("verified"):
        raise DistillationError(f"no verified policy checkpoint at {latest}: run the daily loop (daily_update) first")
    return latest.resolve(), info


def greedy_structure(policy, prompts: list, max_new_tokens: int) -> list[float]:
    return [structure_score(t) for t in policy.greedy(prompts, max_new_tokens)] if prompts else []


def run_distillation(inputs: DistillInputs, models, run_id: str, config: DistillConfig, log=print) -> DistillResult:
    """Train, gate, publish and verify one distillation run (module docstring)."""
    started = time.perf_counter()
    samples, root, parent_dir, parent_info = inputs.samples, inputs.checkpoints, inputs.parent_dir, inputs.parent_info
    if len(samples) < max(1, config.min_samples):
        raise DistillationError(f"{len(samples)} unused distillation samples, fewer than {max(1, config.min_samples)}")
    parent_day = str(parent_info["date"])
    policy = load_policy(models, parent_dir, parent_info)
    phases, losses, grads = [], [], []
    for n, phase in enumerate(PHASES):
        examples = phase_examples(samples, phase)
        if not examples:
            phases.append({"phase": phase, "examples": 0, "steps": 0})
            continue
        sft = SFTConfig(**{**config.sft.__dict__, "seed": config.sft.seed + n})
        stats = train_sft(policy, examples, sft)
        if stats.extra["lora_settings_ignored"]:  # the adapter it has trains, with its own rank and targets
            log(f"distillation {run_id}: phase {phase}: {stats.extra['lora_adapter']}")
        log(
            f"distillation {run_id}: phase {phase}, {len(examples)} examples, {stats.steps} steps, "
            f"loss {stats.losses[0]:.4f} -> {stats.losses[-1]:.4f}"
        )
        phases.append(
            {
                "phase": phase,
                "examples": len(examples),
                "steps": stats.steps,
                "loss_first": stats.losses[0],
                "loss_last": stats.losses[-1],
                "wall_s": round(stats.wall_s, 3),
                # the memory budget's plan (models/train/memory.py)
                "micro_batches": stats.micro_batches,
                "layers_recomputed": stats.layers_recomputed,
                "lora_adapter": stats.extra["lora_adapter"],  # what trained: a fresh adapter or the one it had
            }
        )
        losses += stats.losses
        grads += stats.grad_norms
    combined = TrainStats(steps=len(losses), losses=losses, grad_norms=grads)
    parent_policy = load_policy(models, parent_dir, parent_info)
    rollouts, headlines = inputs.rollouts, inputs.headlines
    own = rollouts[rollouts["policy_version"] == parent_info["policy_version"]] if len(rollouts) else rollouts
    own = (
        own if len(own) else rollouts
    )  # a distilled parent sampled nothing itself: the day's notes, as near as there are
    try:
        gate = (
            evaluate_update(policy, parent_policy, combined, own, headlines, config.gate)
            if config.gate.enabled
            else GateResult("accepted", "gate disabled (run config gate_enabled=false)")
        )
    except (FloatingPointError, RuntimeError, ValueError) as err:
        gate = GateResult("rejected", f"the candidate failed the probe: {type(err).__name__}: {err}")
    ab = ab_test(policy, parent_policy, headlines, config)
    name, version = "", ""
    if gate.verdict == "accepted":
        name = f"{parent_day}.distill-{run_id}"
        info = {
            "date": parent_day,
            "parent_date": parent_day,
            "parent_version": parent_info["policy_version"],
            "base_model": models.base_model,
            "backend": models.backend,
            "trained": True,
            "tier": "distillation",
            "distillation_run": run_id,
            "examples": int(sum(p["examples"] for p in phases)),
            "gate": gate.verdict,
            "gate_reason": gate.reason,
        }
        info = publish_checkpoint(policy, root, name, info, is_base=False)
        version = info["policy_version"]
        verify_distilled(models, root, name, policy, headlines)
    del policy, parent_policy
    wall_s = time.perf_counter() - started
    return DistillResult(run_id, parent_info["policy_version"], name, version, gate, phases, ab, len(samples), wall_s)


def ab_test(candidate, parent, headlines: pd.DataFrame, config: DistillConfig) -> dict:
    """Distilled vs parent: greedy notes' structure score, paired over headlines after the gate's probe."""
    if headlines.empty:
        return paired_comparison("structure_score", [], []).as_row()
    ordered = headlines.sort_values("headline_id")
    rest = ordered.iloc[config.gate.probe_headlines :]
    chosen = (rest if len(rest) >= 6 else ordered).head(config.ab_headlines)
    prompts = [trading_note_messages(t, s) for t, s in zip(chosen["title"], chosen["summary"])]
    ours = greedy_structure(candidate, prompts, config.ab_max_new_tokens)
    theirs = greedy_structure(parent, prompts, config.ab_max_new_tokens)
    return {
        k: (None if isinstance(v, float) and np.isnan(v) else v)
        for k, v in paired_comparison("structure_score", ours, theirs).as_row().items()
    }


def verify_distilled(models, root: Path, name: str, trained, headlines: pd.DataFrame) -> None:
    """The checkpoint on disk loads, writes text and gives the trained weights' log-probs back; then
    `latest` moves to it (`mark_verified`)."""
    info = read_checkpoint(root / name)
    reloaded = load_policy(models, root / name, info)
    prompt = [trading_note_messages("Apple beats quarterly estimates", "")]
    text = reloaded.greedy(prompt, 12)[0]
    ids = reloaded.encode_response(text or "Buy")
    gap = float(
        np.max(np.abs(reloaded.response_logprobs(prompt, [ids])[0] - trained.response_logprobs(prompt, [ids])[0]))
    )
    if not text.strip() or gap > 1e-3:
        raise DistillationError(
            f"distilled checkpoint {name} failed verification (text {text!r}, log-prob gap {gap:.2e})"
        )
    mark_verified(root, name)
