"""The evaluation gate of the daily loop: day D's update is published only if it is sane.

After GSPO trains the parent (checkpoint D-1) into a candidate, three checks decide whether the
candidate becomes checkpoint D or the parent's weights stay:
1. finite loss   every step's loss is a finite number (a blown-up update gives NaN / inf);
2. KL budget     the exact per-token KL(candidate || parent) over the vocabulary, at the positions
                 of the parent's own rollouts it was trained on (the distribution GSPO moved), at
                 their sampling temperature, is at most `max_kl_to_parent` nats;
3. bound         with `max_kl_to_base` set: the per-token KL(candidate || base) at the same positions
                 is at most that budget, or not above the parent's own (an update back toward the base
                 is never refused). A trust region around the base: once the policy has moved that far,
                 days that would move it further keep the parent, so what it learned is held;
4. probe         greedy notes of the candidate and of the parent on a probe of D's headlines: the
                 candidate's mean structure score may fall at most `max_probe_regression` below the
                 parent's (structure is the one signal that needs no judge and no tomorrow).
A rejected update leaves the parent's weights as D's checkpoint, with the parent's
`policy_version`, and D's rollouts come from them; `policy_training` records the verdict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from outcome_flywheel.daily_rl.notes.structure import structure_score
from outcome_flywheel.daily_rl.policy.checkpoints import load_policy
from outcome_flywheel.daily_rl.policy.rollouts import mean_token_kls
from outcome_flywheel.models.prompts import trading_note_messages

if TYPE_CHECKING:
    from outcome_flywheel.models.interface import ModelBackend, TrainStats

GATE_VERDICTS = ("accepted", "rejected", "not_trained")


@dataclass
class GateConfig:
    """Thresholds of the evaluation gate (run config of `daily_update`)."""

    enabled: bool = field(
        default=True, metadata={"help": "Gate each update; off = every trained update is accepted (recorded as such)."}
    )
    max_kl_to_parent: float = field(
        default=0.25,
        metadata={
            "help": (
                "Budget for the exact per-token KL(candidate || parent) in nats, at the training rollouts' positions and "
                "sampling temperature. A healthy GSPO day on tiny-local moves ~0.001-0.05."
            )
        },
    )
    max_probe_regression: float = field(
        default=0.15,
        metadata={
            "help": (
                "How far the candidate's mean structure score on the probe's greedy notes may fall below the parent's."
            )
        },
    )
    max_kl_to_base: float | None = field(
        default=0.2,
        metadata={
            "help": (
                "Trust region around the base: a candidate whose exact per-token KL(candidate || base) on the trained rollouts is over "
                "this budget, and above the parent's, is rejected (the parent stays). None = no bound. 0.2: in a 56-day `news` world "
                "on tiny-local the policy reached ~0.2 nats by ~250 groups, with the sides learned, and degraded past it without "
                'the bound (held-out side with the news 0.59 of headline-days) but held with it (0.80; docs/daily_rl.md, "Credit").'
            )
        },
    )
    probe_headlines: int = field(
        default=8, metadata={"help": "Headlines of day D in the probe (the first N by headline_id)."}
    )
    probe_max_new_tokens: int = field(
        default=160, metadata={"help": "Token budget of each greedy probe note (at most the day's max_new_tokens)."}
    )
    kl_rollouts: int = field(
        default=64, metadata={"help": "Training rollouts (parent samples) the KL is measured on, at most."}
    )

    def __post_init__(self):
        if not self.max_kl_to_parent > 0 or not self.max_probe_regression >= 0:
            raise ValueError("max_kl_to_parent must be > 0 and max_probe_regression >= 0")
        if self.max_kl_to_base is not None and not (
            isinstance(self.max_kl_to_base, (int, float)) and 0 < float(self.max_kl_to_base) < float("inf")
        ):
            raise ValueError(f"max_kl_to_base must be a finite number > 0 or None, got {self.max_kl_to_base!r}")
        if self.probe_headlines < 1 or self.kl_rollouts < 1 or self.probe_max_new_tokens < 1:
            raise ValueError("probe_headlines, probe_max_new_tokens and kl_rollouts must be at least 1")


@dataclass
class GateResult:
    verdict: str  # one of GATE_VERDICTS
    reason: str
    kl_to_parent: float = float("nan")
    probe_structure: float = float("nan")
    probe_parent_structure: float = float("nan")
    probe_notes: list[str] = field(default_factory=list)
    kl_to_base: float = float("nan")  # the candidate's, when the bound is set
    parent_kl_to_base: float = float("nan")

    def columns(self) -> dict:
        """The `policy_training` columns of the verdict."""
        return dict(
            gate=self.verdict,
            gate_reason=self.reason,
            gate_kl_to_parent=self.kl_to_parent,
            gate_kl_to_base=self.kl_to_base,
            gate_probe_structure=self.probe_structure,
            gate_probe_parent_structure=self.probe_parent_structure,
        )


def not_trained(reason: str) -> GateResult:
    return GateResult("not_trained", reason)


def probe_prompts(headlines: pd.DataFrame, n: int) -> list:
    """The probe: the first `n` of D's headlines by id (stable across re-runs)."""
    if headlines.empty:
        return []
    chosen = headlines.sort_values("headline_id").head(n)
    return [trading_note_messages(t, s) for t, s in zip(chosen["title"], chosen["summary"])]


def evaluate_update(
    candidate: "ModelBackend",
    parent: "ModelBackend",
    stats: "TrainStats",
    trained_on: pd.DataFrame,
    headlines: pd.DataFrame,
    config: GateConfig,
    base: "ModelBackend | None" = None,
) -> GateResult:
    """Accept or reject the candidate against its parent (module docstring); `trained_on` are the
    parent's rollouts the update used (the KL is taken at their sampling temperature). `base`: the
    base model for the bound when the policies hold no adapter to switch off (a full fine-tune)."""
    losses = np.asarray(stats.losses, dtype=np.float64)
    if not len(losses) or not np.isfinite(losses).all():
        bad = int((~np.isfinite(losses)).sum())
        return GateResult(
            "rejected",
            f"non-finite training loss ({bad} of {len(losses)} steps)"
            if len(losses)
            else "no training loss: no training step ran",
        )
    sample = trained_on.sort_values(["headline_id", "rollout_index"]).head(config.kl_rollouts)
    # exact KLs per token, the candidate's to `parent` and, with the bound, the candidate's and the parent's to the
    # base (None: the candidate's adapter off), from one forward of each model; on the first trained day the parent
    # is the base itself (no adapter, no base given), 0 from it
    bound = config.max_kl_to_base is not None
    parent_is_base = not parent.has_adapter and base is None
    pairs = [
        (candidate, parent),
        *([(candidate, base)] if bound else []),
        *([(parent, base)] if bound and not parent_is_base else []),
    ]
    kl, *to_base = mean_token_kls(candidate, sample, pairs)
    probe = probe_prompts(headlines, config.probe_headlines)
    notes = candidate.greedy(probe, config.probe_max_new_tokens) if probe else []
    parent_notes = parent.greedy(probe, config.probe_max_new_tokens) if probe else []
    ours = float(np.mean([structure_score(t) for t in notes])) if notes else float("nan")
    theirs = float(np.mean([structure_score(t) for t in parent_notes])) if parent_notes else float("nan")
    result = GateResult("accepted", "", kl, ours, theirs, notes)
    if bound:
        result.kl_to_base, result.parent_kl_to_base = to_base[0], 0.0 if parent_is_base else to_base[1]
    if not math.isfinite(kl):  # NaN compares false with any budget: a broken candidate, said as such
        result.verdict = "rejected"
        result.reason = f"KL to the parent is not a finite number ({kl}): the candidate's distribution is broken"
    elif kl > config.max_kl_to_parent:
        result.verdict = "rejected"
        result.reason = f"KL to the parent {kl:.4g} nats/token is over the budget {config.max_kl_to_parent:g}"
    elif config.max_kl_to_base is not None and not math.isfinite(result.kl_to_base):
        result.verdict = "rejected"
        result.reason = (
            f"KL to the base is not a finite number ({result.kl_to_base}): the candidate's distribution is broken"
        )
    elif config.max_kl_to_base is not None and result.kl_to_base > max(config.max_kl_to_base, result.parent_kl_to_base):
        result.verdict = "rejected"
        result.reason = (
            f"KL to the base {result.kl_to_base:.4g} nats/token is over the bound {config.max_kl_to_base:g} "
            f"and the parent's {result.parent_kl_to_base:.4g}: the policy stays where it is"
        )
    elif notes and ours < theirs - config.max_probe_regression:
        result.verdict = "rejected"
        result.reason = (
            f"probe regression: structure {ours:.3f} vs the parent's {theirs:.3f} on {len(notes)} headlines "
            f"(tolerance {config.max_probe_regression:g})"
        )
    else:
        bound = (
            ""
            if config.max_kl_to_base is None
            else (
                f"; KL to the base {result.kl_to_base:.4g} within the bound {config.max_kl_to_base:g} or the parent's {result.parent_kl_to_base:.4g}"
            )
        )
        result.reason = (
            f"loss finite; KL to the parent {kl:.4g} <= {config.max_kl_to_parent:g}{bound}; probe structure "
            f"{ours:.3f} vs the parent's {theirs:.3f} on {len(notes)} headlines"
        )
    return result


def gate_update(models, candidate, parent, stats, trained_on, todays, config: GateConfig):
    """(the policy D's checkpoint holds, the gate's verdict): the candidate, or the parent reloaded when rejected."""
    parent_dir, parent_info = parent
    if not config.enabled:
        return candidate, GateResult("accepted", "gate disabled (run config gate_enabled=false)")
    parent_policy = load_policy(models, parent_dir, parent_info)
    try:
        # a full fine-tune has no adapter to switch off: the bound needs the base model itself
        base = models.load() if config.max_kl_to_base is not None and not candidate.has_adapter else None
        gate = evaluate_update(candidate, parent_policy, stats, trained_on, todays, config, base)
        del base
    except (FloatingPointError, RuntimeError, ValueError) as err:  # a broken candidate may not even run
        gate = GateResult("rejected", f"the candidate failed the probe: {type(err).__name__}: {err}")
    if gate.verdict == "rejected":
        del candidate
        return parent_policy, gate
    del parent_policy
    return candidate, gate
