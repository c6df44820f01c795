"""The day's update of the policy: GSPO on D-1's judged notes and the matured notes, then the gate.

`update_policy` takes the parent loaded as a trainable policy and returns what checkpoint D holds
(the trained candidate, or the parent when the gate rejected it, there was nothing to train on or the
learning rate is 0),
with the training's figures and each trained note's truncated importance weight (for the ledger).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pandas as pd

from outcome_flywheel.daily_rl.partitions import stable_seed
from outcome_flywheel.daily_rl.policy.gate import GateResult, gate_update, not_trained
from outcome_flywheel.daily_rl.reward.examples import training_examples
from outcome_flywheel.daily_rl.reward.matured import MaturedBatch
from outcome_flywheel.models.train.gspo import train_gspo
from outcome_flywheel.models.train.gspo_config import GSPOConfig


@dataclass
class PolicyUpdate:
    """What the day's update did: the policy checkpoint D holds, the trainer's config and figures (None:
    not trained), the gate's verdict, the examples, and each trained note's IS ratio by its key."""

    policy: object
    gspo: GSPOConfig
    stats: object
    gate: GateResult
    examples: list
    is_ratios: dict = field(default_factory=dict)

    @property
    def trained(self) -> bool:
        return self.stats is not None


def trained_notes(
    prev_rollouts: pd.DataFrame, scores: pd.DataFrame, matured: MaturedBatch, note_rollouts: pd.DataFrame | None
) -> pd.DataFrame:
    """The rollout rows the update trained on: D-1's usable scored notes, then the matured notes (found in
    `note_rollouts`, the earlier days' notes the delayed step read)."""
    trained = (
        prev_rollouts.merge(
            scores.loc[scores["usable"], ["headline_id", "rollout_index"]], on=["headline_id", "rollout_index"]
        )
        if len(scores)
        else prev_rollouts.iloc[:0]
    )
    keys = set(matured.example_keys)
    if not keys or note_rollouts is None:
        return trained
    older = note_rollouts[
        [
            (str(d), h, int(i)) in keys
            for d, h, i in zip(note_rollouts["date"], note_rollouts["headline_id"], note_rollouts["rollout_index"])
        ]
    ]
    return pd.concat([trained, older], ignore_index=True)  # note_rollouts is in day order


def training_plan(policy, parent, inputs, scores, matured: MaturedBatch, settings, temperature: float, seed, day):
    """(the examples, their keys, the trainer's `GSPOConfig`) of the day's update: D-1's usable scores made into
    examples beside the matured notes, and the settings' trainer seeded for the day (`update_policy`; a replay of
    the day, `benchmarks/lean_source.py`, takes the same plan)."""
    prev_rollouts = inputs.prev_rollouts
    judged, judged_keys = training_examples(
        prev_rollouts,
        scores,
        with_keys=True,
        reward=settings.reward,
        tokenizer=policy.tokenizer if settings.gspo.objective == "token" else None,
        relevance_span=settings.credit.relevance_span,
        name_c=settings.credit.relevance_counterfactual_c,
    )
    examples = judged + matured.examples
    off_policy = (
        bool(len(prev_rollouts))
        and parent is not None
        and set(prev_rollouts["policy_version"]) != {parent[1]["policy_version"]}
    )
    gspo = replace(
        settings.gspo,
        seed=stable_seed(seed, day, "shuffle") % (2**31),
        temperature=temperature if examples else 1.0,
        # notes sampled days ago, or by the checkpoint a distilled parent came from, need pi_old = the
        # parent recomputed, for the truncated IS weight
        old_logprobs="recompute" if matured.examples or off_policy else settings.gspo.old_logprobs,
    )
    return examples, judged_keys + matured.example_keys, gspo


def update_policy(
    policy, models, parent, inputs, scores, matured: MaturedBatch, settings, temperature: float, seed: int, day: str
) -> PolicyUpdate:
    """GSPO (`models/train/gspo.py`) from the parent on the usable scores of D-1 and the matured notes, then
    the gate (`gate.py`). `policy`: the parent, loaded; `inputs`: the day's `DayInputs` (D-1's notes, D's
    headlines for the gate's probe, the earlier notes that matured); `settings`: its `DailyUpdateSettings`;
    `temperature`: the one D-1's notes were sampled at."""
    examples, keys, gspo = training_plan(policy, parent, inputs, scores, matured, settings, temperature, seed, day)
    if not examples or settings.gspo.learning_rate == 0:
        # learning rate 0 freezes the policy (a held-out day): no step could move it, so none is taken
        reason = (
            "first day: the base policy"
            if not parent
            else "nothing to train on"
            if not examples
            else "learning rate 0: the policy is frozen"
        )
        return PolicyUpdate(policy, gspo, None, not_trained(reason), [])
    # LoRA init and anything random in the trainer draw from the framework's generator: a re-run repeats them.
    policy.framework.seed(stable_seed(seed, day, "train") % (2**31))
    stats = train_gspo(policy, examples, gspo)
    trained_on = trained_notes(inputs.prev_rollouts, scores, matured, inputs.note_rollouts)
    policy, gate = gate_update(models, policy, parent, stats, trained_on, inputs.headlines, settings.gate)
    is_ratios = dict(zip(keys, stats.extra.get("is_ratio_by_example", [])))
    return PolicyUpdate(policy, gspo, stats, gate, examples, is_ratios)
