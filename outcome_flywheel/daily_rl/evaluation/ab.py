"""Is the policy of day D better than the base model? The A/B of `baseline_rollouts` and `policy_eval`.

- `baseline_rollouts(D)`: the frozen base model writes notes for D's headlines with the same prompts,
  group seeds, sampling settings and counts as `rollouts(D)`, so note (headline, k) of one is matched
  with note (headline, k) of the other: the only difference is the weights, and the system prompt where
  the prompt evolver gave the policy's note a variant (the baseline always has the base prompt).
- judge preference: for each headline one matched pair (the same k on both sides, k drawn from a
  seeded generator and recorded) goes to the judge as a group of two, in a seeded random order that
  is recorded; identical notes are a tie and are not asked. There is no next day yet when D is
  evaluated, so the judge sees D's own related headlines as context ("The day's news:").
- `policy_eval(D)`: structure score and judge win rate on D's headlines, and once the calls' prices
  have matured, hit rate (`vs_spy_pct > 0`) and mean `vs_spy_pct` over the matured calls of every
  day up to D, each with a 95% interval and a label (`ab_stats`). The unit is what is independent:
  for the structure score the headline (notes of one headline share a prompt, so per-headline means
  are compared, not 8x as many notes); for the calls' outcomes the entry session (one day's calls
  ride one market move and a few symbols, so D alone is one unit, never enough).
- the share of calls on the headline's company (`relevance`), policy vs base on D's headlines, with the
  structure score's test: whether a note names the headline's company is a property of its text, not of a
  market move, so the unit is the headline (headlines that name no company the alias map knows drop out).
"""

from __future__ import annotations

import json
import random

import pandas as pd

from outcome_flywheel.daily_rl.evaluation.ab_stats import (
    comparisons_frame,
    paired_comparison,
    per_headline_pairs,
    session_comparison,
    win_rate_comparison,
)
from outcome_flywheel.daily_rl.judge.ranking import JudgeGroup, select_outcome_headlines
from outcome_flywheel.daily_rl.notes.calls import calls_frame
from outcome_flywheel.daily_rl.notes.relevance import relevance_column
from outcome_flywheel.daily_rl.partitions import stable_seed
from outcome_flywheel.daily_rl.policy.rollouts import ROLLOUT_COLUMNS, ROLLOUT_SAMPLING, sample_rollouts
from outcome_flywheel.models.prompts import with_base_system

# The `policy_preferences` table's stored columns, in order: column -> (type, description) as the Dagster catalog
# shows them (assets/catalog.py reads them from here).
PREFERENCE_COLUMN_SCHEMA: dict[str, tuple[str, str]] = {
    "date": ("string", "Partition day D."),
    "headline_id": ("string", "The headline judged."),
    "rollout_index": ("int", "The matched pair shown (drawn with a seeded generator)."),
    "policy_shown_first": ("bool", "The policy's note was shown as A (the order is seeded random)."),
    "winner": ("string", "policy, base, tie (the notes read the same; not asked) or none (not answered)."),
    "reason": ("string", "Why there is no winner."),
    "judge_answers": ("string", "The judge's raw answers, JSON."),
    "context_shown": ("string", "D's related headlines shown as context, JSON."),
    "policy_version": ("string", "Checkpoint D's version."),
}
PREFERENCE_COLUMNS = list(PREFERENCE_COLUMN_SCHEMA)
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
        raise ValueError(
            f"rollouts were sampled at {sorted(temperatures)}, not the loop's {ROLLOUT_SAMPLING.temperature}: re-run their day"
        )
    groups = rollouts.sort_values(MATCH_KEYS).groupby("headline_id", sort=False)
    firsts = groups.first().reset_index()
    sizes = set(groups.size())
    budgets = set(int(m) for m in rollouts["max_new_tokens"])
    if len(sizes) != 1 or len(budgets) != 1:
        raise ValueError(
            f"rollouts of one day must have one group size and one token budget, got {sorted(sizes)} / {sorted(budgets)}"
        )
    prompts = [
        with_base_system(json.loads(p)) for p in firsts["prompt"]
    ]  # the base prompt, whatever variant the policy had
    seeds = [int(s) for s in firsts["seed"]]
    return sample_rollouts(
        base, firsts, prompts, seeds, str(firsts["date"].iloc[0]), sizes.pop(), budgets.pop(), base_version
    )


def matching_problems(rollouts: pd.DataFrame, baseline: pd.DataFrame) -> list[str]:
    """Why `baseline` is not matched note for note with `rollouts` (empty list: it is)."""
    if len(rollouts) != len(baseline):
        return [f"{len(baseline)} baseline notes for {len(rollouts)} rollouts"]
    rollouts = rollouts.assign(prompt=[json.dumps(with_base_system(json.loads(p))) for p in rollouts["prompt"]])
    merged = rollouts.merge(baseline, on=MATCH_KEYS, how="outer", suffixes=("", "_base"), indicator=True)
    problems = (
        [f"{(merged['_merge'] != 'both').sum()} notes without a twin"] if (merged["_merge"] != "both").any() else []
    )
    for name in MATCHED_FIELDS:
        differ = merged[merged["_merge"] == "both"]
        bad = differ[differ[name] != differ[f"{name}_base"]]
        if len(bad):
            problems.append(f"{len(bad)} pairs differ in {name}")
    return problems


def preference_groups(
    rollouts: pd.DataFrame, baseline: pd.DataFrame, day_titles: list[str], seed: int, day: str, context_k: int = 3
):
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
            date=day,
            headline_id=headline_id,
            rollout_index=int(row["rollout_index"]),
            policy_shown_first=policy_first,
            winner="",
            reason="",
            judge_answers="[]",
            context_shown=json.dumps(context),
            policy_version=str(row["policy_version"]),
        )
        if row["response"].strip() == row["response_base"].strip():
            record.update(winner="tie", reason="the two notes read the same")
        elif not context:
            record.update(winner="none", reason="no other headline of the day to show as context")
        else:
            notes = [row["response"], row["response_base"]] if policy_first else [row["response_base"], row["response"]]
            groups.append(
                (
                    len(records),
                    JudgeGroup(
                        row["title"],
                        context,
                        notes,
                        stable_seed(seed, day, headline_id, "ab-judge"),
                        DAY_CONTEXT_HEADING,
                    ),
                )
            )
        records.append(record)
    return groups, records


def judge_preferences(
    judge, backend, rollouts: pd.DataFrame, baseline: pd.DataFrame, day_titles: list[str], seed: int, day: str
) -> pd.DataFrame:
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


def sessions_of(outcomes: pd.DataFrame) -> pd.DataFrame:
    """Outcome rows with `session` = their entry session (the prediction day where there is none) and `headline_id`
    made unique across days (a weekend's three days enter at one session; each day's headline is its own pair)."""
    out = outcomes.copy()
    entry = (
        out["entry_date"].astype("string")
        if "entry_date" in out.columns
        else pd.Series(pd.NA, index=out.index, dtype="string")
    )
    out["session"] = entry.where(entry.notna() & (entry != ""), out["date"].astype("string")).astype(str)
    out["headline_id"] = out["date"].astype(str) + "|" + out["headline_id"].astype(str)
    return out


def outcome_horizon(outcomes: pd.DataFrame) -> int:
    """Sessions a matured call is held (the most common `horizon_sessions`; 1 when absent)."""
    if "horizon_sessions" not in outcomes.columns or outcomes.empty:
        return 1
    h = pd.to_numeric(outcomes.loc[outcomes["status"] == "matured", "horizon_sessions"], errors="coerce").dropna()
    return int(h.mode().iloc[0]) if len(h) else 1


OUTCOME_TESTS = (
    ("hit_rate", "hit", "per-session mean of per-headline shares of matured calls with vs_spy_pct > 0"),
    ("mean_vs_spy_pct", "vs_spy_pct", "per-session mean of per-headline mean vs_spy_pct of matured calls, net of cost"),
)


SHARE_METRIC = "headline_company_share"
SHARE_TEST = (
    "paired t-test over headlines that name a known company (per-headline share of notes whose call is "
    "on the headline's company)"
)


RELEVANCE_COLUMNS = ("response", "title")


def with_relevance(notes: pd.DataFrame) -> pd.DataFrame:
    """`notes` with `relevance` (relevance.relevance_column): 1.0 when the note's call is on a company its headline is
    about, 0.0 when it is on another or the note makes no call (no side, no_trade, unparseable), NaN when the headline
    names no known company. Only a parsed call counts: a note that names the company but takes no side is 0.
    The notes need `response` (the text the call is read from) and `title` (`summary` may be absent)."""
    if notes.empty:
        return notes.assign(relevance=pd.Series(dtype=float))
    missing = [c for c in RELEVANCE_COLUMNS if c not in notes.columns]
    if missing:
        raise ValueError(
            f"the share of calls on the headline's company needs the notes' columns {missing}; "
            f"the notes have {list(notes.columns)}"
        )
    text = notes[["response"]].assign(title=notes.get("title"), summary=notes.get("summary"))
    return notes.assign(relevance=relevance_column(calls_frame(text)))


def evaluate_day(
    rollouts: pd.DataFrame,
    baseline: pd.DataFrame,
    outcomes: pd.DataFrame,
    preferences: pd.DataFrame,
    day: str | None = None,
) -> pd.DataFrame:
    """The five comparisons of policy vs base (rows of `policy_eval`), with each one's status. The structure score,
    the judge and the share of calls on the headline's company are D's; `outcomes` holds the calls of every day up to D (D = `day`, else rollouts' date), and
    the outcome metrics compare them session by session (the status says how far D's own calls have matured)."""
    comparisons, status = [], {}
    policy, base = per_headline_pairs(rollouts, baseline, "structure_score")
    comparisons.append(
        paired_comparison(
            "structure_score",
            policy,
            base,
            test_name="paired t-test over headlines (per-headline mean structure score)",
        )
    )
    status["structure_score"] = "complete"
    counts = preferences["winner"].value_counts() if len(preferences) else pd.Series(dtype=int)
    comparisons.append(
        win_rate_comparison(
            "judge_win_rate", int(counts.get("policy", 0)), int(counts.get("base", 0)), int(counts.get("tie", 0))
        )
    )
    status["judge_win_rate"] = f"{int(counts.get('none', 0))} unanswered" if counts.get("none", 0) else "complete"
    if day is None and len(rollouts):
        day = str(rollouts["date"].iloc[0])
    policy, base = per_headline_pairs(with_relevance(rollouts), with_relevance(baseline), "relevance")
    share = paired_comparison(SHARE_METRIC, policy, base, test_name=SHARE_TEST)
    calls = outcomes[outcomes["status"] != "no_call"] if len(outcomes) else outcomes
    matured = calls[calls["status"] == "matured"] if len(calls) else calls
    if len(matured):
        matured = sessions_of(matured).assign(hit=lambda f: (f["vs_spy_pct"] > 0).astype(float))
    horizon = outcome_horizon(matured)
    for metric, value, what in OUTCOME_TESTS:
        sides = [
            _side(matured, s) if len(matured) else pd.DataFrame(columns=["session", "headline_id", value])
            for s in ("policy", "base")
        ]
        test = f"t-test over entry sessions up to {day} ({what})"
        comparisons.append(session_comparison(metric, sides[0], sides[1], value, horizon, test_name=test))
        own = calls[calls["date"].astype(str) == str(day)] if len(calls) and day is not None else calls
        status[metric] = _maturity(own)
    comparisons.append(share)  # last: the rows before it keep their places for readers that index them
    status[SHARE_METRIC] = "complete"
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
