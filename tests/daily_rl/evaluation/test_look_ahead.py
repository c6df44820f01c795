"""Look-ahead: notes written by a policy trained on headlines dated after the notes' day are flagged, and
policy_eval and backtest leave their days out unless told to include them.

The rule (outcome_flywheel.daily_rl.evaluation.look_ahead): a version has seen the latest outcome-headline date of
the weight-changing updates in its lineage; the notes of day N are look-ahead when their version has
seen a date after N, or when the lineage cannot be traced.
"""

import pandas as pd
import pytest

from outcome_flywheel.daily_rl.evaluation.look_ahead import (
    LOOK_AHEAD_COLUMNS,
    LookAheadInputs,
    headlines_seen,
    look_ahead_days,
    look_ahead_flags,
    without_days,
)

D1, D2, D3, D4, D5 = "2025-11-03", "2025-11-04", "2025-11-05", "2025-11-06", "2025-11-07"


def row(day, version, parent, trained=True, headlines=None):
    """One policy_training row: day D made `version` from `parent`, scored with the headlines of `headlines` (default D)."""
    return dict(
        date=day,
        policy_version=version,
        parent_version=parent,
        trained=trained,
        outcome_headlines_date=headlines or day,
    )


def chain(override_day=None, override_to=None, rejected=(), untrained=()):
    """Five days; day 1 is the base; `override_day` scored with the headlines of `override_to`."""
    rows, parent = [row(D1, f"{D1}@base", None, trained=False)], f"{D1}@base"
    for day in (D2, D3, D4, D5):
        headlines = override_to if day == override_day else day
        if day in rejected:  # the gate refused: the parent's version is republished
            rows.append(row(day, parent, parent, trained=True, headlines=headlines))
            continue
        version = f"{day}@{day[-2:]}aaaa"
        rows.append(row(day, version, parent, trained=day not in untrained, headlines=headlines))
        parent = version
    return pd.DataFrame(rows)


def notes_of(training):
    """One policy note per day, written by that day's checkpoint, and one base note."""
    policy = [{"date": r.date, "policy_version": r.policy_version, "source": "policy"} for r in training.itertuples()]
    base = [{"date": r.date, "policy_version": "base:tiny-local", "source": "base"} for r in training.itertuples()]
    return pd.DataFrame(policy + base)


def flagged_days(training):
    notes = notes_of(training)
    flags = look_ahead_flags(notes, training)
    assert not flags.loc[notes["source"] == "base", "look_ahead"].any()  # the base is never look-ahead
    return sorted(notes.loc[flags["look_ahead"], "date"])


def test_a_normal_chain_has_no_look_ahead():
    training = chain()
    assert flagged_days(training) == []
    seen = headlines_seen(training)
    assert seen[f"{D1}@base"].through is None and seen[f"{D4}@06aaaa"].through == D4


def test_an_override_flags_its_day_and_the_descendants_written_before_the_override_date():
    # Day 2 scored with the headlines of day 4: checkpoint 2 and 3 have read news after their day;
    # checkpoint 4's notes (day 4) and 5's are written after that news: not look-ahead.
    training = chain(override_day=D2, override_to=D4)
    assert flagged_days(training) == [D2, D3]
    flags = look_ahead_flags(notes_of(training), training)
    assert set(flags.loc[flags["look_ahead"], "headlines_seen_through"]) == {D4}
    reason = flags.loc[flags["look_ahead"], "look_ahead_reason"].iloc[0]
    assert D4 in reason and D2 in reason
    assert {c: str(flags[c].dtype) for c in LOOK_AHEAD_COLUMNS} == LOOK_AHEAD_COLUMNS


def test_an_override_that_changed_no_weights_is_not_look_ahead():
    # the gate rejected day 2's update (the parent's weights stay), or there was nothing to train on
    assert flagged_days(chain(override_day=D2, override_to=D4, rejected={D2})) == []
    assert flagged_days(chain(override_day=D2, override_to=D4, untrained={D2})) == []


def test_an_override_by_a_single_day_is_look_ahead():
    assert flagged_days(chain(override_day=D3, override_to=D4)) == [D3]


def test_an_untraceable_lineage_is_flagged():
    training = chain(override_day=D2, override_to=D4)
    # Day 2 re-run normally afterwards: its row now makes a new version; days 3-5 still descend from the
    # override's weights, which no row records any more.
    rerun = training.copy()
    rerun.loc[rerun["date"] == D2, ["policy_version", "outcome_headlines_date"]] = [f"{D2}@bbbbbb", D2]
    flags = look_ahead_flags(notes_of(rerun), rerun)
    notes = notes_of(rerun)
    assert sorted(notes.loc[flags["look_ahead"], "date"]) == [D3, D4, D5]
    assert flags.loc[flags["look_ahead"], "look_ahead_reason"].str.contains("untraced").all()
    # a note whose version no row made at all
    orphan = pd.DataFrame([{"date": D5, "policy_version": "2025-11-07@ffffff", "source": "policy"}])
    assert look_ahead_flags(orphan, training)["look_ahead"].tolist() == [True]
    assert look_ahead_flags(orphan, pd.DataFrame())["look_ahead"].tolist() == [True]


def test_look_ahead_days_and_filtering_keep_the_pairs():
    training = chain(override_day=D2, override_to=D4)
    notes = notes_of(training)
    days = look_ahead_days(notes, training)
    assert sorted(days) == [D2, D3]
    kept = without_days(notes, days)
    assert sorted(set(kept["date"])) == [D1, D4, D5] and set(kept["source"]) == {"policy", "base"}
    assert len(without_days(notes, {})) == len(notes)


def test_policy_training_without_the_needed_columns_is_a_clear_error():
    with pytest.raises(ValueError, match="parent_version"):
        headlines_seen(pd.DataFrame({"date": [D1], "policy_version": ["x"]}))


def test_lookahead_inputs_flag_the_rows_by_what_each_metric_reads():
    training = chain(override_day=D2, override_to=D4)
    notes = notes_of(training)
    table = pd.DataFrame({"metric": ["structure_score", "judge_win_rate", "hit_rate", "mean_vs_spy_pct"]})
    own = notes[notes["date"] == D2]
    left_out = LookAheadInputs.of(own, notes, training)
    assert left_out.own_left_out and sorted(set(left_out.kept_outcomes(notes)["date"])) == [D1, D4, D5]
    flagged = left_out.flag_rows(table)
    assert flagged["look_ahead"].tolist() == [True] * 4
    assert flagged["look_ahead_days"].str.startswith("left out: ").all()
    assert flagged.loc[2, "look_ahead_days"].count("(") == 2  # days 2 and 3 among the outcomes
    included = LookAheadInputs.of(own, notes, training, include=True)
    assert not included.own_left_out and len(included.kept_outcomes(notes)) == len(notes)
    assert included.flag_rows(table)["look_ahead_days"].str.startswith("included: ").all()
    clean = LookAheadInputs.of(notes[notes["date"] == D5], notes[notes["date"] >= D4], training)
    assert clean.flag_rows(table)["look_ahead"].tolist() == [False] * 4 and not clean.own_left_out
    assert (clean.flag_rows(table)["look_ahead_days"] == "").all()
