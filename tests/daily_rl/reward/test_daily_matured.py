"""The delayed price step as plain functions (daily_rl/matured.py, rewards.PriceReward, the ledger)."""

import math

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
    assert config.weights["price"] == 1.0 and config.weights["relevance"] == 0.5
    # the note reward leaves the call-line signals out: the same as before they existed
    assert config.combine({"structure": 1.0, "judge_rank": 0.0}) == pytest.approx(0.5)
    assert config.combine({"structure": 1.0, "judge_rank": 0.0, "relevance": 0.0}) == pytest.approx(0.5)
    # shares: note = structure + judge_rank (1.0; human is sparse, inside R), relevance 0.5, price 1.0
    assert config.part_weights() == {"note": 1.0, "relevance": 0.5, "price": 1.0}
    assert [config.share(p) for p in ("note", "relevance", "price")] == pytest.approx([0.4, 0.2, 0.4])
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
    config = MaturedConfig(max_staleness=3)
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
