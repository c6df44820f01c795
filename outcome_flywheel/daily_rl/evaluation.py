"""Is the policy of day D better than the base model? The A/B of `baseline_rollouts` and `policy_eval`.

- `baseline_rollouts(D)`: the frozen base model writes notes for D's headlines with the same prompts,
  group seeds, sampling settings and counts as `rollouts(D)`, so note (headline, k) of one is matched
  with note (headline, k) of the other: the only difference is the weights.
- judge preference: for each headline one matched pair (the same k on both sides, k drawn from a
  seeded generator and recorded) goes to the judge as a group of two, in a seeded random order that
  is recorded; identical notes are a tie and are not asked. There is no next day yet when D is
  evaluated, so the judge sees D's own related headlines as context ("The day's news:").
- `policy_eval(D)`: structure score, judge win rate, and once the calls' prices have matured, hit
  rate (`vs_spy_pct > 0`) and mean `vs_spy_pct`, each with a 95% interval and a label
  (`ab_stats`). The unit of pairing is the headline: notes of one headline share a prompt and are
  not independent, so per-headline means are compared (paired t-test), not 8x as many notes.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pandas as pd

from outcome_flywheel.daily_rl.ab_stats import comparisons_frame, paired_comparison, per_headline_pairs, win_rate_comparison
from outcome_flywheel.daily_rl.judging import JudgeGroup, select_outcome_headlines, stable_seed
from outcome_flywheel.daily_rl.loop import ROLLOUT_COLUMNS, ROLLOUT_SAMPLING, sample_rollouts

PREFERENCE_COLUMNS = [
    "date", "headline_id", "rollout_index", "policy_shown_first", "winner", "reason", "judge_answers", "context_shown",
    "policy_version",
]
MATCH_KEYS = ["headline_id", "rollout_index"]
# What must be equal between a note and its baseline twin for the pair to be matched.
MATCHED_FIELDS = ["prompt", "seed", "temperature", "max_new_tokens"]
DAY_CONTEXT_HEADING = "The day's news:"


def baseline_rollouts(base, rollouts: pd.DataFrame, base_version: str) -> pd.DataFrame:
    """The base model's notes for the prompts of `rollouts`, with the same group seeds, sampling
    settings and number of notes per headline (`base` is a loaded `ModelBackend`)."""
    if rollouts.empty:
        return pd.DataFrame(columns=ROLLOUT_COLUMNS)
    temperatures = set(float(t) for t in rollouts["temperature"])
    if temperatures != {ROLLOUT_SAMPLING.temperature}:
        raise ValueError(f"rollouts were sampled at {sorted(temperatures)}, not the loop's {ROLLOUT_SAMPLING.temperature}: re-run their day")
    groups = rollouts.sort_values(MATCH_KEYS).groupby("headline_id", sort=False)
    firsts = groups.first().reset_index()
    sizes = set(groups.size())
    budgets = set(int(m) for m in rollouts["max_new_tokens"])
    if len(sizes) != 1 or len(budgets) != 1:
        raise ValueError(f"rollouts of one day must have one group size and one token budget, got {sorted(sizes)} / {sorted(budgets)}")
    prompts = [json.loads(p) for p in firsts["prompt"]]
    seeds = [int(s) for s in firsts["seed"]]
    return sample_rollouts(base, firsts, prompts, seeds, str(firsts["date"].iloc[0]), sizes.pop(), budgets.pop(), base_version)


def matching_problems(rollouts: pd.DataFrame, baseline: pd.DataFrame) -> list[str]:
    """Why `baseline` is not matched note for note with `rollouts` (empty list: it is)."""
    if len(rollouts) != len(baseline):
        return [f"{len(baseline)} baseline notes for {len(rollouts)} rollouts"]
    merged = rollouts.merge(baseline, on=MATCH_KEYS, how="outer", suffixes=("", "_base"), indicator=True)
    problems = [f"{(merged['_merge'] != 'both').sum()} notes without a twin"] if (merged["_merge"] != "both").any() else []
    for name in MATCHED_FIELDS:
        differ = merged[merged["_merge"] == "both"]
        bad = differ[differ[name] != differ[f"{name}_base"]]
        if len(bad):
            problems.append(f"{len(bad)} pairs differ in {name}")
    return problems


def preference_groups(rollouts: pd.DataFrame, baseline: pd.DataFrame, day_titles: list[str], seed: int, day: str, context_k: int = 3):
    """(judge groups, one record per headline): the matched pair of each headline, policy note and base
    note in a seeded random order; identical pairs are recorded as ties and get no group."""
    merged = rollouts.merge(baseline[MATCH_KEYS + ["response"]], on=MATCH_KEYS, suffixes=("", "_base"))
    groups, records = [], []
    for headline_id, frame in merged.groupby("headline_id", sort=True):
        frame = frame.sort_values("rollout_index")
        rng = random.Random(stable_seed(seed, day, headline_id, "ab-pair"))
        row = frame.iloc[rng.randrange(len(frame))]
        policy_first = rng.random() < 0.5
        others = [t for t in day_titles if t != row["title"]]
        context = select_outcome_headlines(row["title"], others, context_k)
        record = dict(
            date=day, headline_id=headline_id, rollout_index=int(row["rollout_index"]), policy_shown_first=policy_first,
            winner="", reason="", judge_answers="[]", context_shown=json.dumps(context), policy_version=str(row["policy_version"]),
        )
        if row["response"].strip() == row["response_base"].strip():
            record.update(winner="tie", reason="the two notes read the same")
        elif not context:
            record.update(winner="none", reason="no other headline of the day to show as context")
        else:
            notes = [row["response"], row["response_base"]] if policy_first else [row["response_base"], row["response"]]
            groups.append((len(records), JudgeGroup(row["title"], context, notes, stable_seed(seed, day, headline_id, "ab-judge"), DAY_CONTEXT_HEADING)))
        records.append(record)
    return groups, records


def judge_preferences(judge, backend, rollouts: pd.DataFrame, baseline: pd.DataFrame, day_titles: list[str], seed: int, day: str) -> pd.DataFrame:
    """The judge's pick of each headline's matched pair (`judge` a `Judge`, `backend` its loaded model).
    The judge is asked with the two notes in the recorded order (its own shuffle is off: one order, recorded)."""
    if rollouts.empty or baseline.empty:
        return pd.DataFrame(columns=PREFERENCE_COLUMNS)
    groups, records = preference_groups(rollouts, baseline, day_titles, seed, day, judge.outcome_headlines_shown)
    if groups:
        judgements = judge.rank(backend, [g for _, g in groups], shuffle=False)
        for (i, _), judgement in zip(groups, judgements):
            policy_slot = 0 if records[i]["policy_shown_first"] else 1
            records[i]["judge_answers"] = json.dumps(judgement.answers)
            if judgement.rounds_answered == 0:
                records[i].update(winner="none", reason=judgement.unusable_reason or "judge never answered")
            else:
                records[i]["winner"] = "policy" if judgement.picks[0] == policy_slot else "base"
    return pd.DataFrame(records, columns=PREFERENCE_COLUMNS)


def _side(frame: pd.DataFrame, source: str) -> pd.DataFrame:
    return frame[frame["source"] == source]


def evaluate_day(rollouts: pd.DataFrame, baseline: pd.DataFrame, outcomes: pd.DataFrame, preferences: pd.DataFrame) -> pd.DataFrame:
    """The four comparisons of policy vs base for one day (rows of `policy_eval`), with each one's status."""
    comparisons, status = [], {}
    policy, base = per_headline_pairs(rollouts, baseline, "structure_score")
    comparisons.append(paired_comparison("structure_score", policy, base, test_name="paired t-test over headlines (per-headline mean structure score)"))
    status["structure_score"] = "complete"
    counts = preferences["winner"].value_counts() if len(preferences) else pd.Series(dtype=int)
    comparisons.append(win_rate_comparison("judge_win_rate", int(counts.get("policy", 0)), int(counts.get("base", 0)), int(counts.get("tie", 0))))
    status["judge_win_rate"] = f"{int(counts.get('none', 0))} unanswered" if counts.get("none", 0) else "complete"
    calls = outcomes[outcomes["status"] != "no_call"] if len(outcomes) else outcomes
    matured = calls[calls["status"] == "matured"].assign(hit=lambda f: (f["vs_spy_pct"] > 0).astype(float)) if len(calls) else calls
    for metric, value, test in (
        ("hit_rate", "hit", "paired t-test over headlines (per-headline share of matured calls with vs_spy_pct > 0)"),
        ("mean_vs_spy_pct", "vs_spy_pct", "paired t-test over headlines (per-headline mean vs_spy_pct of matured calls, net of cost)"),
    ):
        if len(matured):
            p, b = per_headline_pairs(_side(matured, "policy"), _side(matured, "base"), value)
        else:
            p, b = np.array([]), np.array([])
        comparisons.append(paired_comparison(metric, p, b, test_name=test))
        status[metric] = _maturity(calls)
    frame = comparisons_frame(comparisons)
    frame.insert(0, "status", frame["metric"].map(status))
    return frame


def _maturity(calls: pd.DataFrame) -> str:
    if calls.empty:
        return "no calls"
    counts = calls["status"].value_counts()
    matured, pending = int(counts.get("matured", 0)), int(counts.get("pending", 0))
    if pending == 0:
        return f"matured ({matured} of {len(calls)} calls; the rest no_data)" if matured < len(calls) else "matured"
    return f"pending ({matured} of {len(calls)} calls matured)"
