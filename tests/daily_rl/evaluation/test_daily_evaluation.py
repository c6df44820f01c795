"""The daily loop's evaluation, materialised in-process on tiny-local: the gate rejecting a destructive
update (and the next day going on), matched baseline rollouts, call outcomes that mature on re-run,
the A/B, the back-test, best-vs-worst pairs with exports, and the reward's run config."""

import json
from datetime import datetime, timezone

import dagster as dg
import pandas as pd
import pytest

from assets.daily_rl.daily_update import daily_update
from assets.daily_rl.outcomes import rollout_outcomes
from outcome_flywheel.daily_rl.evaluation.ab import evaluate_day, judge_preferences
from outcome_flywheel.daily_rl.judge.ranking import GroupJudgement
from outcome_flywheel.market_data import BUNDLED_PRICES
from pipelines.daily_rl import DAILY_RL_ASSETS, daily_rl_outcomes_schedule
from tests.daily_fixtures import daily_resources, linked_data_dir

DAYS = ["2025-11-05", "2025-11-06", "2025-11-07"]  # Wed, Thu, Fri: the Friday's calls exit across the weekend
SMALL = {"rollouts_per_headline": 4, "max_new_tokens": 40, "batch_size": 8}
DESTRUCTIVE = {**SMALL, "learning_rate": 5.0}


def _run(res, day, update_config=SMALL, assets=tuple(DAILY_RL_ASSETS), **kwargs):
    config = {"ops": {"daily_update": {"config": update_config}}} if daily_update in assets else {}
    return dg.materialize(list(assets), partition_key=day, resources=res, run_config=config, **kwargs)


@pytest.fixture(scope="module")
def days(tmp_path_factory, tiny_model_dir):
    """Three days in order; the second trains with a learning rate of 5 (the gate must refuse it)."""
    root = linked_data_dir(tmp_path_factory.mktemp("evaluation"), tiny_model_dir)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLYWHEEL_DATA_DIR", str(root))
        res = daily_resources(root)
        results = {day: _run(res, day, DESTRUCTIVE if day == DAYS[1] else SMALL) for day in DAYS}
        yield root, res, results


def _checkpoint(root, day) -> dict:
    return json.loads((root / "checkpoints" / "policy" / day / "checkpoint.json").read_text())


def test_gate_rejects_a_destructive_update_and_the_next_day_runs(days):
    root, res, results = days
    wh = res["warehouse"]
    assert all(r.success for r in results.values())
    rejected = wh.read("policy_training", DAYS[1]).iloc[0]
    assert rejected["trained"] and rejected["gate"] == "rejected", rejected["gate_reason"]
    assert rejected["gate_reason"]
    parent, day2 = _checkpoint(root, DAYS[0]), _checkpoint(root, DAYS[1])
    # the parent's weights stay: same version, same files, and D's rollouts come from them
    assert day2["policy_version"] == parent["policy_version"] and day2["gate"] == "rejected" and day2["verified"]
    assert set(wh.read("rollouts", DAYS[1])["policy_version"]) == {parent["policy_version"]}
    gate_check = [
        e for e in results[DAYS[1]].get_asset_check_evaluations() if e.check_name == "update_accepted_by_gate"
    ]
    assert len(gate_check) == 1 and not gate_check[0].passed
    assert gate_check[0].severity == dg.AssetCheckSeverity.WARN
    # the next day trains from the kept weights with a sane learning rate and is gated again
    day3 = wh.read("policy_training", DAYS[2]).iloc[0]
    assert day3["parent_version"] == parent["policy_version"]
    assert day3["gate"] in ("accepted", "not_trained")
    if day3["gate"] == "accepted":
        assert day3["gate_kl_to_parent"] <= 0.25


def test_baseline_rollouts_share_prompts_and_seeds_with_rollouts(days):
    root, res, results = days
    wh = res["warehouse"]
    for day in DAYS:
        rollouts, baseline = wh.read("rollouts", day), wh.read("baseline_rollouts", day)
        merged = rollouts.merge(
            baseline, on=["headline_id", "rollout_index"], suffixes=("", "_base"), validate="one_to_one"
        )
        assert len(merged) == len(rollouts) == len(baseline) == 12
        for column in ("prompt", "seed", "temperature", "max_new_tokens"):
            assert (merged[column] == merged[f"{column}_base"]).all(), column
        assert set(baseline["policy_version"]) == {"base:tiny-local"}
    # the first two days' policy is the base model's weights: same prompts and seeds give the same notes
    for day in DAYS[:2]:
        merged = wh.read("rollouts", day).merge(
            wh.read("baseline_rollouts", day), on=["headline_id", "rollout_index"], suffixes=("", "_base")
        )
        assert (merged["response"] == merged["response_base"]).all()
        assert (merged["response_ids"].map(list) == merged["response_ids_base"].map(list)).all()


def test_outcomes_follow_the_xnys_windows_and_the_formula(days):
    root, res, _ = days
    wh = res["warehouse"]
    prices = pd.read_csv(BUNDLED_PRICES).set_index(["date", "symbol"])["close"]
    expected_windows = {"2025-11-05": ("2025-11-06", "2025-11-07"), "2025-11-07": ("2025-11-10", "2025-11-11")}
    for day, (entry, exit_) in expected_windows.items():
        outcomes = wh.read("rollout_outcomes", day)
        assert set(outcomes["source"]) == {"policy", "base"} and len(outcomes) == 24
        matured = outcomes[outcomes["status"] == "matured"]
        assert len(matured) > 0 and set(matured["entry_date"]) == {entry} and set(matured["exit_date"]) == {exit_}
        for r in matured.itertuples():
            s = 1.0 if r.side == "long" else -1.0
            move = prices[(exit_, r.symbol)] / prices[(entry, r.symbol)] - 1
            spy = prices[(exit_, "SPY")] / prices[(entry, "SPY")] - 1
            assert r.return_pct == pytest.approx(100 * s * move - 0.1)
            assert r.vs_spy_pct == pytest.approx(100 * s * (move - spy) - 0.1)
        # nothing invented: a row without a usable call has no return
        assert outcomes.loc[outcomes["status"] != "matured", "return_pct"].isna().all()


def test_a_pending_call_matures_on_rerun(days, tmp_path):
    root, res, _ = days
    day = DAYS[2]  # exits 2025-11-11: prices that end on 2025-11-10 leave it pending
    short = pd.read_csv(BUNDLED_PRICES)
    short = short[short["date"] <= "2025-11-10"]
    short_file = tmp_path / "short.csv"
    short.to_csv(short_file, index=False)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLYWHEEL_DATA_DIR", str(root))
        early = daily_resources(root, prices_file=str(short_file))
        assert dg.materialize([rollout_outcomes], partition_key=day, resources=early).success
        pending = res["warehouse"].read("rollout_outcomes", day)
        calls = pending[pending["status"] != "no_call"]
        assert len(calls) and (calls["status"] == "pending").all()
        assert "2025-11-10" in calls["reason"].iloc[0]
        # the schedule asks for this day again once the exit session has closed
        context = dg.build_schedule_context(
            scheduled_execution_time=datetime(2025, 11, 12, 22, 30, tzinfo=timezone.utc)
        )
        requests = daily_rl_outcomes_schedule(context, warehouse=res["warehouse"])
        assert [r.partition_key for r in requests] == [day]
        assert dg.materialize([rollout_outcomes], partition_key=day, resources=res).success
    matured = res["warehouse"].read("rollout_outcomes", day)
    assert len(matured) == len(pending)
    assert (matured.loc[matured["status"] != "no_call", "status"] == "matured").all()


def test_policy_eval_and_backtest_label_what_they_measure(days):
    root, res, _ = days
    wh = res["warehouse"]
    evals = wh.read("policy_eval", DAYS[0])
    assert list(evals["metric"]) == [
        "structure_score",
        "judge_win_rate",
        "hit_rate",
        "mean_vs_spy_pct",
        "headline_company_share",
    ]
    # the policy of the first day is the base: no difference anywhere, and the labels say so
    base_day = evals.set_index("metric")
    assert base_day.loc["structure_score", "difference"] == 0.0
    assert base_day.loc["structure_score", "label"] == "not enough data"  # 3 headlines: below the 6 pairs needed
    assert base_day.loc["judge_win_rate", "label"] == "not enough data"  # every pair is a tie
    share = base_day.loc["headline_company_share"]  # same notes on both sides: the same share
    assert share["policy"] == share["base"] or (share["n"] == 0 and share["policy"] != share["policy"])
    assert (wh.read("policy_preferences", DAYS[0])["winner"] == "tie").all()
    assert set(evals["label"]) <= {"better", "no detectable difference", "worse", "not enough data"}
    summary = wh.read("backtest_summary", DAYS[2]).iloc[0]
    assert summary["days"] == 3
    assert summary["label_vs_base"] == "not enough data"  # 3 books: below the 10 an interval needs
    # the outcome A/B of the last day pools the sessions up to it: 3, still not enough
    last = wh.read("policy_eval", DAYS[2]).set_index("metric")
    assert last.loc["mean_vs_spy_pct", "n"] == 3 and last.loc["mean_vs_spy_pct", "label"] == "not enough data"
    books = wh.read_all("backtest")  # one row per entry session: Thu 11-06, Fri 11-07, Mon 11-10
    assert list(books["date"]) == ["2025-11-06", "2025-11-07", "2025-11-10"] and list(books["date"]) == list(
        books["entry_date"]
    )
    report = wh.read("daily_report", DAYS[2]).iloc[0]
    assert report["gate"] in ("accepted", "not_trained")
    assert (root / "reports" / "daily_rl" / DAYS[2] / "equity.png").read_bytes()[:4] == b"\x89PNG"
    assert (root / "reports" / "daily_rl" / DAYS[2] / "ab.png").read_bytes()[:4] == b"\x89PNG"


def test_rollout_pairs_are_exported_with_their_sidecar(days):
    root, res, _ = days
    wh = res["warehouse"]
    for day in DAYS[1:]:
        pairs, none = wh.read("rollout_pairs", day), wh.read("rollout_no_contrast", day)
        scores = wh.read("rollout_scores", day)
        assert len(pairs) + len(none) == scores["headline_id"].nunique()
        assert (pairs["reward_gap"] >= 0.3).all()
        folder = root / "exports" / "rollout_pairs" / day
        meta = json.loads((folder / "pairs.meta.json").read_text())
        assert meta["rows"] == len(pairs)
        for fmt in ("trl", "nemo_rl", "openai"):
            lines = (folder / f"{fmt}.jsonl").read_text().splitlines()
            assert len(lines) == len(pairs)
        for line, pair in zip((folder / "trl.jsonl").read_text().splitlines(), meta["pairs"]):
            row = json.loads(line)
            chosen = pairs.set_index("pair_id").loc[pair["pair_id"]]
            assert (
                row["chosen"][0]["content"] == chosen["chosen"] and pair["policy_version"] == chosen["policy_version"]
            )


def test_reward_weights_are_run_config_and_recorded(days):
    root, res, _ = days
    wh = res["warehouse"]
    # price stays weighted: the immediate reward leaves it out, and DAYS[2]'s price step stays as the report test reads it
    config = {**SMALL, "reward_weights": {"structure": 1.0, "price": 0.5}, "reward_clip_max": 0.9}
    assert _run(res, DAYS[2], config).success
    scores = wh.read("rollout_scores", DAYS[2])
    assert (scores["reward"] == scores["structure_score"].clip(upper=0.9)).all()
    assert set(scores["reward_weights"]) == {json.dumps({"price": 0.5, "structure": 1.0})} and set(
        scores["reward_clip"]
    ) == {"[0.0, 0.9]"}
    bad = _run(res, DAYS[2], {**SMALL, "reward_weights": {"profit": 1.0}}, raise_on_error=False)
    assert not bad.success
    failure = [e for e in bad.all_events if e.is_step_failure][0]
    assert "unknown reward signal" in str(failure.event_specific_data.error)


class _PickingJudge:
    """A judge that always picks the note containing `favourite` (the policy's note says POLICY, the base's BASE)."""

    outcome_headlines_shown = 3

    def __init__(self, favourite: str):
        self.favourite = favourite
        self.shown_first: list[str] = []

    def rank(self, backend, groups, shuffle=True):
        out = []
        for g in groups:
            self.shown_first.append(g.candidates[0])
            best = next(i for i, note in enumerate(g.candidates) if self.favourite in note)
            out.append(
                GroupJudgement(
                    ranks=[1, 2] if best == 0 else [2, 1],
                    picks=[best, 1 - best],
                    rounds_answered=1,
                    answers=["A" if best == 0 else "B"],
                )
            )
        return out


def _notes(side: str, n: int = 12) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "date": "2025-11-05",
            "headline_id": [f"h{i:02d}" for i in range(n)],
            "rollout_index": 0,
            "title": [f"Headline {i} about company {i}" for i in range(n)],
            "response": [f"{side} note {i}" for i in range(n)],
            "policy_version": "v1" if side == "POLICY" else "base",
        }
    )


@pytest.mark.parametrize("favourite, winner", [("POLICY", "policy"), ("BASE", "base")])
def test_the_judges_pick_is_mapped_to_the_right_side(favourite, winner):
    """The judge sees the pair in a seeded order; its pick (a slot) must come back as the side that wrote the note,
    whichever slot the policy had (swap the slot mapping and every headline shown the other way is misread)."""
    rollouts, baseline = _notes("POLICY"), _notes("BASE")
    judge = _PickingJudge(favourite)
    prefs = judge_preferences(judge, None, rollouts, baseline, list(rollouts["title"]), seed=3, day="2025-11-05")
    assert len(prefs) == 12 and (prefs["winner"] == winner).all()
    # both orders occurred, and the recorded order is the one the judge saw
    assert prefs["policy_shown_first"].nunique() == 2
    assert [first.startswith("POLICY") for first in judge.shown_first] == prefs["policy_shown_first"].tolist()
    evals = evaluate_day(
        rollouts.assign(structure_score=0.5),
        baseline.assign(structure_score=0.5),
        pd.DataFrame(columns=["date", "source", "status"]),
        prefs,
    ).set_index("metric")
    assert evals.loc["judge_win_rate", "policy"] == (1.0 if winner == "policy" else 0.0)
    assert evals.loc["judge_win_rate", "label"] == ("better" if winner == "policy" else "worse")


def _outcome_rows(days: int, policy_move, base_move) -> pd.DataFrame:
    rows = []
    for d in range(days):
        date = f"2025-10-{d + 1:02d}"
        for source, move in (("policy", policy_move), ("base", base_move)):
            for h in range(16):
                rows.append(
                    dict(
                        date=date,
                        source=source,
                        headline_id=f"h{h}",
                        rollout_index=0,
                        status="matured",
                        entry_date=date,
                        exit_date=date,
                        horizon_sessions=1,
                        vs_spy_pct=move(d, h),
                    )
                )
    return pd.DataFrame(rows)


def test_two_symbols_on_one_day_are_one_session_not_sixteen_headlines():
    """The issue: one day, the policy long one symbol and the base another, every headline alike: the paired test over
    headlines said "better" (p = 0.007). The day is one session: "not enough data"."""
    outcomes = _outcome_rows(1, lambda d, h: 1.2 + 0.01 * h, lambda d, h: -0.8 + 0.01 * (h % 3))
    notes = _notes("POLICY").assign(structure_score=0.5)
    evals = evaluate_day(notes, notes, outcomes, pd.DataFrame(columns=["winner"]), day="2025-10-01").set_index("metric")
    for metric in ("hit_rate", "mean_vs_spy_pct"):
        assert evals.loc[metric, "n"] == 1 and evals.loc[metric, "label"] == "not enough data", metric
        assert evals.loc[metric, "status"] == "matured"
    assert evals.loc["mean_vs_spy_pct", "difference"] == pytest.approx(2.0 + 0.01 * (7.5 - 1.0), abs=0.01)


def test_outcome_metrics_pool_the_sessions_up_to_the_day():
    """Over 12 sessions a consistent edge is found; the unit is the session (n = 12), not the 192 headlines."""
    outcomes = _outcome_rows(12, lambda d, h: 0.5 + 0.3 * ((d * 7) % 5) + 0.01 * h, lambda d, h: 0.1 * ((d * 3) % 4))
    notes = _notes("POLICY").assign(structure_score=0.5)
    evals = evaluate_day(notes, notes, outcomes, pd.DataFrame(columns=["winner"]), day="2025-10-12").set_index("metric")
    row = evals.loc["mean_vs_spy_pct"]
    assert row["n"] == 12 and row["label"] == "better" and row["ci_low"] > 0
    assert "entry sessions up to 2025-10-12" in row["test"]
    assert evals.loc["hit_rate", "label"] in ("better", "no detectable difference")


_COMPANIES = (
    ("Apple", "AAPL"),
    ("Nvidia", "NVDA"),
    ("Boeing", "BA"),
    ("Pfizer", "PFE"),
    ("Intel", "INTC"),
    ("Netflix", "NFLX"),
    ("Oracle", "ORCL"),
    ("Chevron", "CVX"),
)


def _company_notes(on_company, per_headline: int = 4) -> pd.DataFrame:
    """Notes on 8 headlines that each name one company, plus one headline that names none; `on_company(i, k)`: note
    k of headline i buys the headline's company (else Exxon, or no call at all when it returns None)."""
    rows = []
    for i, (name, ticker) in enumerate(_COMPANIES + (("", ""),)):
        title = f"{name} shares jump after earnings" if name else "Markets wait for the Fed"
        for k in range(per_headline):
            on = on_company(i, k)
            text = (
                "Trade Recommendation: no trade today."
                if on is None
                else f"Trade Recommendation: Buy {ticker if on and ticker else 'XOM'}."
            )
            rows.append(
                dict(
                    date="2025-11-05",
                    headline_id=f"h{i}",
                    rollout_index=k,
                    title=title,
                    summary="",
                    response=text + "\nTimeframe: 1 day",
                    structure_score=0.5,
                )
            )
    return pd.DataFrame(rows)


def _share(policy: pd.DataFrame, base: pd.DataFrame) -> pd.Series:
    no_outcomes = pd.DataFrame(columns=["date", "source", "status"])
    return (
        evaluate_day(policy, base, no_outcomes, pd.DataFrame(columns=["winner"]), day="2025-11-05")
        .set_index("metric")
        .loc["headline_company_share"]
    )


def test_the_share_of_calls_on_the_headlines_company_has_an_interval_that_agrees_with_its_label():
    """Policy: 3 of 4 notes per headline buy the headline's company; base: 1 in 8 (the others buy Exxon or make no call).
    The headline that names no company drops out (n = 8 headlines, not 9 and not 32 notes)."""
    from outcome_flywheel.daily_rl.evaluation.ab_stats import label_for

    policy = _company_notes(lambda i, k: k < 3)
    base = _company_notes(lambda i, k: True if (k == 0 and i % 2 == 0) else (None if k == 1 else False))
    row = _share(policy, base)
    assert row["policy"] == pytest.approx(0.75) and row["base"] == pytest.approx(0.125) and row["n"] == 8
    assert row["difference"] == pytest.approx(0.625) and row["ci_low"] < 0.625 < row["ci_high"]
    assert row["ci_low"] > 0 and row["label"] == "better" == label_for(row["ci_low"], row["ci_high"])
    assert row["status"] == "complete" and "headline" in row["test"]
    # the other way round the label flips with the interval
    worse = _share(base, policy)
    assert worse["ci_high"] < 0 and worse["label"] == "worse" == label_for(worse["ci_low"], worse["ci_high"])
    # a noisy difference: the label is what the stored interval says
    mixed = _share(_company_notes(lambda i, k: (i + k) % 2 == 0), _company_notes(lambda i, k: (i * k) % 3 == 0))
    assert (
        mixed["label"] == label_for(mixed["ci_low"], mixed["ci_high"])
        and mixed["ci_low"] <= mixed["difference"] <= mixed["ci_high"]
    )


def test_the_share_needs_headlines_that_name_a_company():
    """Headlines that name no company the alias map knows give no share (not a 0): too few -> not enough data."""
    few = _company_notes(lambda i, k: True).query("headline_id in ['h0', 'h1', 'h8']")
    row = _share(few, few.assign(response="Trade Recommendation: Buy XOM."))
    assert row["n"] == 2 and row["label"] == "not enough data" and row["ci_low"] != row["ci_low"]
    assert row["policy"] == 1.0 and row["base"] == 0.0


def test_the_report_of_a_real_run_shows_the_price_step_and_the_hit_rates(days):
    """On the three days run above: the Friday's report holds the price step of that day as `price_training`
    recorded it (the Wednesday's notes matured on Friday), the hit rate of the Wednesday's calls as
    `rollout_outcomes` gives it, and the curves inline; the bundled real prices are named as such."""
    root, res, results = days
    wh = res["warehouse"]
    report = results[DAYS[2]].asset_materializations_for_node("daily_report")[0].metadata["report"].value
    price = wh.read("price_training", DAYS[2])
    assert len(price) == 1 and price["price_notes_trained"].iloc[0] > 0
    row = next(line for line in report.splitlines() if line.startswith(f"| {DAYS[2]} |") and line.count("|") == 12)
    assert f"| {price['mean_price_reward'].iloc[0]:.3f} | {int(price['price_notes_trained'].iloc[0])} |" in row
    outcomes = wh.read("rollout_outcomes", DAYS[0])
    matured = outcomes[(outcomes["status"] == "matured") & (outcomes["source"] == "policy")]
    first = next(line for line in report.splitlines() if line.startswith(f"| {DAYS[0]} |") and line.count("|") == 12)
    assert f"| {(matured['vs_spy_pct'] > 0).mean():.3f} |" in first and first.rstrip(" |").endswith(str(len(matured)))
    for title in ("Hit rate of each day's calls", "Price reward per training day", "Staleness and truncated IS ratio"):
        assert f"![{title}" in report
    assert "bundled real closes" in report
    for name in ("hit_rate", "price", "off_policy"):
        assert (root / "reports" / "daily_rl" / DAYS[2] / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
