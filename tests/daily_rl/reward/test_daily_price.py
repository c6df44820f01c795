"""The delayed price reward end to end on tiny-local: Thu, Fri, Sat, (no Sunday), Mon, Tue of the
bundled archive with the real bundled prices. A Friday's notes train on price on the Tuesday run,
once; a re-run gives the same ledger; stale groups are dropped with the reason; the first day and a
missing day (Sunday) run."""

import dagster as dg
import numpy as np
import pandas as pd
import pytest

from assets.daily_rl.daily_update import EARLIER_DAYS, PRICE_WINDOW_DAYS, daily_update
from assets.daily_rl.headlines import headlines
from tests.daily_fixtures import daily_resources, linked_data_dir
from tests.tolerances import logprob_tolerances

THU, FRI, SAT, MON, TUE = "2025-11-06", "2025-11-07", "2025-11-08", "2025-11-10", "2025-11-11"
SMALL = {"rollouts_per_headline": 4, "max_new_tokens": 32, "batch_size": 8}


def _run(res, day, **config):
    return dg.materialize(
        [headlines, daily_update],
        partition_key=day,
        resources=res,
        run_config={"ops": {"daily_update": {"config": {**SMALL, **config}}}},
    )


@pytest.fixture(scope="module")
def week(tmp_path_factory, tiny_model_dir):
    root = linked_data_dir(tmp_path_factory.mktemp("price"), tiny_model_dir)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLYWHEEL_DATA_DIR", str(root))
        res = daily_resources(root, max_headlines=2)
        wh = res["warehouse"]
        runs = {day: _run(res, day) for day in (THU, FRI, SAT, MON, TUE)}
        ledgers = {day: wh.read("reward_ledger", day) for day in runs}
        price = {day: wh.read("price_training", day) for day in runs}
        rerun = _run(res, TUE)
        rerun_ledger, rerun_price = wh.read("reward_ledger", TUE), wh.read("price_training", TUE)
        strict = _run(res, TUE, price_max_staleness=0)
        yield dict(
            runs=runs,
            ledgers=ledgers,
            price=price,
            rerun=rerun,
            rerun_ledger=rerun_ledger,
            rerun_price=rerun_price,
            strict=strict,
            strict_ledger=wh.read("reward_ledger", TUE),
            wh=wh,
        )


def _matured(ledger):
    return ledger[ledger["step"] == "matured"]


def test_the_first_day_and_a_missing_day_run(week):
    assert all(r.success for r in week["runs"].values())
    assert week["ledgers"][THU].empty  # the first day trains nothing
    assert not week["wh"].exists(
        "rollouts", "2025-11-09"
    )  # Sunday never ran; Monday scored nothing, still trained on price
    assert _matured(week["ledgers"][MON]).shape[0] > 0


def test_a_friday_trains_on_price_on_tuesday_once(week):
    ledgers = week["ledgers"]
    for day in (FRI, SAT, MON):  # Friday's notes enter Monday and exit Tuesday: pending until then
        assert FRI not in set(_matured(ledgers[day])["note_date"])
    assert week["price"][MON]["price_notes_waiting"].iloc[0] == 2 * 2 * 4  # Friday's and Saturday's notes wait
    tue = _matured(ledgers[TUE])
    friday = tue[tue["note_date"] == FRI]
    assert len(friday) == 2 * 4 and set(friday["status"]) <= {"trained", "dropped"}
    assert (friday["status"] == "trained").any()
    assert set(tue["note_date"]) == {FRI, SAT}  # Thursday's notes matured Monday and trained then
    assert set(_matured(ledgers[MON])["note_date"]) == {THU}
    # each note trains on price once over the whole week
    everything = pd.concat([_matured(x) for x in ledgers.values()])
    assert not everything.duplicated(["note_date", "headline_id", "rollout_index"]).any()
    # the day's record: the mean price reward of what trained, staleness of the trained groups
    row = week["price"][TUE].iloc[0]
    trained = tue[tue["status"] == "trained"]
    assert row["price_notes_trained"] == len(trained)
    assert row["mean_price_reward"] == pytest.approx(trained["signal_value"].mean())
    assert row["staleness_max"] == trained["staleness_updates"].max() and row["staleness_max"] >= 1
    assert (tue.loc[tue["reason"].fillna("").str.startswith("no_data"), "status"] == "dropped").all()


def _ratio_bound(week, judged) -> float:
    """exp(mean_t(pi_old - behaviour)) for notes the training parent sampled itself: pi_old
    recomputed by the training forward, the behaviour log-probs stored by the sampler, two fp32
    computations whose tokens lie within their rounding bounds (tests/tolerances.py): the ratio
    within expm1 of the largest per-note mean bound of 1, on the parent's own logits."""
    import json

    from outcome_flywheel.daily_rl.policy.checkpoints import load_policy, read_checkpoint
    from outcome_flywheel.models.loader import ModelLoader

    wh = week["wh"]
    version = judged["policy_version"].iloc[0]
    folders = [
        f
        for f in sorted(wh.path("checkpoints", "policy").iterdir())
        if (read_checkpoint(f) or {}).get("policy_version") == version
    ]
    models = ModelLoader(data_dir=wh.data_dir, base_model="tiny-local", backend="torch", device="cpu")
    parent = load_policy(models, folders[0], read_checkpoint(folders[0]))
    days = sorted({str(d)[:10] for d in judged["note_date"]})
    notes = pd.concat([wh.read("rollouts", day).assign(note_date=day) for day in days])
    notes = notes.assign(rollout_index=notes["rollout_index"].astype(int)).set_index(
        ["note_date", "headline_id", "rollout_index"]
    )
    notes = notes.loc[
        [
            (str(d)[:10], str(h), int(i))
            for d, h, i in zip(judged["note_date"], judged["headline_id"], judged["rollout_index"])
        ]
    ]
    bounds = logprob_tolerances(
        parent,
        [json.loads(p) for p in notes["prompt"]],
        [list(r) for r in notes["response_ids"]],
        temperature=float(notes["temperature"].iloc[0]),
    )
    return max(float(np.expm1(b.mean())) for b in bounds if len(b))


def test_importance_ratios_are_recorded(week):
    ledger = week["ledgers"][TUE]
    judged = ledger[(ledger["step"] == "judged") & ledger["is_ratio"].notna()]
    # sampled by the parent itself: 1 within the rounding bound (~1e-3; was a flat atol=1e-3)
    assert len(judged) and np.allclose(judged["is_ratio"], 1.0, rtol=0, atol=_ratio_bound(week, judged))
    moved = _matured(ledger)
    moved = moved[moved["advantage"].abs() > 1e-8]
    assert len(moved) and moved["is_ratio"].notna().all()
    row = week["price"][TUE].iloc[0]
    assert row["is_ratio_p05"] <= row["is_ratio_p50"] <= row["is_ratio_p95"] <= row["is_ratio_max"]
    assert row["is_truncated_fraction"] == pytest.approx(float((moved["is_ratio"] > row["tis_cap"]).mean()))


def test_a_rerun_gives_the_same_ledger(week):
    assert week["rerun"].success
    pd.testing.assert_frame_equal(week["rerun_ledger"], week["ledgers"][TUE])
    pd.testing.assert_frame_equal(week["rerun_price"], week["price"][TUE])


def test_stale_groups_are_dropped_with_the_reason(week):
    assert week["strict"].success
    strict = _matured(week["strict_ledger"])
    stale = strict[strict["staleness_updates"] > 0]
    assert len(stale) and (stale["status"] == "dropped").all()
    assert (
        stale["reason"].str.startswith("stale: ").all() and stale["reason"].str.contains("price_max_staleness 0").all()
    )


def test_the_self_dependency_covers_the_longest_wait():
    assert EARLIER_DAYS.start_offset == -PRICE_WINDOW_DAYS and EARLIER_DAYS.end_offset == -1 and PRICE_WINDOW_DAYS >= 4
    deps = {spec.key.to_user_string(): spec.deps for spec in daily_update.specs}
    for key, key_deps in deps.items():
        mine = [d for d in key_deps if d.asset_key.to_user_string() == key]
        assert len(mine) == 1 and mine[0].partition_mapping == EARLIER_DAYS
