"""`policy_eval`: is the policy of day D better than the base model, on D's headlines?"""

import dagster as dg
import pandas as pd
from pydantic import Field

from assets.catalog import OWNERS, TABLE_KINDS, table_metadata
from assets.partitions import daily_rl_partitions
from outcome_flywheel.daily_rl.evaluation.ab import PREFERENCE_COLUMNS, evaluate_day, judge_preferences
from outcome_flywheel.daily_rl.evaluation.ab_stats import COLUMNS as COMPARISON_COLUMNS
from outcome_flywheel.daily_rl.evaluation.look_ahead import LookAheadInputs, look_ahead_days
from outcome_flywheel.daily_rl.judge.llm_judge import Judge
from outcome_flywheel.models.loader import ModelLoader
from outcome_flywheel.storage import Warehouse

POLICY_EVAL_COLUMNS = ["date", "status"] + COMPARISON_COLUMNS + ["policy_version", "look_ahead", "look_ahead_days"]


class LookAheadConfig(dg.Config):
    """Run config of `policy_eval` and `backtest`."""

    include_look_ahead: bool = Field(
        default=False,
        description=(
            "Keep notes whose policy was trained on headlines dated after the notes' day (override re-runs; "
            "outcome_flywheel.daily_rl.evaluation.look_ahead). Default false: those days are left out of the A/B and the back-test."
        ),
    )


@dg.asset(
    partitions_def=daily_rl_partitions,
    group_name="daily_rl",
    deps=["headlines", "rollouts", "baseline_rollouts", "rollout_outcomes"],
    pool="accelerator",
    kinds=TABLE_KINDS,
    owners=OWNERS,
    metadata=table_metadata("policy_eval", POLICY_EVAL_COLUMNS),
)
def policy_eval(
    context: dg.AssetExecutionContext,
    config: LookAheadConfig,
    warehouse: dg.ResourceParam[Warehouse],
    model_backend: dg.ResourceParam[ModelLoader],
    judge: dg.ResourceParam[Judge],
):
    """The policy of D against the frozen base on D's headlines (matched notes: same prompts and seeds),
    each with a 95% interval and a label (better / no detectable difference / worse / not enough data):
    structure score (paired t-test over D's headlines, per-headline means); judge preference (one matched
    pair per headline, shown in a seeded random order that is recorded in `policy_preferences`; win rate,
    exact binomial test vs 0.5, Clopper-Pearson interval; the judge sees D's related headlines, as D has no
    next day yet); over the matured calls of every day up to D, hit rate (vs_spy_pct > 0) and mean
    vs_spy_pct (t-test over entry sessions: one session's calls ride one market move); and the share of
    D's calls on the headline's company (`headline_company_share`, relevance.py; paired t-test over the
    headlines that name a known company, as for the structure score). Re-run with
    `rollout_outcomes` when pending calls mature. Look-ahead notes (a policy trained on headlines dated
    after its notes' day, rule in outcome_flywheel.daily_rl.evaluation.look_ahead) are left out, both sides of their
    day, unless run config `include_look_ahead`; each row says so (`look_ahead`, `look_ahead_days`)."""
    day = context.partition_key
    rollouts, baseline = warehouse.read("rollouts", day), warehouse.read("baseline_rollouts", day)
    if rollouts.empty or baseline.empty:
        raise dg.Failure(f"rollouts and baseline_rollouts of {day} must be materialised first")
    training = warehouse.read_all("policy_training")
    if look_ahead_days(rollouts, training) and not config.include_look_ahead:  # D's A/B is left out: nothing to judge
        preferences = pd.DataFrame(columns=PREFERENCE_COLUMNS)
    else:
        titles = list(warehouse.read("headlines", day).get("title", pd.Series(dtype=str)))
        judge_backend = judge.load(model_backend)
        preferences = judge_preferences(judge, judge_backend, rollouts, baseline, titles, model_backend.seed, day)
        del judge_backend
    outcomes = warehouse.read_all("rollout_outcomes")  # every day up to D: the outcome A/B is over sessions
    outcomes = outcomes[outcomes["date"] <= day] if len(outcomes) else outcomes
    version = str(rollouts["policy_version"].iloc[0])
    look = LookAheadInputs.of(rollouts, outcomes, training, config.include_look_ahead)
    if look.own_left_out:
        rollouts, baseline = rollouts.iloc[:0], baseline.iloc[:0]
    table = evaluate_day(rollouts, baseline, look.kept_outcomes(outcomes), preferences).assign(policy_version=version)
    table = look.flag_rows(table)
    table.insert(0, "date", day)
    table = table[POLICY_EVAL_COLUMNS]
    warehouse.write("policy_preferences", preferences, partition=day)
    warehouse.write("policy_eval", table, partition=day)
    return dg.MaterializeResult(metadata=eval_metadata(table, preferences, version))


def eval_metadata(table: pd.DataFrame, preferences: pd.DataFrame, version: str) -> dict:
    meta: dict = {
        "policy_version": version,
        "ab": dg.MetadataValue.md(eval_markdown(table)),
        "look_ahead": "; ".join(sorted({d for d in table["look_ahead_days"] if d})) or "none",
    }
    for r in table.itertuples(index=False):
        meta[f"{r.metric}_label"] = r.label
        for name in ("policy", "base", "difference"):
            value = float(getattr(r, name))
            if value == value:  # NaN left out: it breaks the plots
                meta[f"{r.metric}_{name}"] = round(value, 4)
    winners = preferences["winner"].value_counts().to_dict() if len(preferences) else {}
    meta["judge_pairs"] = dg.MetadataValue.json({k: int(v) for k, v in winners.items()})
    return meta


def eval_markdown(table: pd.DataFrame) -> str:
    """The A/B as a table a person reads: values, difference, interval, label, test, status."""

    def f(x) -> str:
        return "–" if x != x else f"{x:.3f}"

    rows = "".join(
        f"| {r.metric} | {f(r.policy)} | {f(r.base)} | {f(r.difference)} | [{f(r.ci_low)}, {f(r.ci_high)}] | {r.n} | "
        f"**{r.label}** | {r.test} | {r.status} |\n"
        for r in table.itertuples(index=False)
    )
    return (
        "Difference = policy - base; the interval is of the difference (for judge_win_rate: of the win rate, against 0.5).\n\n"
        "| metric | policy | base | difference | 95% interval | n | label | test | status |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n" + rows + look_ahead_markdown(table)
    )


def look_ahead_markdown(table: pd.DataFrame) -> str:
    """One line per metric whose inputs held look-ahead notes (left out or included); empty when none."""
    if "look_ahead_days" not in table:
        return ""
    lines = [
        f"- {r.metric}: look-ahead notes {r.look_ahead_days}" for r in table.itertuples(index=False) if r.look_ahead
    ]
    return (
        ("\n**Look-ahead** (a policy trained on headlines after its notes' day):\n" + "\n".join(lines) + "\n")
        if lines
        else ""
    )
