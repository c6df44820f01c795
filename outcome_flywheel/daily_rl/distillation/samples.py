"""Tier 3's training samples: a teacher's answers with their reasoning, and people's verified corrections.

- Which headlines the teacher answers (`select_headlines`): 15% of the day's headlines at random
  (seeded by the day), plus the day's highest-confidence cases. Confidence of a judged group
  (`rollout_scores` of D, the notes of D-1): the reward of its best note minus the group's median,
  over usable groups: a group where the judge and the structure score single out one clear winner.
- A teacher answer with a Qwen3-style think block (`<think>reasoning</think>answer`) gives three
  samples: prompt -> reasoning, prompt -> answer, prompt + reasoning -> answer (the phases
  `reasoning`, `answer`, `consistency`); without reasoning, one: prompt -> answer.
- A verified correction ("what should it have said?", `feedback_pairs` rows of source `correction`)
  gives one prompt -> answer sample.
Sample ids are stable hashes, so a re-run of a day writes the same rows.
"""

from __future__ import annotations

import hashlib
import json
import random
import re

import pandas as pd

from outcome_flywheel.models.interface import THINK_TOKENS
from outcome_flywheel.models.prompts import trading_note_messages

SAMPLES_TABLE = "distill_samples"
SAMPLE_COLUMNS = [
    "sample_id",
    "date",
    "source",
    "phase",
    "headline_id",
    "prompt",
    "prefix",
    "completion",
    "teacher",
    "why",
]
PHASES = ("answer", "reasoning", "consistency")  # the curriculum's order
RANDOM_FRACTION = 0.15
CONFIDENT_PER_DAY = 3
_THINK = re.compile(r"^\s*(?:<think>)?(.*?)</think>\s*(.*)$", re.S)


def sample_id(*parts) -> str:
    return hashlib.sha256("|".join(str(p) for p in parts).encode()).hexdigest()[:16]


def split_reasoning(text: str) -> tuple[str | None, str]:
    """(reasoning or None, answer) of a Qwen3-style completion; an empty think block is no reasoning."""
    match = _THINK.match(text or "")
    if not match or THINK_TOKENS[1] not in (text or ""):
        return None, (text or "").strip()
    reasoning, answer = match.group(1).strip(), match.group(2).strip()
    return (reasoning or None), answer


def think_block(reasoning: str) -> str:
    return f"{THINK_TOKENS[0]}\n{reasoning}\n{THINK_TOKENS[1]}\n\n"


def trace_samples(day: str, headline_id: str, prompt: list, text: str, teacher: str, why: str) -> list[dict]:
    """The samples of one teacher answer: three with reasoning, one without, none when it is empty."""
    reasoning, answer = split_reasoning(text)
    if not answer:
        return []
    base = dict(
        date=day, source="teacher", headline_id=headline_id, prompt=json.dumps(prompt), teacher=teacher, why=why
    )
    rows = [dict(base, phase="answer", prefix="", completion=answer)]
    if reasoning:
        rows.append(dict(base, phase="reasoning", prefix="", completion=think_block(reasoning).rstrip()))
        rows.append(dict(base, phase="consistency", prefix=think_block(reasoning), completion=answer))
    for r in rows:
        r["sample_id"] = sample_id(r["source"], day, headline_id, r["phase"], teacher)
    return rows


def correction_samples(pairs: pd.DataFrame) -> list[dict]:
    """One prompt -> answer sample per verified correction (`feedback_pairs`, source `correction`:
    the chosen text is the curator-approved or edited correction)."""
    if pairs.empty:
        return []
    rows = []
    for r in pairs[pairs["source"] == "correction"].itertuples(index=False):
        rows.append(
            dict(
                sample_id=sample_id("correction", r.pair_id),
                date=str(r.date),
                source="correction",
                phase="answer",
                headline_id=str(r.headline_id),
                prompt=r.prompt if isinstance(r.prompt, str) else json.dumps(r.prompt),
                prefix="",
                completion=str(r.chosen),
                teacher="people",
                why="verified correction",
            )
        )
    return rows


def confidence(scores: pd.DataFrame) -> pd.Series:
    """Per headline_id of the judged groups: best reward minus the median reward (usable groups only)."""
    usable = scores[scores["usable"]] if len(scores) else scores
    if usable.empty:
        return pd.Series(dtype=float)
    grouped = usable.groupby("headline_id")["reward"]
    return (grouped.max() - grouped.median()).sort_values(ascending=False, kind="stable")


def select_headlines(
    day: str,
    headlines: pd.DataFrame,
    scores: pd.DataFrame,
    prev_rollouts: pd.DataFrame,
    seed: int,
    fraction: float = RANDOM_FRACTION,
    confident: int = CONFIDENT_PER_DAY,
) -> list[dict]:
    """The headlines the teacher answers: `fraction` of D's at random (at least one), seeded by the
    day; plus the `confident` most confident judged groups (their headlines of D-1). Each a dict of
    date, headline_id, title, summary and why."""
    chosen: list[dict] = []
    if len(headlines):
        ids = sorted(headlines["headline_id"])
        rng = random.Random(f"{seed}|{day}|distill")
        k = max(1, round(fraction * len(ids)))
        picked = set(rng.sample(ids, min(k, len(ids))))
        for h in headlines.sort_values("headline_id").itertuples(index=False):
            if h.headline_id in picked:
                chosen.append(
                    dict(date=day, headline_id=h.headline_id, title=h.title, summary=h.summary, why="random 15%")
                )
    if len(scores) and len(prev_rollouts):
        titles = prev_rollouts.drop_duplicates("headline_id").set_index("headline_id")
        for headline_id, value in confidence(scores).head(confident).items():
            if headline_id in titles.index:
                row = titles.loc[headline_id]
                chosen.append(
                    dict(
                        date=str(row["date"]),
                        headline_id=headline_id,
                        title=row["title"],
                        summary=row["summary"],
                        why=f"confident judged group (best - median reward {value:.3f})",
                    )
                )
    return chosen


def teacher_samples(
    teacher_backend, teacher_name: str, day: str, picks: list[dict], seed: int, max_new_tokens: int
) -> list[dict]:
    """The teacher answers each pick once (thinking on: Qwen3's chat template opens a think block;
    a template without one ignores it), sampled at 0.7 with a seed per headline."""
    from outcome_flywheel.models.interface import SamplingConfig

    if not picks:
        return []
    prompts = [trading_note_messages(p["title"], p["summary"]) for p in picks]
    config = SamplingConfig(temperature=0.7, top_p=0.95, top_k=50, max_new_tokens=max_new_tokens, enable_thinking=True)
    seeds = [int(sample_id(seed, day, p["headline_id"]), 16) % (2**31 - 1) for p in picks]
    answers = teacher_backend.sample(prompts, 1, config, seeds)
    rows = []
    for pick, prompt, group in zip(picks, prompts, answers):
        rows += trace_samples(day, pick["headline_id"], prompt, group[0].text, teacher_name, pick["why"])
    return rows


def samples_frame(rows: list[dict]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=SAMPLE_COLUMNS)
    return frame.drop_duplicates("sample_id", keep="last").reset_index(drop=True)
