"""The delayed price step as plain functions (daily_rl/reward/matured.py, reward/signals.PriceReward, the ledger)."""

import json
import math
from datetime import date

import numpy as np
import pandas as pd
import pytest

from outcome_flywheel.daily_rl.notes.outcomes import call_window
from outcome_flywheel.daily_rl.reward.ledger import ledger_frame, settled_notes
from outcome_flywheel.daily_rl.reward.matured import (
    MaturedConfig,
    knowledge_cutoff,
    longest_wait_days,
    matured_batch,
    replay_groups,
    staleness_updates,
)
from outcome_flywheel.daily_rl.reward.signals import PriceReward, RewardConfig


def test_price_transform_and_the_documented_values():
    price = PriceReward()
    assert price.value("matured", 0.0, "ok") == pytest.approx(0.5)
    assert price.value("matured", 1.0, "ok") == pytest.approx(1 / (1 + math.exp(-1)))
    assert price.value("matured", -1.0, "ok") == pytest.approx(1 / (1 + math.exp(1)))
    assert price.value("matured", 5000.0, "ok") == 1.0 and price.value("matured", -5000.0, "ok") == 0.0
    assert PriceReward(scale_pct=2.0).value("matured", 2.0, "ok") == pytest.approx(1 / (1 + math.exp(-1)))
    assert price.value("no_call", float("nan"), "no_trade") == 0.45
    for unparseable in ("no_side", "no_symbol", "unknown_symbol", "ambiguous", "empty"):
        assert price.value("no_call", float("nan"), unparseable) == 0.25
    assert price.value("pending", float("nan"), "ok") is None and price.value("no_data", float("nan"), "ok") is None
    # say nothing: below a costless coin flip, above an unparseable note, far from 0
    assert price.unparseable < price.no_trade < price.value("matured", 0.0, "ok")
    for bad in (dict(scale_pct=0.0), dict(no_trade=1.5), dict(unparseable=-0.1)):
        with pytest.raises(ValueError):
            PriceReward(**bad)


def test_price_is_delayed_and_the_shares_are_the_documented_mixture():
    config = RewardConfig()
    assert config.weights["price"] == 1.0 and config.weights["relevance"] == 1.0
    # the note reward leaves the call-line signals out: the same as before they existed
    assert config.combine({"structure": 1.0, "judge_rank": 0.0}) == pytest.approx(0.5)
    assert config.combine({"structure": 1.0, "judge_rank": 0.0, "relevance": 0.0}) == pytest.approx(0.5)
    # shares: note = structure + judge_rank (1.0; human is sparse, inside R), relevance 1.0, price 1.0
    assert config.part_weights() == {"note": 1.0, "relevance": 1.0, "price": 1.0}
    assert [config.share(p) for p in ("note", "relevance", "price")] == pytest.approx([1 / 3, 1 / 3, 1 / 3])
    assert sum(config.share(p) for p in ("note", "relevance", "price")) == pytest.approx(1.0)
    assert RewardConfig(weights={"price": 1.0}).share("price") == 1.0
    whole_note = RewardConfig(weights={"structure": 0.5, "judge_rank": 0.5})
    assert whole_note.share("note") == 1.0 and whole_note.share("price") == 0.0
    with pytest.raises(ValueError, match="unknown reward part"):
        config.share("immediate")


def test_the_window_covers_the_longest_wait_and_a_friday_waits_until_tuesday():
    assert call_window("2025-11-07", 1).exit_date == "2025-11-11"  # Friday -> Tuesday
    assert longest_wait_days(1) == 6  # the 2012 hurricane closure: Fri 2012-10-26 -> Thu 2012-11-01
    assert call_window("2012-10-26", 1).exit_date == "2012-11-01"
    assert longest_wait_days(2) >= longest_wait_days(1) + 1


def test_knowledge_cutoff_is_the_end_of_day_d_in_new_york():
    assert knowledge_cutoff("2025-11-11", pd.Timestamp("2030-01-01", tz="UTC")) == pd.Timestamp(
        "2025-11-12 05:00", tz="UTC"
    )
    early = pd.Timestamp("2025-11-11 18:00", tz="UTC")
    assert knowledge_cutoff("2025-11-11", early) == early


def test_staleness_counts_weight_changes_not_days():
    checkpoints = {
        "2025-11-07": "2025-11-07@aaa",
        "2025-11-08": "2025-11-08@bbb",
        "2025-11-09": "2025-11-09@bbb",
        "2025-11-10": "2025-11-10@ccc",
        "2025-11-11": "2025-11-11@ddd",
    }
    # sampled by 11-07's weights, trained at 11-11 from 11-10's: bbb (changed), bbb (rejected / no update), ccc
    assert staleness_updates("2025-11-07", "2025-11-07@aaa", checkpoints, "2025-11-11") == 2
    assert staleness_updates("2025-11-09", "2025-11-09@bbb", checkpoints, "2025-11-11") == 1
    assert staleness_updates("2025-11-10", "2025-11-10@ccc", checkpoints, "2025-11-11") == 0


def _notes(day, headline, version, n=4):
    return pd.DataFrame(
        {
            "date": day,
            "headline_id": headline,
            "rollout_index": range(n),
            "prompt": '[{"role": "user", "content": "x"}]',
            "response_ids": [[1, 2, 3]] * n,
            "behavior_logprobs": [[-1.0, -1.0, -1.0]] * n,
            "temperature": 0.8,
            "policy_version": version,
        }
    )


def _outcomes(statuses, vs, parse):
    return pd.DataFrame(
        {
            "status": statuses,
            "vs_spy_pct": vs,
            "parse_status": parse,
            "reason": [None if s == "matured" else f"{s} reason" for s in statuses],
        }
    )


def test_matured_batch_trains_matured_waits_on_pending_drops_no_data_and_stale():
    notes = pd.concat(
        [
            _notes("2025-11-07", "h1", "2025-11-07@aaa"),
            _notes("2025-11-07", "h2", "2025-11-07@aaa"),
            _notes("2025-11-05", "h3", "2025-11-05@zzz"),
        ],
        ignore_index=True,
    )
    outcomes = _outcomes(
        ["matured", "matured", "no_call", "no_data"] + ["matured", "pending", "matured", "matured"] + ["matured"] * 4,
        [2.0, -2.0, np.nan, np.nan] + [1.0, np.nan, 1.0, 1.0] + [1.0, -1.0, 0.5, 0.0],
        ["ok", "ok", "no_trade", "ok"] + ["ok"] * 8,
    )
    checkpoints = {
        "2025-11-05": "2025-11-05@zzz",
        "2025-11-06": "2025-11-06@yyy",
        "2025-11-07": "2025-11-07@aaa",
        "2025-11-08": "2025-11-08@bbb",
        "2025-11-09": "2025-11-09@ccc",
        "2025-11-10": "2025-11-10@ddd",
    }
    config = MaturedConfig(max_staleness=3, baseline="group_std")
    batch = matured_batch(notes, outcomes, "2025-11-11", "2025-11-10@ddd", checkpoints, config, 0.5, 0.8)
    ledger = ledger_frame(batch.ledger)
    by_group = {h: g for h, g in ledger.groupby("headline_id")}
    assert "h2" not in by_group and batch.waiting_notes == 4  # one pending note: the whole group waits
    h1 = by_group["h1"].set_index("rollout_index")
    assert h1.loc[3, "status"] == "dropped" and h1.loc[3, "reason"].startswith("no_data") and batch.no_data_notes == 1
    assert (h1.loc[[0, 1, 2], "status"] == "trained").all() and (h1["staleness_updates"] == 3).all()
    values = [1 / (1 + math.exp(-2)), 1 / (1 + math.exp(2)), 0.45]
    assert h1.loc[[0, 1, 2], "signal_value"].tolist() == pytest.approx(values)
    adv = (np.array(values) - np.mean(values)) / (np.std(values) + 1e-4) * 0.5  # scaled by the price weight share
    # the same float64 formula (or its fp32 copy, 2^-24 relative): far within 1e-6
    assert h1.loc[[0, 1, 2], "advantage"].tolist() == pytest.approx(adv.tolist(), rel=1e-6)
    h3 = by_group["h3"]  # sampled by 11-05's weights: 5 updates since > 3
    assert (h3["status"] == "dropped").all() and h3["reason"].str.startswith("stale: 5 policy updates").all()
    assert batch.example_keys == [("2025-11-07", "h1", 0), ("2025-11-07", "h1", 1), ("2025-11-07", "h1", 2)]
    assert [e.token_advantages[0] for e in batch.examples] == pytest.approx(
        adv.tolist(), rel=1e-6
    )  # no tokenizer: the whole note
    assert all(e.advantage == 0.0 for e in batch.examples)  # price has no whole-note part
    assert set(ledger["policy_version"]) == {"2025-11-10@ddd"} and set(ledger["step"]) == {"matured"}
    # settled notes are never picked again: trained and dropped alike
    assert settled_notes(ledger, "matured") == {
        (d, h, i) for d, h, i in zip(ledger["note_date"], ledger["headline_id"], ledger["rollout_index"])
    }
    assert settled_notes(ledger, "judged") == set()


def test_matured_batch_drops_notes_sampled_at_another_temperature():
    notes = _notes("2025-11-07", "h1", "2025-11-07@aaa").assign(temperature=1.0)
    batch = matured_batch(
        notes,
        _outcomes(["matured"] * 4, [1.0, -1.0, 0.0, 2.0], ["ok"] * 4),
        "2025-11-11",
        "2025-11-10@aaa",
        {},
        MaturedConfig(),
        1.0,
        0.8,
    )
    assert not batch.examples and all("temperature" in r["reason"] for r in batch.ledger)


def test_the_catalog_describes_the_ledger_and_price_training_columns_in_order():
    from assets.catalog import COLUMNS
    from outcome_flywheel.daily_rl.reward.ledger import LEDGER_COLUMNS
    from outcome_flywheel.daily_rl.reward.rollout_scores import SCORE_COLUMNS
    from outcome_flywheel.daily_rl.reward.training_record import PRICE_TRAINING_COLUMNS

    assert list(COLUMNS["reward_ledger"]) == LEDGER_COLUMNS
    assert list(COLUMNS["price_training"]) == PRICE_TRAINING_COLUMNS
    assert set(SCORE_COLUMNS) <= set(COLUMNS["rollout_scores"])


def test_the_default_price_advantage_is_leave_one_out_without_std():
    """RLOO's baseline, in units of the signal's half-range (2 x), no per-group std (Dr. GRPO): a group whose
    spread is only small noise keeps small advantages instead of being scaled to unit size."""
    from outcome_flywheel.daily_rl.reward.signals import loo_advantages

    assert MaturedConfig().baseline == "loo"
    values = [0.9, 0.1, 0.5, 0.5]
    expected = [2 * (v - (sum(values) - v) / 3) for v in values]
    assert loo_advantages(values).tolist() == pytest.approx(expected, rel=1e-12)
    assert loo_advantages([0.7]).tolist() == [0.0]
    quiet = loo_advantages([0.51, 0.49, 0.5, 0.5])  # others' noise: stays small (GRPO's std would make it +-1.4)
    assert np.abs(quiet).max() < 0.03
    notes = _notes("2025-11-07", "h1", "2025-11-07@aaa")
    batch = matured_batch(
        notes,
        _outcomes(["matured"] * 4, [2.0, -2.0, 0.0, 0.0], ["ok"] * 4),
        "2025-11-11",
        "2025-11-10@aaa",
        {},
        MaturedConfig(),
        0.4,
        0.8,
    )
    signal = [1 / (1 + math.exp(-2)), 1 / (1 + math.exp(2)), 0.5, 0.5]
    assert [r["advantage"] for r in batch.ledger] == pytest.approx((loo_advantages(signal) * 0.4).tolist(), rel=1e-9)
    with pytest.raises(ValueError, match="price_baseline"):
        MaturedConfig(baseline="mean")
    for bad in (dict(replay_days=-1), dict(replay_days=1.5), dict(replay_decay=1.5)):
        with pytest.raises(ValueError):
            MaturedConfig(**bad)


def _price_rows(day, note_day, headline, values, step="matured", status="trained", behaviour="b") -> list[dict]:
    """Ledger rows of one price group trained (or dropped) at `day`, one note per signal value."""
    return [
        dict(
            date=day,
            note_date=note_day,
            headline_id=headline,
            rollout_index=i,
            step=step,
            signals="price",
            status=status,
            reason=None,
            policy_version="p",
            behavior_policy_version=behaviour,
            staleness_updates=0,
            staleness_days=(date.fromisoformat(day) - date.fromisoformat(note_day)).days,
            signal_value=value,
            advantage=0.1,
            is_ratio=1.0,
        )
        for i, value in enumerate(values)
    ]


def test_matured_groups_are_pooled_replayed_decayed_within_staleness_and_settle_nothing():
    """A group trained on price at d trains again at D (up to d + replay_days), its advantage decayed by
    decay ** (D - d), from the ledger's stored signals; a group too stale by now is dropped with the reason;
    replay rows settle nothing, and only first trainings (step matured, trained) are replayed."""
    earlier = ledger_frame(
        [
            row
            for day, note_day, h, step, status in (
                ("2025-11-10", "2025-11-07", "h1", "matured", "trained"),
                ("2025-11-10", "2025-11-07", "h9", "matured", "dropped"),
                ("2025-11-09", "2025-11-06", "h2", "matured", "trained"),
                ("2025-11-05", "2025-11-03", "h3", "matured", "trained"),  # older than replay_days
                ("2025-11-10", "2025-11-06", "h2", "replay", "trained"),  # a replay is not replayed again
            )
            for row in _price_rows(day, note_day, h, [0.9, 0.1, 0.5, 0.5], step, status)
        ]
    )
    config = MaturedConfig(replay_days=4, replay_decay=0.5, max_staleness=2)
    keys = replay_groups(earlier, "2025-11-11", config)
    assert sorted(set(zip(keys["headline_id"], keys["trained_on"]))) == [("h1", "2025-11-10"), ("h2", "2025-11-09")]
    assert replay_groups(earlier, "2025-11-11", MaturedConfig(replay_days=0)).empty
    rollouts = pd.concat(
        [_notes("2025-11-07", "h1", "2025-11-07@aaa"), _notes("2025-11-06", "h2", "2025-11-06@zzz")], ignore_index=True
    )
    replays = rollouts.merge(
        keys.rename(columns={"note_date": "date"}), on=["date", "headline_id", "rollout_index"], how="inner"
    )
    checkpoints = {
        "2025-11-06": "2025-11-06@zzz",
        "2025-11-07": "2025-11-07@aaa",
        "2025-11-08": "2025-11-08@bbb",
        "2025-11-09": "2025-11-09@ccc",
        "2025-11-10": "2025-11-10@ddd",
    }
    empty = _outcomes([], [], [])
    batch = matured_batch(
        rollouts.iloc[:0], empty, "2025-11-11", "2025-11-10@ddd", checkpoints, config, 0.4, 0.8, replays=replays
    )
    ledger = ledger_frame(batch.ledger)
    assert set(ledger["step"]) == {"replay"} and batch.replayed_groups == 0 and not batch.examples
    # sampled by 11-07's weights, h1 has seen 3 updates since (bbb, ccc, ddd) > 2: too stale to replay, as h2 (4)
    h1 = ledger[ledger["headline_id"] == "h1"]
    assert (h1["status"] == "dropped").all() and h1["reason"].str.startswith("stale: 3").all()
    batch = matured_batch(
        rollouts.iloc[:0],
        empty,
        "2025-11-11",
        "2025-11-10@ddd",
        checkpoints,
        MaturedConfig(replay_days=4, replay_decay=0.5, max_staleness=8),
        0.4,
        0.8,
        replays=replays,
    )
    ledger = ledger_frame(batch.ledger)
    from outcome_flywheel.daily_rl.reward.signals import loo_advantages

    base = loo_advantages([0.9, 0.1, 0.5, 0.5]) * 0.4
    for h, age in (("h1", 1), ("h2", 2)):
        rows = ledger[ledger["headline_id"] == h].sort_values("rollout_index")
        assert (rows["status"] == "trained").all() and rows["reason"].str.startswith("replay of").all()
        assert rows["advantage"].tolist() == pytest.approx((base * 0.5**age).tolist(), rel=1e-9)
    assert batch.replayed_groups == 2
    assert len(batch.examples) == 4 and all(e.token_part == "price" for e in batch.examples)  # the 0.5s: no pull
    assert settled_notes(ledger, "matured") == set()  # replays settle nothing


def test_a_rejected_days_price_groups_go_back_to_pending_and_are_not_replayed(tmp_path):
    """The delayed step over a real warehouse and the bundled prices (`DayStore` reads its inputs,
    `collect_matured` prices them): a group trained on price at 11-10 is
    settled and replayed at 11-11, unless the gate rejected 11-10's update, in which case 11-10's ledger
    settles nothing and the group trains anew as `matured` (and is not replayed)."""
    from outcome_flywheel.daily_rl.day_settings import DailyUpdateSettings
    from outcome_flywheel.daily_rl.day_store import DayInputs, DayStore
    from outcome_flywheel.daily_rl.policy.checkpoints import CHECKPOINT_FILE
    from outcome_flywheel.daily_rl.reward.matured import collect_matured
    from outcome_flywheel.market_data import MarketData
    from outcome_flywheel.storage import Warehouse

    wh = Warehouse(data_dir=str(tmp_path))
    note_day, trained_on, day = "2025-11-06", "2025-11-10", "2025-11-11"  # Thursday's notes exit Monday's close
    notes = _notes(note_day, "h1", "2025-11-06@aaa").assign(
        response=["Trade Recommendation: Buy AAPL.", "Trade Recommendation: Sell AAPL."] * 2
    )
    wh.write("rollouts", notes, partition=note_day)
    ledger = ledger_frame(_price_rows(trained_on, note_day, "h1", [0.9, 0.1, 0.9, 0.1], behaviour="2025-11-06@aaa"))
    wh.write("reward_ledger", ledger, partition=trained_on)
    market = MarketData(data_dir=str(tmp_path))
    future = pd.Timestamp("2030-01-01", tz="UTC")

    store = DayStore(wh, market)
    settings = DailyUpdateSettings()
    config = settings.matured()

    def collect(gate: str):
        folder = store.checkpoints.root / trained_on
        folder.mkdir(parents=True, exist_ok=True)
        (folder / CHECKPOINT_FILE).write_text(json.dumps({"gate": gate}))
        inputs = DayInputs(prev_rollouts=pd.DataFrame(), headlines=pd.DataFrame(), outcome_titles=[])
        store._matured_inputs(day, settings, inputs)
        batch = collect_matured(
            inputs.earlier_ledgers,
            inputs.note_rollouts,
            market,
            inputs.versions,
            day,
            "p",
            config,
            0.4,
            0.8,
            wall_clock=future,
        )
        return ledger_frame(batch.ledger)

    accepted = collect("accepted")
    assert set(accepted["step"]) == {"replay"} and len(accepted) == 4  # settled, and pooled again
    assert (accepted["advantage"].abs() > 0).all()
    rejected = collect("rejected")
    assert set(rejected["step"]) == {"matured"} and len(rejected) == 4  # back to pending: trained anew
    assert set(rejected["status"]) == {"trained"}
