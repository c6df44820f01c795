"""The policy's notes of a day (`rollouts`): sampled from the day's checkpoint with the behaviour
log-probs GSPO uses as pi_old, the sampling temperature they were drawn at, the check that they
came from the policy being trained, and the policy's KL to the base on them."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np
import pandas as pd

from outcome_flywheel.daily_rl.notes.structure import structure_score
from outcome_flywheel.daily_rl.partitions import stable_seed
from outcome_flywheel.models.interface import SamplingConfig
from outcome_flywheel.models.prompts import BASE_PROMPT_VERSION, SYSTEM_PROMPT, note_messages
from outcome_flywheel.models.train.shards import sample_across_ranks

if TYPE_CHECKING:
    from outcome_flywheel.models.interface import ModelBackend


# The `rollouts` table's stored columns, in order: column -> (type, description) as the Dagster catalog
# shows them (assets/catalog.py reads them from here).
ROLLOUT_COLUMN_SCHEMA: dict[str, tuple[str, str]] = {
    "date": ("string", "Partition day D: the headlines' day and the checkpoint that wrote the notes."),
    "headline_id": ("string", "The headline the note is about (headlines.headline_id)."),
    "rollout_index": ("int", "0..N-1: which of the headline's N samples."),
    "title": ("string", "Headline text given in the prompt."),
    "summary": ("string", "Headline summary given in the prompt."),
    "prompt": ("string", "Chat messages of the prompt, JSON."),
    "response": ("string", "The sampled trading note."),
    "response_ids": ("list<int>", "Token ids of the sampled note."),
    "n_tokens": ("int", "Number of sampled tokens."),
    "finished": ("bool", "The note ended on its own (EOS) rather than at max_new_tokens."),
    "structure_score": (
        "float",
        ("Share of the 6 required sections present (Trade Recommendation ... Stop Loss), in [0, 1]."),
    ),
    "behavior_logprobs": (
        "list<float>",
        ("Per-token log-probs under the sampling policy at the sampling temperature (GSPO's pi_old)."),
    ),
    "temperature": ("float", "Sampling temperature (0.8)."),
    "policy_version": ("string", "Checkpoint that sampled the note: D@<weights sha256, 12 hex> or D@base."),
    "seed": ("int", "Sampling seed of the headline's group."),
    "max_new_tokens": ("int", "Token budget each note was sampled with."),
    "prompt_version": (
        "string",
        ("The prompt evolver's variant of the system prompt the note was sampled under (base = SYSTEM_PROMPT)."),
    ),
}
ROLLOUT_COLUMNS = list(ROLLOUT_COLUMN_SCHEMA)


# How rollouts are sampled. `behavior_logprobs` are log-softmax(logits / temperature) of the
# sampled tokens (before top-k / top-p), and GSPO trains at the same temperature.
ROLLOUT_SAMPLING = SamplingConfig(temperature=0.8, top_p=0.95, top_k=50)


# -- generate --------------------------------------------------------------------------------
def generation_seed(seed: int, day: str, headline_id: str) -> int:
    return stable_seed(seed, day, headline_id) % (2**31 - 1)


def generate_rollouts(
    policy: "ModelBackend",
    headlines: pd.DataFrame,
    day: str,
    seed: int,
    n: int,
    max_new_tokens: int,
    policy_version: str,
    prompt_versions: Sequence[str] | None = None,
    system_prompts: Mapping[str, str] | None = None,
) -> pd.DataFrame:
    """`n` notes per headline, sampled as `ROLLOUT_SAMPLING` (temperature 0.8, top_p 0.95, top_k 50);
    headline i under the system prompt `system_prompts[prompt_versions[i]]` (default: the base prompt)."""
    if headlines.empty:
        return pd.DataFrame(columns=ROLLOUT_COLUMNS)
    versions = list(prompt_versions) if prompt_versions is not None else [BASE_PROMPT_VERSION] * len(headlines)
    systems = {BASE_PROMPT_VERSION: SYSTEM_PROMPT, **(system_prompts or {})}
    prompts = [note_messages(t, s, systems[v]) for t, s, v in zip(headlines["title"], headlines["summary"], versions)]
    seeds = [generation_seed(seed, day, h) for h in headlines["headline_id"]]
    return sample_rollouts(policy, headlines, prompts, seeds, day, n, max_new_tokens, policy_version, versions)


def sample_rollouts(
    policy: "ModelBackend",
    headlines: pd.DataFrame,
    prompts: list,
    seeds: list[int],
    day: str,
    n: int,
    max_new_tokens: int,
    policy_version: str,
    prompt_versions: Sequence[str] | None = None,
) -> pd.DataFrame:
    """Rollout rows: `n` samples of each prompt with its group seed (`headlines` gives id, title, summary);
    `prompt_versions[i]`: the prompt evolver's variant prompt i was written with (default: the base prompt).
    In a data-parallel step the prompts are shared out across its ranks, each sampling its own with their
    seeds (`train/shards.sample_across_ranks`): the same notes as one process."""
    versions = list(prompt_versions) if prompt_versions is not None else [BASE_PROMPT_VERSION] * len(prompts)
    config = replace(ROLLOUT_SAMPLING, max_new_tokens=max_new_tokens)
    samples = sample_across_ranks(policy, prompts, n, config, seeds)  # a step's ranks share them (torchrun)
    rows = []
    for (_, h), prompt, group_seed, group, version in zip(headlines.iterrows(), prompts, seeds, samples, versions):
        for k, s in enumerate(group):
            rows.append(
                dict(
                    date=day,
                    headline_id=h["headline_id"],
                    rollout_index=k,
                    title=h["title"],
                    summary=h["summary"],
                    prompt=json.dumps(prompt),
                    response=s.text,
                    response_ids=[int(t) for t in s.token_ids],
                    n_tokens=len(s.token_ids),
                    finished=bool(s.finished),
                    structure_score=structure_score(s.text),
                    behavior_logprobs=[float(x) for x in s.logprobs],
                    temperature=config.temperature,
                    policy_version=policy_version,
                    seed=int(group_seed),
                    max_new_tokens=max_new_tokens,
                    prompt_version=version,
                )
            )
    return pd.DataFrame(rows, columns=ROLLOUT_COLUMNS)


# -- train -----------------------------------------------------------------------------------
def sampling_temperature(rollouts: pd.DataFrame) -> float:
    """The one temperature the rollouts were sampled (and their behaviour log-probs stored) at."""
    if "temperature" not in rollouts.columns:
        raise ValueError(
            "these rollouts do not record their sampling temperature (written by an older version): re-run their day"
        )
    values = sorted(set(float(t) for t in rollouts["temperature"]))
    if len(values) != 1:
        raise ValueError(f"rollouts sampled at several temperatures {values}: one GSPO update needs one")
    return values[0]


def check_behaviour_policy(
    rollouts: pd.DataFrame, parent_version: str | None, prediction_day: str, allowed: Sequence[str] = ()
) -> None:
    """GSPO's pi_old is the policy that generated the rollouts, and training starts from the parent
    checkpoint: they must be the same, or the importance ratio means nothing. `allowed`: the other
    versions a distilled parent descends from (`behaviour_versions`), trained off-policy."""
    if rollouts.empty:
        return
    versions = sorted(set(rollouts["policy_version"]))
    if len(versions) != 1 or versions[0] not in {parent_version, *allowed}:
        raise ValueError(
            f"the rollouts of {prediction_day} were generated by {versions}, but the checkpoint they would train is "
            f"{parent_version}: re-run {prediction_day} (daily_update) so its rollouts come from its own checkpoint"
        )


def spread_sample(rollouts: pd.DataFrame, n: int | None) -> pd.DataFrame:
    """At most `n` rollouts taken across the headlines: every headline's first note, then every second...
    (None: all). A measure on a sample of the day then sees each headline, not the first few groups."""
    if n is None or len(rollouts) <= n:
        return rollouts
    return rollouts.sort_values(["rollout_index", "headline_id"]).head(n).sort_values(["headline_id", "rollout_index"])


def kl_to_base(policy: "ModelBackend", rollouts: pd.DataFrame, base: "ModelBackend | None" = None) -> float:
    """Mean exact KL(policy || base) per token, over the vocabulary, at every position of the
    sampled responses, both at the rollouts' sampling temperature (the distributions GSPO trains).
    `base` None = the policy with its adapter off."""
    return mean_token_kls(policy, rollouts, [(policy, base)])[0]


def mean_token_kls(policy: "ModelBackend", rollouts: pd.DataFrame, pairs: list[tuple]) -> list[float]:
    """`kl_to_base`'s mean per token for each (p, q) of `pairs` (None = `policy` with its adapter off) on the
    same rollouts, each model's forward once (`ModelBackend.token_kls`)."""
    if rollouts.empty:
        return [0.0] * len(pairs)
    prompts = [json.loads(p) for p in rollouts["prompt"]]
    responses = [list(r) for r in rollouts["response_ids"]]
    tokens = sum(len(r) for r in responses)
    if not tokens:
        return [0.0] * len(pairs)
    per_pair = policy.token_kls(prompts, responses, pairs, temperature=sampling_temperature(rollouts))
    return [float(sum(float(np.sum(k)) for k in per_token) / tokens) for per_token in per_pair]
