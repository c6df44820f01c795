"""The three steps of one daily partition as plain functions (no Dagster): score yesterday's
rollouts, train the policy on them, generate today's rollouts; plus the dated checkpoints.

Checkpoint folder `$FLYWHEEL_DATA_DIR/checkpoints/policy/D/` holds `checkpoint.json` and:
- kind "base": nothing else; the policy of that day is the frozen base model (the first
  partition, and any day before the first training step);
- kind "lora": a PEFT adapter (`adapter_config.json`, `adapter_model.safetensors`);
- kind "full": a full Hugging Face model folder (full fine-tune, `lora=None`).
`policy_version` = "D@<sha256 of the weight files, 12 hex>" ("D@base" for the base), stamped on
every rollout the checkpoint generates. `latest` is a symlink to the newest dated folder.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import uuid
from dataclasses import dataclass, replace
from datetime import date, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np
import pandas as pd

from outcome_flywheel.daily_rl.judging import GroupJudgement, JudgeGroup, is_permutation, rank_rewards, stable_seed
from outcome_flywheel.daily_rl.rewards import RewardConfig, group_advantages, rank_reward
from outcome_flywheel.daily_rl.structure import structure_score
from outcome_flywheel.models.interface import SamplingConfig
from outcome_flywheel.models.prompts import BASE_PROMPT_VERSION, SYSTEM_PROMPT, note_messages
from outcome_flywheel.storage import atomic_symlink, atomic_write_bytes, publish_dir

if TYPE_CHECKING:
    from outcome_flywheel.models.interface import ModelBackend

CHECKPOINT_FILE = "checkpoint.json"
ROLLOUT_COLUMNS = [
    "date", "headline_id", "rollout_index", "title", "summary", "prompt", "response", "response_ids", "n_tokens",
    "finished", "structure_score", "behavior_logprobs", "temperature", "policy_version", "seed", "max_new_tokens",
    "prompt_version",
]
SCORE_COLUMNS = [
    "date", "prediction_date", "outcome_headlines_date", "headline_id", "rollout_index", "rank", "judge_placed",
    "outcome_reward", "structure_score", "reward", "advantage", "usable", "unusable_reason", "judge_retries",
    "judge_fallback", "judge_rounds_answered", "judge_first_position", "judge_presentation", "judge_answers",
    "outcome_headlines_shown", "reward_weights", "reward_clip", "judge_note_tokens", "judge_shown_tokens",
    "judge_truncated", "human_signal", "relevance_signal", "relevance_advantage",
]
# How rollouts are sampled. `behavior_logprobs` are log-softmax(logits / temperature) of the
# sampled tokens (before top-k / top-p), and GSPO trains at the same temperature.
ROLLOUT_SAMPLING = SamplingConfig(temperature=0.8, top_p=0.95, top_k=50)


def previous_day(day: str) -> str:
    return (date.fromisoformat(day) - timedelta(days=1)).isoformat()


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
    versions = [dated_info.get("policy_version")] + [i["policy_version"] for _, i in distilled_chain(root, dated, dated_info)]
    versions = versions[: versions.index(info["policy_version"]) + 1] if info["policy_version"] in versions else [info["policy_version"]]
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


def load_policy(model_backend, folder: Path | None, info: dict | None) -> "ModelBackend":
    """A checkpoint as a trainable policy (`models` is a `ModelLoader`)."""
    if info is None or info["kind"] == "base":
        return model_backend.load()
    if info["kind"] == "lora":
        return model_backend.load(adapter_path=folder)
    if info["kind"] == "full":  # trained with fp32 master weights: keep them (see use_master_weights)
        return model_backend.load(model_path=folder, master_weights=True)
    raise ValueError(f"unknown checkpoint kind {info['kind']!r} in {folder}")


def publish_checkpoint(policy: "ModelBackend", root: Path, day: str, info: dict, is_base: bool) -> dict:
    """Save the day's policy to `root/D/` (staging folder, then one rename), not yet verified:
    `mark_verified` moves `latest` once the day's blocking checks pass."""
    staging = root / f".{day}.{uuid.uuid4().hex}.staging"
    staging.mkdir(parents=True)
    if is_base:
        info = {**info, "kind": "base", "policy_version": f"{day}@base"}
    else:
        policy.save(staging)
        info = {**info, "kind": "lora" if policy.has_adapter else "full",
                "policy_version": f"{day}@{weights_digest(staging)[:12]}"}
    info = {**info, "verified": False}
    atomic_write_bytes(staging / CHECKPOINT_FILE, json.dumps(info, indent=1, sort_keys=True).encode())
    publish_dir(staging, root / day)
    if not is_base:
        policy.weights_saved_as(root / day)  # a vLLM sampler serves these files from now on
    return info


def republish_parent(root: Path, day: str, parent_dir: Path, parent_info: dict, info: dict) -> dict:
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
    publish_dir(staging, root / day)
    return info


def mark_verified(root: Path, day: str) -> dict:
    """The day's checks passed: record it in `checkpoint.json` and move `latest` to it."""
    final = root / day
    info = {**(read_checkpoint(final) or {}), "verified": True}
    atomic_write_bytes(final / CHECKPOINT_FILE, json.dumps(info, indent=1, sort_keys=True).encode())
    latest = root / "latest"
    current = latest.resolve().name if latest.is_symlink() else ""
    if not _is_date(current) or current <= day:  # a backfill of an older day leaves `latest` alone
        atomic_symlink(final, latest)
    return info


# -- generate --------------------------------------------------------------------------------
def generation_seed(seed: int, day: str, headline_id: str) -> int:
    return stable_seed(seed, day, headline_id) % (2**31 - 1)


def generate_rollouts(
    policy: "ModelBackend", headlines: pd.DataFrame, day: str, seed: int, n: int, max_new_tokens: int,
    policy_version: str, prompt_versions: Sequence[str] | None = None, system_prompts: Mapping[str, str] | None = None,
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
    policy: "ModelBackend", headlines: pd.DataFrame, prompts: list, seeds: list[int], day: str, n: int,
    max_new_tokens: int, policy_version: str, prompt_versions: Sequence[str] | None = None,
) -> pd.DataFrame:
    """Rollout rows: `n` samples of each prompt with its group seed (`headlines` gives id, title, summary);
    `prompt_versions[i]`: the prompt evolver's variant prompt i was written with (default: the base prompt)."""
    versions = list(prompt_versions) if prompt_versions is not None else [BASE_PROMPT_VERSION] * len(prompts)
    config = replace(ROLLOUT_SAMPLING, max_new_tokens=max_new_tokens)
    samples = policy.sample(prompts, n, config, seeds)
    rows = []
    for (_, h), prompt, group_seed, group, version in zip(headlines.iterrows(), prompts, seeds, samples, versions):
        for k, s in enumerate(group):
            rows.append(dict(
                date=day, headline_id=h["headline_id"], rollout_index=k, title=h["title"], summary=h["summary"],
                prompt=json.dumps(prompt), response=s.text, response_ids=[int(t) for t in s.token_ids],
                n_tokens=len(s.token_ids), finished=bool(s.finished), structure_score=structure_score(s.text),
                behavior_logprobs=[float(x) for x in s.logprobs], temperature=config.temperature,
                policy_version=policy_version, seed=int(group_seed), max_new_tokens=max_new_tokens, prompt_version=version,
            ))
    return pd.DataFrame(rows, columns=ROLLOUT_COLUMNS)


# -- score -----------------------------------------------------------------------------------
@dataclass
class ScoringInput:
    groups: list[JudgeGroup]
    keys: list[str]  # headline_id per group
    frames: list[pd.DataFrame]  # the group's rollouts, in rollout_index order


def judge_inputs(rollouts: pd.DataFrame, outcome_titles: Sequence[str], select_outcomes, seed: int, day: str) -> ScoringInput:
    """One judge group per headline of the previous day's rollouts."""
    groups, keys, frames = [], [], []
    for headline_id, frame in rollouts.groupby("headline_id", sort=True):
        frame = frame.sort_values("rollout_index")
        title = frame["title"].iloc[0]
        groups.append(JudgeGroup(title, select_outcomes(title, list(outcome_titles)), list(frame["response"]),
                                 stable_seed(seed, day, headline_id, "judge")))
        keys.append(headline_id)
        frames.append(frame)
    return ScoringInput(groups, keys, frames)


def score_table(
    inputs: ScoringInput, judgements: Sequence[GroupJudgement], day: str, prediction_date: str, outcome_date: str,
    reward: RewardConfig | None = None, human: Mapping[tuple[str, int], float] | None = None,
    relevance: Mapping[tuple[str, int], float | None] | None = None, scorer: Mapping[tuple[str, int], float] | None = None,
) -> pd.DataFrame:
    """rollout_scores rows: rank -> rank reward, the configured weighted sum of the whole-note signals
    (default 0.5 structure + 0.5 rank reward, clipped to [0, 1]) and its group advantage (`advantage`),
    the `relevance` part's own group advantage (`relevance_advantage`, 0 where it is not weighted or the
    headline names no company); every row records the weights and clip it was made with.

    Notes the judge never placed (it failed a round) share one rank reward (`rank_rewards`).
    Unusable groups (the judge never answered, or there was nothing to judge against) keep their
    rows with advantage 0 and the reason. `human`: (headline_id, rollout_index) -> the note's human
    signal in [0, 1], for the notes people rated (the `human` reward signal); `relevance`: the same key
    -> the `relevance` signal, None where the headline names no known company; `scorer`: the same key
    -> the online note scorer's signal, where it is weighted and known.
    """
    reward_config = reward or RewardConfig()
    human = human or {}
    relevance = relevance or {}
    scorer = scorer or {}
    recorded = reward_config.describe()
    rows = []
    for group, key, frame, judgement in zip(inputs.groups, inputs.keys, inputs.frames, judgements):
        if not is_permutation(judgement.ranks):  # rank_groups guarantees it; never train on anything else
            raise AssertionError(f"ranks of {key} are not a permutation: {judgement.ranks}")
        n = len(judgement.ranks)
        structure = [float(s) for s in frame["structure_score"]]
        outcome = rank_rewards(judgement, rank_reward)
        people = [human.get((key, int(i))) for i in frame["rollout_index"]]
        on_topic = [relevance.get((key, int(i))) for i in frame["rollout_index"]]
        rated = [scorer.get((key, int(i))) for i in frame["rollout_index"]]
        rewards = [reward_config.combine({"structure": s, "judge_rank": o, "human": h, "relevance": r, "scorer": c})
                   for s, o, h, r, c in zip(structure, outcome, people, on_topic, rated)]
        advantage = group_advantages(rewards) if judgement.usable else np.zeros(n)
        # `relevance` is its own part (it judges the call's line): normalised within the group where defined.
        defined = [r for r in on_topic if r is not None]
        relevance_adv = np.zeros(n)
        if judgement.usable and float(reward_config.weights.get("relevance", 0.0)) and len(defined) == n:
            relevance_adv = group_advantages([float(r) for r in on_topic])
        placed = set(judgement.picks)
        for k, rollout_index in enumerate(frame["rollout_index"]):
            rows.append(dict(
                date=day, prediction_date=prediction_date, outcome_headlines_date=outcome_date, headline_id=key,
                rollout_index=int(rollout_index), rank=int(judgement.ranks[k]), judge_placed=k in placed,
                outcome_reward=outcome[k], structure_score=structure[k], reward=rewards[k], advantage=float(advantage[k]),
                usable=bool(judgement.usable), unusable_reason=judgement.unusable_reason,
                judge_retries=int(judgement.retries), judge_fallback=bool(judgement.fallback),
                judge_rounds_answered=int(judgement.rounds_answered), judge_first_position=judgement.first_position(k),
                judge_presentation=json.dumps(judgement.shown), judge_answers=json.dumps(judgement.answers),
                outcome_headlines_shown=json.dumps(group.outcome_headlines), **recorded,
                judge_note_tokens=int(judgement.note_tokens[k]) if judgement.note_tokens else 0,
                judge_shown_tokens=int(judgement.shown_tokens[k]) if judgement.shown_tokens else 0,
                judge_truncated=judgement.truncated(k), human_signal=people[k], relevance_signal=on_topic[k],
                relevance_advantage=float(relevance_adv[k]),
            ))
    return pd.DataFrame(rows, columns=SCORE_COLUMNS)


def position_bias(scores: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Mean judge rank (1 = best) by the letter a note was first shown under, and by rollout
    index, over judged groups: a flat profile is no bias; ~(N+1)/2 everywhere is no preference."""
    judged = scores[scores["judge_rounds_answered"] > 0] if len(scores) else scores
    if judged.empty:
        return {"by_shown_position": {}, "by_rollout_index": {}}
    by_position = judged[judged["judge_first_position"] >= 0].groupby("judge_first_position")["rank"].mean()
    by_index = judged.groupby("rollout_index")["rank"].mean()
    return {
        "by_shown_position": {chr(ord("A") + int(p)): round(float(v), 3) for p, v in by_position.items()},
        "by_rollout_index": {str(int(i)): round(float(v), 3) for i, v in by_index.items()},
    }


# -- train -----------------------------------------------------------------------------------
def sampling_temperature(rollouts: pd.DataFrame) -> float:
    """The one temperature the rollouts were sampled (and their behaviour log-probs stored) at."""
    if "temperature" not in rollouts.columns:
        raise ValueError("these rollouts do not record their sampling temperature (written by an older version): re-run their day")
    values = sorted(set(float(t) for t in rollouts["temperature"]))
    if len(values) != 1:
        raise ValueError(f"rollouts sampled at several temperatures {values}: one GSPO update needs one")
    return values[0]


def check_behaviour_policy(rollouts: pd.DataFrame, parent_version: str | None, prediction_day: str,
                           allowed: Sequence[str] = ()) -> None:
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


def training_examples(rollouts: pd.DataFrame, scores: pd.DataFrame, min_abs_advantage: float = 1e-8, with_keys: bool = False,
                      reward: RewardConfig | None = None, tokenizer=None):
    """GSPO examples from the usable scored rollouts (notes whose every token's advantage is 0 carry no
    gradient); with `with_keys`, also each example's (note date, headline_id, rollout_index).

    Without `reward`: one advantage per note, `advantage` (whole-note signals only). With it and the
    policy's `tokenizer`: the note's advantage share(note) * advantage (the sequence part) and
    share(relevance) * relevance_advantage on the call's line's tokens (`credit.py`)."""
    from outcome_flywheel.daily_rl.credit import call_token_mask, judged_token_advantages
    from outcome_flywheel.models.gspo_config import GSPOExample

    if rollouts.empty or scores.empty:
        return ([], []) if with_keys else []
    columns = ["headline_id", "rollout_index", "advantage", "usable"]
    relevance = "relevance_advantage" in scores.columns
    merged = rollouts.merge(scores[columns + (["relevance_advantage"] if relevance else [])],
                            on=["headline_id", "rollout_index"], how="inner")
    if not relevance:
        merged["relevance_advantage"] = 0.0
    merged["relevance_advantage"] = merged["relevance_advantage"].fillna(0.0)
    if reward is None:
        keep = merged["advantage"].abs() > min_abs_advantage
    else:
        keep = (merged["advantage"].abs() * reward.share("note") > min_abs_advantage) | \
               (merged["relevance_advantage"].abs() * reward.share("relevance") > min_abs_advantage)
    merged = merged[merged["usable"] & keep]
    merged = merged[merged["response_ids"].map(len) > 0].sort_values(["headline_id", "rollout_index"])
    examples = []
    for r in merged.itertuples():
        ids = [int(t) for t in r.response_ids]
        token_adv = None
        if reward is not None and reward.share("relevance") and float(r.relevance_advantage):
            mask = call_token_mask(tokenizer, ids, r.response) if tokenizer is not None else None
            token_adv = judged_token_advantages(reward, len(ids), float(r.relevance_advantage), mask)
        examples.append(GSPOExample(
            prompt=json.loads(r.prompt), response_ids=ids, behavior_logprobs=[float(x) for x in r.behavior_logprobs],
            advantage=float(r.advantage) * (reward.share("note") if reward is not None else 1.0), token_advantages=token_adv))
    if with_keys:
        return examples, [(str(r.date), str(r.headline_id), int(r.rollout_index)) for r in merged.itertuples()]
    return examples


def kl_to_base(policy: "ModelBackend", rollouts: pd.DataFrame, base: "ModelBackend | None" = None) -> float:
    """Mean exact KL(policy || base) per token, over the vocabulary, at every position of the
    sampled responses, both at the rollouts' sampling temperature (the distributions GSPO trains).
    `base` None = the policy with its adapter off."""
    if rollouts.empty:
        return 0.0
    prompts = [json.loads(p) for p in rollouts["prompt"]]
    responses = [list(r) for r in rollouts["response_ids"]]
    per_token = policy.token_kl(prompts, responses, temperature=sampling_temperature(rollouts), reference=base)
    tokens = sum(len(k) for k in per_token)
    return float(sum(float(np.sum(k)) for k in per_token) / tokens) if tokens else 0.0


def quartiles(values: Sequence[float]) -> tuple[float, float]:
    """(median, inter-quartile range); NaN for no values."""
    if not len(values):
        return float("nan"), float("nan")
    q1, med, q3 = np.percentile(np.asarray(values, dtype=float), [25, 50, 75])
    return float(med), float(q3 - q1)
