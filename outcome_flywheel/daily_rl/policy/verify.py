"""The last step of a day: verify. The checkpoint on disk loads, writes text and gives the stored
behaviour log-probs back; ranks are permutations and rewards in range. Only then is it marked
verified (the next day may train from it, `latest` moves). Every check of `daily_update` is declared
here (`DAILY_UPDATE_CHECKS`), the gate's too: the asset's check specs and the step's reports read them."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
import pandas as pd

from outcome_flywheel.daily_rl.judge.ranking import is_permutation
from outcome_flywheel.daily_rl.policy.gate import GateResult
from outcome_flywheel.daily_rl.policy.rollouts import sampling_temperature
from outcome_flywheel.models.prompts import trading_note_messages
from outcome_flywheel.models.sampling import LOGPROB_TOLERANCE, REPRODUCTION_FACTOR, dtype_name
from outcome_flywheel.steps.metadata import DeclaredCheck

if TYPE_CHECKING:
    from outcome_flywheel.models.interface import ModelBackend

# The checks of `daily_update`, computed below: `verify_day` the blocking ones, `gate_check` the gate's.
# The asset declares its check specs from these and the step reports each under its asset.
RANKS_ARE_PERMUTATIONS = DeclaredCheck(
    "ranks_are_permutations", "rollout_scores", "Each headline's ranks are a permutation of 1..N."
)
REWARDS_IN_RANGE = DeclaredCheck(
    "rewards_in_range",
    "rollout_scores",
    "Every structure score and rank reward is in [0, 1], every reward inside its recorded clip range.",
)
LOADS_AND_GENERATES = DeclaredCheck(
    "loads_and_generates", "policy_checkpoint", "The saved checkpoint loads from disk and writes text."
)
GENERATED_BY_OWN_CHECKPOINT = DeclaredCheck(
    "generated_by_own_checkpoint", "rollouts", "Every rollout of D carries checkpoint D's policy_version."
)
UPDATE_ACCEPTED_BY_GATE = DeclaredCheck(
    "update_accepted_by_gate",
    "policy_checkpoint",
    "The evaluation gate accepted D's update (a WARN when it rejected it: the parent's weights stay D's "
    "checkpoint and the day goes on; policy_training.gate_reason says why).",
    blocking=False,
)
DAILY_UPDATE_CHECKS = (
    RANKS_ARE_PERMUTATIONS,
    REWARDS_IN_RANGE,
    LOADS_AND_GENERATES,
    GENERATED_BY_OWN_CHECKPOINT,
    UPDATE_ACCEPTED_BY_GATE,
)


def teacher_forced(policy, rollouts: pd.DataFrame) -> list[np.ndarray]:
    """The rollouts' response log-probs under `policy`, teacher forced at the temperature they were
    sampled (and their behaviour log-probs stored) at."""
    prompts = [json.loads(p) for p in rollouts["prompt"]]
    responses = [list(r) for r in rollouts["response_ids"]]
    return policy.response_logprobs(prompts, responses, temperature=sampling_temperature(rollouts))


def mean_gaps(a: Sequence, b: Sequence) -> np.ndarray:
    """Per response: mean |a - b| over its tokens (responses without tokens left out)."""
    return np.array(
        [float(np.mean(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)))) for x, y in zip(a, b) if len(y)]
    )


def behavior_logprob_gap(policy, rollouts: pd.DataFrame) -> float:
    """Largest per-rollout mean |stored behaviour log-prob - log-prob under `policy`|."""
    return float(mean_gaps(list(rollouts["behavior_logprobs"]), teacher_forced(policy, rollouts)).max(initial=0.0))


def logprob_reproduction(stored: Sequence, forced: Sequence, reference: Sequence) -> dict:
    """Do the weights on disk give the stored behaviour log-probs back? Per response, the three
    computations of its log-probs: `stored` (the sampler's, in the compute dtype), `forced` (those
    weights teacher forced in the same dtype) and `reference` (teacher forced in float32).

    In float32 (`forced` is `reference`) the sampler and teacher forcing agree to ~1e-6 a token, so
    a response's mean |stored - reference| must stay within LOGPROB_TOLERANCE["float32"]. In bf16 or
    fp16 two computations of the same weights differ by their rounding, which grows with depth and
    the logits' size (SmolLM2-135M, 30 layers, on the CPU: response means 0.02-0.06): no fixed figure
    fits every model. So each is measured against float32 instead. With the same weights, `stored`
    and `forced` are two roundings of the same function, their errors against `reference` drawn from
    one process; other weights add their own gap to `stored` alone. A response passes while its
    mean |stored - reference| is within the float32 tolerance plus REPRODUCTION_FACTOR times the
    rounding of teacher forcing (that response's, or the pooled mean where it is larger: a short
    response's own mean is noisy)."""
    gaps, rounding = mean_gaps(stored, reference), mean_gaps(forced, reference)
    tokens = np.array([len(r) for r in reference if len(r)])
    pooled = float(np.dot(rounding, tokens) / tokens.sum()) if tokens.size else 0.0
    tolerance = LOGPROB_TOLERANCE["float32"] + REPRODUCTION_FACTOR * np.maximum(rounding, pooled)
    worst = int(np.argmax(gaps / tolerance)) if gaps.size else None
    return {
        "passed": bool(np.all(gaps <= tolerance)),
        "max_mean_abs_logprob_gap": float(gaps.max(initial=0.0)),
        "rounding_mean_abs_gap": pooled,
        "tolerance": float(tolerance[worst]) if worst is not None else LOGPROB_TOLERANCE["float32"],
        "worst_gap_over_tolerance": float(gaps[worst] / tolerance[worst]) if worst is not None else 0.0,
    }


def verify_day(
    load: Callable[..., "ModelBackend"], on_disk: dict, scores: pd.DataFrame, rollouts: pd.DataFrame
) -> dict[str, dict]:
    """The blocking checks of `daily_update`, each {passed, metadata}. `load(dtype=None)`: the day's checkpoint
    as published on disk, `on_disk` its checkpoint.json; loaded once (and once more in float32 where it
    computes in another precision, for the reference). The recipe marks it verified when all pass."""
    ranks_ok = all(is_permutation(list(g["rank"])) for _, g in scores.groupby("headline_id")) if len(scores) else True
    rewards_ok = rewards_in_range(scores)
    own_version = bool(len(rollouts) == 0 or (rollouts["policy_version"] == on_disk.get("policy_version")).all())
    reloaded = load()
    probe = reloaded.greedy([trading_note_messages("Apple beats quarterly estimates", "")], max_new_tokens=12)[0]
    # The weights on disk, not just the label: they must give the stored behaviour log-probs back.
    sample = rollouts.head(8)
    forced = teacher_forced(reloaded, sample) if len(sample) else []
    compute_dtype = dtype_name(getattr(reloaded, "dtype", "float32"))
    del reloaded
    if compute_dtype == "float32" or not len(sample):
        reference = forced
    else:  # the same files in float32 (a second load, after the first is dropped): see logprob_reproduction
        reference = teacher_forced(load(dtype="float32"), sample)
    reproduction = logprob_reproduction(list(sample["behavior_logprobs"]), forced, reference)
    reproduced = reproduction.pop("passed")  # the rest is the check's metadata
    return {
        RANKS_ARE_PERMUTATIONS.name: {"passed": bool(ranks_ok), "metadata": {}},
        REWARDS_IN_RANGE.name: {"passed": rewards_ok, "metadata": describe_rewards(scores)},
        LOADS_AND_GENERATES.name: {"passed": bool(probe.strip()), "metadata": {"sample": probe[:200]}},
        GENERATED_BY_OWN_CHECKPOINT.name: {
            "passed": bool(own_version and reproduced),
            "metadata": {
                "checkpoint_version": str(on_disk.get("policy_version")),
                "version_matches": own_version,
                "compute_dtype": compute_dtype,
                **reproduction,
            },
        },
    }


def gate_check(gate: GateResult) -> dict:
    """`update_accepted_by_gate` as {passed, metadata}: failed only when the gate rejected the update."""
    return {"passed": gate.verdict != "rejected", "metadata": {"gate": gate.verdict, "reason": gate.reason}}


def rewards_in_range(scores: pd.DataFrame) -> bool:
    """Every signal in [0, 1] and every reward inside the clip range its row records."""
    if not len(scores):
        return True
    signals = scores[["structure_score", "outcome_reward"]]
    clip = np.array([json.loads(c) for c in scores["reward_clip"]], dtype=np.float64)
    reward = scores["reward"].to_numpy(dtype=np.float64)
    return bool(
        ((signals >= 0) & (signals <= 1)).all().all() and ((reward >= clip[:, 0]) & (reward <= clip[:, 1])).all()
    )


def describe_rewards(scores: pd.DataFrame) -> dict:
    if not len(scores):
        return {}
    rewards = scores["reward"]
    return {
        "n": int(len(rewards)),
        "avg": round(float(rewards.mean()), 4),
        "min": round(float(rewards.min()), 4),
        "max": round(float(rewards.max()), 4),
        "negatives": int((rewards < 0).sum()),
    }
