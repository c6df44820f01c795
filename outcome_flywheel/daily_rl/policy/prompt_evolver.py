"""The prompt evolver (tier 1b): a UCB1 bandit over variants of the note-writing system prompt.

- A trial is one headline's group of notes sampled under one variant; its reward is the group's mean
  reward once the group is scored (rollout_scores of the next day). Unusable groups are not trials.
  Under the default weights the judge's rank rewards of a group always average 0.5, so two variants'
  trial rewards differ only through the absolute signals (structure, and people / relevance / the
  scorer when weighted): the bandit learns which wording makes better-formed notes, not which one wins
  the judge's within-group ranking.
- Arms: the live variants (at most `max_live`, the base prompt always among them). Each headline of
  the day gets a variant: with probability `epsilon` a uniform one, else UCB1 (mean + sqrt(2 ln T / n),
  an unpulled arm first); the day's earlier assignments count in n, so one day's headlines spread
  over the arms while their rewards are pending. All draws are seeded by (seed, day).
- Every `trials_per_variant` scored trials a candidate is written from the current best
  (`prompt_variants.py`), and adopted (made live) only if it is not worse than the best on the
  held-out set: the last `heldout` scored headlines, both sampled by the day's policy with the same
  seeds, each group scored by the reward's judge-free part (the rank reward at its group mean, 0.5).
  When more than `max_live` are live, the worst live one (never the base, the best or the new one)
  is retired.
- State: the `prompt_evolver` table (one row per variant) and `prompt_experiences` (the held-out set),
  both written for day D from D-1's and D's scores: a re-run of a day writes the same state.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from outcome_flywheel.daily_rl.notes.structure import structure_score
from outcome_flywheel.daily_rl.partitions import stable_seed
from outcome_flywheel.daily_rl.policy.prompt_tables import EXPERIENCE_COLUMNS, VARIANT_COLUMNS
from outcome_flywheel.daily_rl.policy.prompt_variants import BASE_SPEC, LLMWriter, PromptSpec, mutate
from outcome_flywheel.daily_rl.reward.signals import RewardConfig
from outcome_flywheel.models.prompts import BASE_PROMPT_VERSION, note_messages

LIVE, RETIRED, REJECTED = "live", "retired", "rejected"


@dataclass
class EvolverConfig:
    """The prompt evolver's settings (the `daily_update` run config's `prompt_evolver_*` fields)."""

    enabled: bool = field(
        default=True,
        metadata={
            "help": "Sample each headline under a variant the bandit picks; off = the base prompt everywhere (state carried unchanged)."
        },
    )
    max_live: int = field(default=10, metadata={"help": "Most live variants (the base prompt included)."})
    trials_per_variant: int = field(
        default=25, metadata={"help": "A new candidate variant every this many scored trials."}
    )
    epsilon: float = field(
        default=0.1,
        metadata={"help": "Share of headlines given a uniformly drawn live variant instead of UCB1's pick."},
    )
    heldout: int = field(
        default=50, metadata={"help": "Held-out set for adoption: the last this many scored headlines."}
    )
    heldout_samples: int = field(
        default=4, metadata={"help": "Notes per held-out headline for each of the candidate and the best."}
    )
    tolerance: float = field(
        default=0.0, metadata={"help": "Adopt when candidate - best on the held-out set >= -tolerance (mean reward)."}
    )
    min_pulls_for_best: int = field(
        default=5, metadata={"help": "Pulls a variant needs before it can be the best (else the base prompt is)."}
    )

    def __post_init__(self) -> None:
        if (
            self.max_live < 2
            or self.trials_per_variant < 1
            or not 0.0 <= self.epsilon <= 1.0
            or self.heldout < 1
            or self.heldout_samples < 1
        ):
            raise ValueError(
                "prompt evolver: need max_live >= 2, trials_per_variant >= 1, epsilon in [0, 1], heldout >= 1, heldout_samples >= 1"
            )


def version_of(spec: PromptSpec, number: int) -> str:
    return (
        BASE_PROMPT_VERSION
        if spec == BASE_SPEC
        else f"v{number}-{hashlib.sha256(spec.render().encode()).hexdigest()[:8]}"
    )


def _base_row(day: str) -> dict:
    return dict(
        version=BASE_PROMPT_VERSION,
        parent="",
        mutation="",
        writer="",
        system_prompt=BASE_SPEC.render(),
        spec=BASE_SPEC.to_json(),
        created_date=day,
        created_at_trial=0,
        status=LIVE,
        pulls=0,
        pending=0,
        reward_sum=0.0,
        reward_sq_sum=0.0,
        heldout_n=0,
        heldout_reward=np.nan,
        heldout_best_reward=np.nan,
        heldout_diff=np.nan,
    )


def interval(n: int, total: float, sq_total: float) -> tuple[float, float, float]:
    """(mean, 95% t-interval low, high) of n rewards from their sum and sum of squares; NaN where undefined."""
    if n == 0:
        return np.nan, np.nan, np.nan
    mean = total / n
    if n < 2:
        return mean, np.nan, np.nan
    from scipy import stats  # here, not at the top: scipy.stats is ~1 s of every day step process's start

    sd = math.sqrt(max(sq_total - n * mean * mean, 0.0) / (n - 1))
    half = float(stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


class PromptEvolver:
    """The bandit's state for one day: D-1's state (`variants`, `experiences`: its `frames`, read by the day's
    store), D's scores (`record`), a candidate (`evolve`), D's assignments (`assign`), D's state (`frames`)."""

    def __init__(self, day: str, config: EvolverConfig, seed: int, variants: list[dict], experiences: pd.DataFrame):
        self.day, self.config, self.seed = day, config, seed
        self.variants = variants or [_base_row(day)]
        self.experiences = experiences if len(experiences) else pd.DataFrame(columns=EXPERIENCE_COLUMNS)
        self.events: list[str] = []
        for v in self.variants:
            v["pending"] = 0  # yesterday's pending trials are scored (or dropped) today

    # -- state ---------------------------------------------------------------------------------
    def _by_version(self) -> dict[str, dict]:
        return {v["version"]: v for v in self.variants}

    def live(self) -> list[dict]:
        return [v for v in self.variants if v["status"] == LIVE]

    @property
    def trials(self) -> int:
        return int(sum(v["pulls"] for v in self.variants))

    def best(self) -> dict:
        """The live variant with the highest mean reward among those pulled `min_pulls_for_best` times; else the base."""
        ready = [v for v in self.live() if v["pulls"] >= self.config.min_pulls_for_best]
        by_version = self._by_version()
        return max(ready, key=lambda v: v["reward_sum"] / v["pulls"]) if ready else by_version[BASE_PROMPT_VERSION]

    def system_prompt(self, version: str) -> str:
        return self._by_version()[version]["system_prompt"]

    # -- 1. record D's scores ------------------------------------------------------------------
    def record(self, prev_rollouts: pd.DataFrame, scores: pd.DataFrame) -> int:
        """Each usable scored group of D-1 is one trial of the variant it was sampled under; returns the count."""
        if scores.empty or prev_rollouts.empty:
            return 0
        versions = (
            prev_rollouts.groupby("headline_id")["prompt_version"].first()
            if "prompt_version" in prev_rollouts
            else pd.Series(BASE_PROMPT_VERSION, index=prev_rollouts["headline_id"].unique())
        )
        heads = prev_rollouts.groupby("headline_id")[["title", "summary", "date"]].first()
        by_version, new = self._by_version(), []
        for headline_id, group in scores[scores["usable"]].groupby("headline_id", sort=True):
            variant = by_version.get(str(versions.get(headline_id, BASE_PROMPT_VERSION)))
            if variant is None:  # sampled under a variant this state never had: not a trial of any arm
                self.events.append(f"{headline_id}: unknown prompt version {versions.get(headline_id)!r}, not counted")
                continue
            reward = float(group["reward"].mean())
            variant["pulls"] += 1
            variant["reward_sum"] += reward
            variant["reward_sq_sum"] += reward * reward
            new.append(
                dict(
                    date=self.day,
                    prediction_date=str(heads.loc[headline_id, "date"]),
                    headline_id=str(headline_id),
                    title=heads.loc[headline_id, "title"],
                    summary=heads.loc[headline_id, "summary"],
                    prompt_version=variant["version"],
                    reward=reward,
                )
            )
        if new:
            joined = pd.concat([self.experiences, pd.DataFrame(new, columns=EXPERIENCE_COLUMNS)], ignore_index=True)
            self.experiences = joined.tail(self.config.heldout).reset_index(drop=True)
        return len(new)

    # -- 2. a candidate every trials_per_variant trials --------------------------------------------
    def due(self) -> bool:
        written = sum(1 for v in self.variants if v["version"] != BASE_PROMPT_VERSION)
        return bool(
            self.config.enabled
            and self.trials >= self.config.trials_per_variant * (written + 1)
            and len(self.experiences)
        )

    def evolve(
        self, heldout_reward: Callable[[str, pd.DataFrame], np.ndarray], writer: LLMWriter | None = None
    ) -> dict | None:
        """Write one candidate from the best (when due), test it on the held-out set against the best,
        adopt or reject it; `heldout_reward(system_prompt, experiences)` -> one reward per held-out headline."""
        if not self.due():
            return None
        best = self.best()
        rng = np.random.default_rng(stable_seed(self.seed, self.day, "prompt_evolver", "mutate", self.trials) % 2**32)
        known = {v["system_prompt"] for v in self.variants}
        made = None
        for attempt in range(
            8
        ):  # a prompt tried before (even a rejected one) is drawn again, then with mutations stacked
            spec, names, writers = PromptSpec.from_json(best["spec"]), [], set()
            for _ in range(1 + attempt // 2):
                step = mutate(spec, rng, writer)
                if step is None:
                    break
                spec, names = step[0], names + [step[1]]
                writers.add(step[2])
                if spec.render() not in known:
                    made = (spec, "+".join(names), "+".join(sorted(writers)))
                    break
            if made is not None:
                break
        number = len(self.variants)
        if made is None:
            # nothing new to write from the best: the slot is used up so the next one waits 25 more trials
            candidate = dict(
                _base_row(self.day),
                version=f"v{number}-none",
                parent=best["version"],
                mutation="none",
                status=REJECTED,
                system_prompt="",
                spec="",
                created_at_trial=self.trials,
            )
            self.variants.append(candidate)
            self.events.append(f"no new variant from {best['version']}: every mutation gives a known prompt")
            return candidate
        spec, mutation, writer_name = made
        candidate = dict(
            _base_row(self.day),
            version=version_of(spec, number),
            parent=best["version"],
            mutation=mutation,
            writer=writer_name,
            system_prompt=spec.render(),
            spec=spec.to_json(),
            created_at_trial=self.trials,
        )
        held = self.experiences
        ours, theirs = heldout_reward(candidate["system_prompt"], held), heldout_reward(best["system_prompt"], held)
        diff = float(np.mean(ours - theirs))
        adopted = diff >= -self.config.tolerance
        candidate.update(
            status=LIVE if adopted else REJECTED,
            heldout_n=len(held),
            heldout_reward=float(np.mean(ours)),
            heldout_best_reward=float(np.mean(theirs)),
            heldout_diff=diff,
        )
        self.variants.append(candidate)
        self.events.append(
            f"{candidate['version']} ({mutation}, {writer_name}) from {best['version']}: held-out "
            f"{np.mean(ours):.3f} vs {np.mean(theirs):.3f} on {len(held)} headlines -> {'adopted' if adopted else 'rejected'}"
        )
        if adopted and len(self.live()) > self.config.max_live:
            keep = {BASE_PROMPT_VERSION, best["version"], candidate["version"]}
            worst = min(
                (v for v in self.live() if v["version"] not in keep),
                key=lambda v: v["reward_sum"] / v["pulls"] if v["pulls"] else -np.inf,
            )
            worst["status"] = RETIRED
            self.events.append(f"{worst['version']} retired (more than {self.config.max_live} live)")
        return candidate

    # -- 3. assign D's headlines -------------------------------------------------------------------
    def assign(self, headline_ids: Sequence[str]) -> list[str]:
        """The variant each headline's group is sampled under (epsilon-greedy over UCB1, seeded by the day)."""
        if not self.config.enabled:
            return [BASE_PROMPT_VERSION] * len(headline_ids)
        rng = np.random.default_rng(stable_seed(self.seed, self.day, "prompt_evolver", "assign") % 2**32)
        live = self.live()
        scored = sum(v["pulls"] for v in live)
        prior = sum(v["reward_sum"] for v in live) / scored if scored else 0.0
        chosen = []
        for _ in headline_ids:
            explore = rng.random() < self.config.epsilon
            pick = int(rng.integers(len(live)))  # drawn every time: the stream does not depend on the branch
            if not explore:
                untried = [i for i, v in enumerate(live) if v["pulls"] + v["pending"] == 0]
                if untried:
                    pick = untried[0]
                else:
                    total = sum(v["pulls"] + v["pending"] for v in live)
                    ucb = [
                        (v["reward_sum"] / v["pulls"] if v["pulls"] else prior)
                        + math.sqrt(2.0 * math.log(total) / (v["pulls"] + v["pending"]))
                        for v in live
                    ]
                    pick = int(np.argmax(ucb))
            live[pick]["pending"] += 1
            chosen.append(live[pick]["version"])
        return chosen

    # -- 4. D's state --------------------------------------------------------------------------
    def frames(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """(prompt_evolver, prompt_experiences) rows of day D."""
        best = self.best()["version"]
        rows = []
        for v in self.variants:
            mean, low, high = interval(int(v["pulls"]), float(v["reward_sum"]), float(v["reward_sq_sum"]))
            rows.append(
                {
                    **v,
                    "date": self.day,
                    "reward_mean": mean,
                    "ci_low": low,
                    "ci_high": high,
                    "is_best": v["version"] == best,
                }
            )
        variants = pd.DataFrame(rows, columns=VARIANT_COLUMNS)
        experiences = self.experiences.copy()
        return variants, experiences[EXPERIENCE_COLUMNS].reset_index(drop=True)


def heldout_scorer(
    policy, reward: RewardConfig, sampling, n: int, seed: int, day: str
) -> Callable[[str, pd.DataFrame], np.ndarray]:
    """`heldout_reward` of `PromptEvolver.evolve`: n notes per held-out headline sampled by `policy` under a
    system prompt (the same seeds for every prompt: the comparison is paired), each group's mean reward
    with the judge's rank reward at its group mean (0.5) and the structure score of each note."""

    def score(system_prompt: str, experiences: pd.DataFrame) -> np.ndarray:
        prompts = [
            note_messages(t, s, system=system_prompt) for t, s in zip(experiences["title"], experiences["summary"])
        ]
        seeds = [
            stable_seed(seed, day, "prompt_evolver", "heldout", h) % (2**31 - 1) for h in experiences["headline_id"]
        ]
        groups = policy.sample(prompts, n, sampling, seeds)
        return np.array(
            [
                np.mean([reward.combine({"structure": structure_score(s.text), "judge_rank": 0.5}) for s in g])
                for g in groups
            ]
        )

    return score


def prompt_writer(models, judge) -> LLMWriter | None:
    """The judge model as a writer of variants when it is a real LLM; None on tiny-local (it cannot write
    prompts: the rules write every variant there)."""
    if models.is_tiny_local and not judge.judge_model:
        return None
    return LLMWriter(judge.load(models), judge.describe(models))
