"""Tier 1a, the online note scorer: it learns online from a signal, checkpoints every 50 updates with
an atomic `latest`, starts afresh (and says why) when the feature size or rank changes, turns the
judge's ranks, matured prices and people's ratings into events in a fixed order, runs as the
`note_scorer` asset (re-running a day reproduces its state from D-1), joins the reward when weighted,
and drives the service: notes best-first, one online step per rated feedback, under a lock; what people
taught the live state is kept by the next day's state, each feedback once."""

from __future__ import annotations

import threading

import dagster as dg
import numpy as np
import pandas as pd
import pytest
import torch

from outcome_flywheel.daily_rl.note_scorer.events import judge_events, people_event, price_events
from outcome_flywheel.daily_rl.note_scorer.features import FEATURES_TABLE, STRUCTURE_NAMES, structure_features
from outcome_flywheel.daily_rl.note_scorer.model import (
    ScorerSettings,
    ScorerState,
    ScorerStore,
    accuracy_summary,
    clipped_event,
    learn,
    resume,
    tier_summary,
)
from outcome_flywheel.daily_rl.reward.signals import PriceReward, RewardConfig
from outcome_flywheel.feedback.log import FeedbackLog
from outcome_flywheel.feedback.records import FeedbackRecord
from outcome_flywheel.market_data import MarketData
from outcome_flywheel.models.loader import ModelLoader
from outcome_flywheel.storage import Warehouse
from resources.steps import StepRunnerResource
from tests.service_fixtures import AUTH, HEADLINES, make_state, make_world, test_client, write_notes

D1, D2 = "2025-11-04", "2025-11-05"


def synthetic_events(n: int, dim: int = 12, seed: int = 0, source: str = "judge"):
    """Groups of 6 notes whose label is a fixed linear function of their features (learnable)."""
    rng = np.random.default_rng(seed)
    truth = rng.normal(size=dim)
    events, features = [], {}
    for g in range(n):
        x = rng.normal(size=(6, dim)).astype(np.float32)
        keys = [("2025-01-01", f"h{g}", i) for i in range(6)]
        features.update(dict(zip(keys, x)))
        labels = 1 / (1 + np.exp(-(x @ truth)))
        events.append(clipped_event(source, "2025-01-01", f"2025-01-01/h{g}", keys, labels))
    return events, features


def test_learns_online_and_measures_held_out_against_a_constant():
    events, features = synthetic_events(160)
    state = ScorerState(12, "spec", ScorerSettings(rank=8, hidden=16, learning_rate=1e-2))
    counts = learn(state, events, features)
    assert counts["updates"] == 160 and state.updates == 160
    history = state.meta["history"]
    early = accuracy_summary(history[:20], "judge")
    late = accuracy_summary(history[-60:], "judge")
    # each event is scored before its step: held out; the learnt order beats the constant scorer's 0.5
    assert late["accuracy"] > 0.8 and late["ci_low"] > 0.5 and late["p_value"] < 0.01
    assert late["accuracy"] > early["accuracy"]
    assert accuracy_summary(history, "price")["events"] == 0


def test_labels_are_clipped_per_event_and_ties_make_no_pair():
    event = clipped_event("judge", "d", "g", [("d", "h", 0), ("d", "h", 1), ("d", "h", 2)], [1.7, -3.0, float("nan")])
    assert event.clipped == 3 and list(event.labels) == [1.0, 0.0, 0.5]
    assert [(i, j) for i, j, _ in event.pairs()] == [(0, 1), (0, 2), (2, 1)]
    flat = clipped_event("judge", "d", "g", [("d", "h", 0), ("d", "h", 1)], [0.5, 0.5])
    state = ScorerState(4, "spec", ScorerSettings(rank=2, hidden=4))
    assert state.step(flat, np.zeros((2, 4), np.float32)) is None and state.updates == 0


def test_checkpoint_every_50_updates_and_an_atomic_latest(tmp_path):
    store = ScorerStore(tmp_path)
    events, features = synthetic_events(120)
    state = ScorerState(12, "spec", ScorerSettings(rank=4, hidden=8))
    learn(state, events, features, store)
    steps = sorted(p.name for p in (store.root / "steps").iterdir())
    assert steps == ["step-00000050.safetensors", "step-00000100.safetensors"]
    assert store.latest.is_symlink() and store.latest.resolve().name == "step-00000100.safetensors"
    assert not list(store.root.rglob("*.tmp"))
    back = store.load_latest()
    assert back.updates == 100 and len(back.meta["history"]) == 100
    x = np.stack([features[k] for k in events[0].keys])
    loaded = store.load(store.root / "steps" / "step-00000100.safetensors")
    assert np.allclose(back.scores(x), loaded.scores(x))


def test_a_change_of_feature_size_or_rank_starts_afresh_and_says_so():
    settings = ScorerSettings(rank=4, hidden=8)
    old = ScorerState(12, "spec", settings)
    events, features = synthetic_events(5)
    learn(old, events, features)
    same, reason = resume(old, 12, "spec", ScorerSettings(rank=4, hidden=8, learning_rate=1e-2))
    assert reason is None and same is old and same.optimizer.param_groups[0]["lr"] == 1e-2
    bigger, reason = resume(old, 20, "spec", settings)
    assert reason == "feature size changed 12 -> 20" and bigger.updates == 0
    assert bigger.meta["fresh_start"] == {"reason": reason, "previous": {"feature_dim": 12, "rank": 4, "updates": 5}}
    _, reason = resume(old, 12, "spec", ScorerSettings(rank=6, hidden=8))
    assert reason == "rank/width changed 4/8 -> 6/8"
    _, reason = resume(old, 12, "other base model", settings)
    assert reason.startswith("feature spec changed")


def test_state_as_of_the_day_before(tmp_path):
    store = ScorerStore(tmp_path)
    assert store.state_before(D1, "2025-11-03") is None  # the first day: nothing before it
    store.save_day(D1, ScorerState(4, "spec", ScorerSettings(rank=2, hidden=4)))
    assert store.state_before(D2, D1).feature_dim == 4
    with pytest.raises(FileNotFoundError, match="materialise the days in order"):
        store.state_before("2025-11-07", "2025-11-06")


def test_events_from_judge_ranks_prices_and_people():
    scores = pd.DataFrame(
        {
            "prediction_date": D1,
            "headline_id": ["b", "b", "a", "a", "c", "c"],
            "rollout_index": [1, 0, 0, 1, 0, 1],
            "usable": [True, True, True, True, False, False],
            "outcome_reward": [0.0, 1.0, 1.0, 0.0, 1.0, 0.0],
        }
    )
    judged = judge_events(scores, D2)
    assert [e.group for e in judged] == [f"{D1}/a", f"{D1}/b"]  # usable groups only, headline order
    assert judged[1].keys == [(D1, "b", 0), (D1, "b", 1)] and list(judged[1].labels) == [1.0, 0.0]
    outcomes = pd.DataFrame(
        {
            "date": D1,
            "source": ["policy"] * 3 + ["base"],
            "headline_id": "a",
            "rollout_index": [0, 1, 2, 0],
            "status": ["matured", "matured", "no_call", "matured"],
            "vs_spy_pct": [2.0, -1.0, None, 5.0],
            "parse_status": ["ok", "ok", "no_trade", "ok"],
            "side": ["long", "short", "none", "long"],
            "exit_date": D2,
        }
    )
    priced = price_events(outcomes, D2)
    assert len(priced) == 1 and priced[0].source == "price"
    assert np.allclose(
        priced[0].labels, [PriceReward().value("matured", 2.0), PriceReward().value("matured", -1.0), 0.45]
    )
    assert price_events(outcomes, "2025-11-06") == []  # nothing matured on that day
    up = FeedbackRecord(date=D1, headline_id="a", rollout_index=1, thumbs="up", reviewer="ann")
    down = FeedbackRecord(date=D1, headline_id="a", rollout_index=2, stars=1, reviewer="bob")
    event = people_event(down, [up, down], [0, 1, 2], D2)
    assert list(event.labels) == [0.5, 1.0, 0.0]  # unrated neutral; the earlier thumbs-up still counts
    assert people_event(up, [up, down], [0, 1, 2], D2).labels.tolist() == [0.5, 1.0, 0.5]  # as of that feedback


def test_structured_features_read_sections_call_side_and_source():
    notes = pd.DataFrame(
        {
            "response": ["Trade Recommendation: Buy Apple (AAPL).\nRationale: strong iPhone sales.", "hmm"],
            "title": ["Apple beats estimates", "Apple beats estimates"],
            "summary": ["", ""],
            "source": ["Feed A", "Feed A"],
        }
    )
    x = structure_features(notes, {"AAPL", "SPY"})
    row = dict(zip(STRUCTURE_NAMES, x[0]))
    assert row["section_trade_recommendation"] == 1 and row["section_rationale"] == 1 and row["section_stop_loss"] == 0
    assert row["call_parsed"] == 1 and row["call_on_headline_company"] == 1 and row["side_long"] == 1
    other = dict(zip(STRUCTURE_NAMES, x[1]))
    assert other["call_parsed"] == 0 and other["side_none"] == 1 and other["length"] < row["length"]


# -- the asset, the reward signal and the service on one small world --------------------------------


@pytest.fixture(scope="module")
def scorer_world(tmp_path_factory, tiny_model_dir):
    """Two days of notes (D1, D2), the judge's ranks of D1's notes given on D2, matured prices of
    D1's calls exiting on D2, people's ratings written on D2; note_scorer materialised for D1 and D2."""
    root = make_world(tmp_path_factory.mktemp("scorer") / "data", tiny_model_dir)
    warehouse = Warehouse(data_dir=str(root))
    write_notes(warehouse, D2)
    rows = [
        {
            "date": D2,
            "prediction_date": D1,
            "headline_id": h,
            "rollout_index": i,
            "usable": True,
            "outcome_reward": 1.0 - i / 2,
        }
        for h in HEADLINES
        for i in range(3)
    ]
    warehouse.write("rollout_scores", pd.DataFrame(rows), partition=D2)
    outcomes = pd.DataFrame(
        [
            {
                "date": D1,
                "source": "policy",
                "headline_id": h,
                "rollout_index": i,
                "status": "matured",
                "vs_spy_pct": 1.5 - i,
                "parse_status": "ok",
                "side": "long",
                "exit_date": D2,
            }
            for h in HEADLINES
            for i in range(3)
        ]
    )
    warehouse.write("rollout_outcomes", outcomes, partition=D1)
    log = FeedbackLog(data_dir=str(root))
    log.append(
        FeedbackRecord(
            date=D1,
            headline_id=HEADLINES[0],
            rollout_index=0,
            thumbs="up",
            reviewer="ann",
            created_at=f"{D2}T15:00:00+00:00",
        )
    )
    resources = dict(
        warehouse=warehouse,
        model_backend=ModelLoader(data_dir=str(root), base_model="tiny-local", backend="torch", device="cpu"),
        feedback_log=log,
        market_data=MarketData(data_dir=str(root)),
        step_runner=StepRunnerResource(runner="in_process"),
    )
    return root, resources, {day: materialize(resources, day) for day in (D1, D2)}


def materialize(resources, day, config=None):
    from assets.daily_rl.note_scorer import note_scorer

    result = dg.materialize(
        [note_scorer],
        partition_key=day,
        resources=resources,
        run_config={"ops": {"note_scorer": {"config": config or {}}}},
    )
    assert result.success
    return result.asset_materializations_for_node("note_scorer")[0].metadata


def tensors(state: ScorerState) -> dict:
    return {k: v.clone() for k, v in state.model.state_dict().items()}


def test_asset_takes_the_days_events_in_order_and_reports_accuracy(scorer_world):
    root, _, metadata = scorer_world
    first, second = metadata[D1], metadata[D2]
    # the thumbs-up on a note of D1 (written on D2) is taken on D1: its note exists by then
    assert (
        first["fresh_start"].value == "no earlier state"
        and first["updates"].value == 1
        and first["events_people"].value == 1
    )
    assert second["fresh_start"].value.startswith("no (carried on")
    assert (second["events_judge"].value, second["events_price"].value, second["events_people"].value) == (2, 2, 0)
    assert second["updates"].value == 5 and second["features_written"].value == 6
    assert "| judge | 2 |" in second["held_out_accuracy"].value and "0.5" in second["held_out_accuracy"].value
    store = ScorerStore(root)
    assert store.days() == [D1, D2] and store.latest.resolve() == store.day_file(D2)
    history = store.load_latest().meta["history"]
    assert [h["source"] for h in history] == ["people", "judge", "judge", "price", "price"]
    assert Warehouse(data_dir=str(root)).read(FEATURES_TABLE, D2)["features"].map(len).unique().tolist() == [
        128 + len(STRUCTURE_NAMES)
    ]
    assert tier_summary(root).startswith("note scorer: 5 updates")


def test_rerun_of_a_day_starts_from_the_day_before_not_latest(scorer_world):
    """Re-run in a step process (the default runner), after `latest` moved on: the same weights."""
    root, resources, _ = scorer_world
    store = ScorerStore(root)
    before = tensors(store.load(store.day_file(D2)))
    # latest moves on (a live step elsewhere), then D2 is re-run: same state, from D1's.
    live = store.load_latest()
    events, _ = synthetic_events(1, dim=live.feature_dim)
    live.step(events[0], np.random.default_rng(1).normal(size=(6, live.feature_dim)).astype(np.float32))
    store.save_live(live)
    materialize(
        {**resources, "step_runner": StepRunnerResource(runner="subprocess")}, D2
    )  # as deployed: its own process
    after = store.load(store.day_file(D2))
    assert after.updates == 5 and all(torch.equal(before[k], v) for k, v in tensors(after).items())


def test_a_new_rank_starts_afresh_in_the_asset(scorer_world):
    root, resources, _ = scorer_world
    meta = materialize(resources, D2, {"rank": 16})
    assert meta["fresh_start"].value == "rank/width changed 64/128 -> 16/128" and meta["updates"].value == 5
    materialize(resources, D2)  # back to the default rank for the tests after this one
    assert ScorerStore(root).load(ScorerStore(root).day_file(D2)).settings.rank == 64


def test_scorer_reward_signal_is_off_by_default_and_sparse(scorer_world):
    from outcome_flywheel.daily_rl.note_scorer.features import FEATURES_TABLE
    from outcome_flywheel.daily_rl.note_scorer.signal import scorer_signals

    root, _, _ = scorer_world
    state = ScorerStore(root).load(ScorerStore(root).day_file(D2))  # as the day reads them: the state after D2
    signals = scorer_signals(state, Warehouse(data_dir=str(root)).read(FEATURES_TABLE, D2))  # and D2's features
    assert len(signals) == 6 and all(0 < v < 1 for v in signals.values())
    assert scorer_signals(None, None) == {} and scorer_signals(state, None) == {}
    default = RewardConfig()
    assert "scorer" not in default.weights  # off unless weighted
    weighted = RewardConfig(weights={"structure": 0.5, "judge_rank": 0.5, "scorer": 0.5})
    base = {"structure": 0.5, "judge_rank": 1.0}
    assert weighted.combine(base) == default.combine(base)  # missing: drops out
    assert weighted.combine({**base, "scorer": 0.0}) < weighted.combine({**base, "scorer": 1.0})


def test_service_shows_notes_best_first_and_steps_on_feedback(scorer_world):
    root, _, _ = scorer_world
    client = test_client(make_state(root))
    page = client.get("/", params={"date": D2}).text
    assert "best-first by the online note scorer" in page
    store = ScorerStore(root)
    scorer = store.load_latest()
    features = {
        k: v
        for k, v in __import__("outcome_flywheel.daily_rl.note_scorer.features", fromlist=["x"])
        .feature_lookup(Warehouse(data_dir=str(root)).read(FEATURES_TABLE, D2))
        .items()
        if k[1] == HEADLINES[1]
    }
    best = max(features, key=lambda k: float(scorer.scores(features[k][None])[0]))
    section = page[page.index(f'id="h-{HEADLINES[1]}"') :]
    assert section.index('id="note-{}-{}"'.format(HEADLINES[1], best[2])) == min(
        section.index(f'id="note-{HEADLINES[1]}-{i}"') for i in range(3)
    )
    updates = scorer.updates
    body = {"date": D2, "headline_id": HEADLINES[1], "rollout_index": 2, "thumbs": "up", "reviewer": "ann"}
    answer = client.post("/api/feedback", json=body, headers=AUTH).json()["note_scorer"]
    assert answer["updated"] and answer["updates"] == updates + 1
    assert store.latest.resolve() == store.root / "live.safetensors"
    # four requests at once: the lock makes every step land on the state the one before wrote. They rate
    # notes 0 and 1 down, so whatever order they are stored in, note 2 (up) ranks above and each one steps
    threads = [
        threading.Thread(
            target=client.post,
            args=("/api/feedback",),
            kwargs={"json": {**body, "rollout_index": i % 2, "thumbs": "down"}, "headers": AUTH},
        )
        for i in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.load_latest().updates == updates + 5
    status = client.get("/api/rl/note_scorer").json()
    assert status["updates"] == updates + 5 and [r["source"] for r in status["held_out_accuracy"]] == [
        "judge",
        "price",
        "people",
    ]
    nothing = client.post("/api/feedback", json={**body, "thumbs": None, "correction": "Sell it."}, headers=AUTH).json()
    assert nothing["note_scorer"] == {
        "updated": False,
        "reason": "the feedback has no thumbs or stars (a correction alone does not rank notes)",
    }


def test_what_people_taught_the_live_state_is_kept_by_the_next_day_once(scorer_world):
    """Feedback posted to the service steps the live state; the next day's state (from D-1's) takes
    each of those feedbacks once, a re-run of that day reproduces it, and the day after takes none."""
    root, resources, _ = scorer_world
    store = ScorerStore(root)
    client = test_client(make_state(root))
    body = {"date": D2, "headline_id": HEADLINES[0], "reviewer": "cat"}
    for i, thumbs in enumerate(("up", "down", "up")):
        assert client.post("/api/feedback", json={**body, "rollout_index": i, "thumbs": thumbs}, headers=AUTH).json()[
            "note_scorer"
        ]["updated"]
    live = store.load_latest()
    rated = {r.feedback_id for r in FeedbackLog(data_dir=str(root)).read().feedback if r.thumbs or r.stars}
    chain = store.load(store.day_file(D2)).applied_people
    taught = rated - chain  # posted after D2 was materialised: in the live state only
    assert len(taught) >= 3 and taught <= live.applied_people

    D3, D4 = "2025-11-06", "2025-11-07"
    day3 = materialize(resources, D3)
    state = store.load_latest()
    assert store.latest.resolve() == store.day_file(D3)  # latest moved to the day's state ...
    assert rated <= state.applied_people  # ... which holds every feedback people gave
    assert day3["events_people"].value == len(taught) and day3["events_judge"].value == day3["events_price"].value == 0
    people = [h for h in state.meta["history"] if h["source"] == "people"]
    assert len(people) == len(state.applied_people) == len(rated)  # each once
    weights = tensors(state)
    again = materialize(resources, D3)  # a re-run: from D2's state, the same feedback, the same weights
    assert again["events_people"].value == len(taught)
    assert all(torch.equal(weights[k], v) for k, v in tensors(store.load(store.day_file(D3))).items())
    day4 = materialize(resources, D4)
    assert day4["events_people"].value == 0 and store.load_latest().updates == state.updates
