"""Look-ahead in the evaluation assets: `backtest` on hand-made outcomes (no model), and the whole loop on
tiny-local with an override re-run, as a user runs it (`rollout_outcomes`, `policy_eval`, `backtest`)."""

import dagster as dg
import pandas as pd
import pytest

from assets.daily_rl.backtest import backtest
from outcome_flywheel.daily_rl.notes.outcomes import call_window
from outcome_flywheel.storage import Warehouse

DAYS = ["2025-11-03", "2025-11-04", "2025-11-05", "2025-11-06"]  # Mon..Thu: entries Tue..Fri, one book each


def _training(override_day: str, headlines: str) -> pd.DataFrame:
    rows, parent = [], None
    for day in DAYS:
        version = f"{day}@base" if parent is None else f"{day}@{day[-2:]}cafe"
        rows.append(
            dict(
                date=day,
                policy_version=version,
                parent_version=parent,
                trained=parent is not None,
                outcome_headlines_date=headlines if day == override_day else day,
            )
        )
        parent = version
    return pd.DataFrame(rows)


def _outcomes(day: str, version: str) -> pd.DataFrame:
    w = call_window(day)
    rows = []
    for source, ver, side in (("policy", version, "long"), ("base", "base:tiny-local", "short")):
        for i in range(2):
            rows.append(
                dict(
                    date=day,
                    source=source,
                    headline_id=f"h{i}",
                    rollout_index=0,
                    policy_version=ver,
                    symbol="AAPL",
                    side=side,
                    status="matured",
                    entry_date=w.entry_date,
                    exit_date=w.exit_date,
                    symbol_return_pct=1.0,
                    spy_return_pct=0.5,
                    return_pct=0.9,
                    vs_spy_pct=0.4,
                    cost_bps=10.0,
                    horizon_sessions=1,
                )
            )
    return pd.DataFrame(rows)


def _backtest(warehouse, day, include=None):
    config = {"ops": {"backtest": {"config": {"include_look_ahead": include}}}} if include is not None else None
    assert dg.materialize([backtest], partition_key=day, resources={"warehouse": warehouse}, run_config=config).success
    return warehouse.read("backtest_summary", day).iloc[0], warehouse.read_all("backtest")


def test_backtest_leaves_look_ahead_days_out_unless_included(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_DATA_DIR", str(tmp_path))
    warehouse = Warehouse(data_dir=str(tmp_path))
    training = _training(override_day=DAYS[1], headlines=DAYS[3])  # day 2 scored with day 4's headlines
    for r in training.itertuples():
        warehouse.write("policy_training", pd.DataFrame([r._asdict()]).drop(columns="Index"), partition=r.date)
        warehouse.write("rollout_outcomes", _outcomes(r.date, r.policy_version), partition=r.date)
    entries = [call_window(d).entry_date for d in DAYS]

    summary, books = _backtest(warehouse, DAYS[3], include=True)
    assert summary["days"] == 4 and summary["look_ahead_days"] == 2 and summary["look_ahead_included"]
    assert list(books["date"]) == entries
    assert books["look_ahead"].tolist() == [False, True, True, False]  # days 2 and 3 (trained on day 4's news)

    summary, books = _backtest(warehouse, DAYS[3])  # the default: left out, and their books removed
    assert summary["days"] == 2 and summary["look_ahead_days"] == 2 and not summary["look_ahead_included"]
    assert list(books["date"]) == [entries[0], entries[3]] and not books["look_ahead"].any()

    # a clean history gives the same books either way
    for r in _training(override_day=None, headlines=None).itertuples():
        warehouse.write("policy_training", pd.DataFrame([r._asdict()]).drop(columns="Index"), partition=r.date)
    summary, books = _backtest(warehouse, DAYS[3])
    assert summary["days"] == 4 and summary["look_ahead_days"] == 0 and list(books["date"]) == entries


@pytest.fixture(scope="module")
def override_loop(tmp_path_factory, tiny_model_dir):
    """On tiny-local: 2025-11-05 (the base), then 2025-11-06 re-run as an override scored with the
    headlines of 2025-11-07 (gate off, so the update is checkpoint 11-06), each with its baseline and outcomes."""
    from assets.daily_rl.baseline import baseline_rollouts
    from assets.daily_rl.daily_update import daily_update
    from assets.daily_rl.headlines import headlines
    from assets.daily_rl.outcomes import rollout_outcomes
    from tests.daily_fixtures import daily_resources, linked_data_dir

    root = linked_data_dir(tmp_path_factory.mktemp("look_ahead"), tiny_model_dir)
    small = {"rollouts_per_headline": 4, "max_new_tokens": 40, "batch_size": 8, "gate_enabled": False}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLYWHEEL_DATA_DIR", str(root))
        res = daily_resources(root)
        assert dg.materialize([headlines], partition_key="2025-11-07", resources=res).success
        for day, config in (("2025-11-05", small), ("2025-11-06", {**small, "outcome_headlines_date": "2025-11-07"})):
            run_config = {"ops": {"daily_update": {"config": config}}}
            assets = [headlines, daily_update, baseline_rollouts, rollout_outcomes]
            assert dg.materialize(assets, partition_key=day, resources=res, run_config=run_config).success
        yield root, res


def _policy_eval(res, day, include=None):
    from assets.daily_rl.policy_eval import policy_eval

    config = {"ops": {"policy_eval": {"config": {"include_look_ahead": include}}}} if include is not None else None
    assert dg.materialize([policy_eval], partition_key=day, resources=res, run_config=config).success
    return res["warehouse"].read("policy_eval", day).set_index("metric")


def test_an_override_rerun_is_flagged_and_left_out_of_the_ab_and_the_backtest(override_loop):
    root, res = override_loop
    wh = res["warehouse"]
    training = wh.read("policy_training", "2025-11-06").iloc[0]
    assert training["trained"] and training["outcome_headlines_date"] == "2025-11-07" and training["gate"] == "accepted"
    # rollout_outcomes flags the policy's notes of 11-06 (checkpoint 11-06 read 11-07's headlines), not the base's
    outcomes = wh.read("rollout_outcomes", "2025-11-06")
    assert outcomes.loc[outcomes["source"] == "policy", "look_ahead"].all()
    assert not outcomes.loc[outcomes["source"] == "base", "look_ahead"].any()
    assert set(outcomes.loc[outcomes["source"] == "policy", "headlines_seen_through"]) == {"2025-11-07"}
    assert not wh.read("rollout_outcomes", "2025-11-05")["look_ahead"].any()

    # policy_eval of 11-06, default: the day is left out of the A/B (nothing judged, no data), and says why
    left_out = _policy_eval(res, "2025-11-06")
    assert left_out["look_ahead"].all() and left_out["look_ahead_days"].str.startswith("left out: 2025-11-06").all()
    own = left_out.loc[["structure_score", "judge_win_rate"]]
    assert (own["n"] == 0).all() and set(own["label"]) == {"not enough data"}
    # the price metrics read every day up to D: 11-05's calls stay in, 11-06's (both sides) are left out
    clean_only = _policy_eval(res, "2025-11-05").loc[["hit_rate", "mean_vs_spy_pct"], ["n", "policy", "base"]]
    pd.testing.assert_frame_equal(left_out.loc[["hit_rate", "mean_vs_spy_pct"], ["n", "policy", "base"]], clean_only)
    assert wh.read("policy_preferences", "2025-11-06").empty
    # included on request: compared as usual, still flagged
    included = _policy_eval(res, "2025-11-06", include=True)
    assert included["look_ahead"].all() and included["look_ahead_days"].str.startswith("included: 2025-11-06").all()
    assert included.loc["structure_score", "n"] == 3 and len(wh.read("policy_preferences", "2025-11-06")) == 3
    # 11-05's own A/B is clean
    clean = _policy_eval(res, "2025-11-05")
    assert not clean["look_ahead"].any() and clean.loc["structure_score", "n"] == 3

    summary, books = _backtest(wh, "2025-11-06")
    assert summary["look_ahead_days"] == 1 and not summary["look_ahead_included"]
    assert list(books["date"]) == [call_window("2025-11-05").entry_date]
    summary, books = _backtest(wh, "2025-11-06", include=True)
    assert list(books["date"]) == [call_window(d).entry_date for d in ("2025-11-05", "2025-11-06")]
    assert books["look_ahead"].tolist() == [False, True]


def test_the_daily_report_says_what_was_left_out():
    from assets.daily_rl.daily_report import evaluation_markdown

    evals = pd.DataFrame(
        [
            dict(
                metric="hit_rate",
                policy=float("nan"),
                base=float("nan"),
                ci_low=float("nan"),
                ci_high=float("nan"),
                label="not enough data",
                status="matured",
                look_ahead=True,
                look_ahead_days="left out: 2025-11-06 (trained on headlines of 2025-11-07)",
            )
        ]
    )
    text = evaluation_markdown(evals, pd.DataFrame())
    assert "Look-ahead notes" in text and "left out: 2025-11-06" in text
    assert "Look-ahead" not in evaluation_markdown(evals.assign(look_ahead=False, look_ahead_days=""), pd.DataFrame())
