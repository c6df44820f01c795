"""FLYWHEEL_NOTE_FORMAT: the note prompt every part of the daily loop samples under (policy, baseline, gate,
prompt evolver), and a note that follows `call_first` is read as a call on its ticker."""

import json

import dagster as dg
import pytest

from outcome_flywheel.daily_rl.notes.calls import parse_call
from outcome_flywheel.models.prompts import CALL_FIRST_LINE, NOTE_SECTIONS, note_messages, trading_note_messages
from outcome_flywheel.settings import settings_problems
from pipelines.daily_rl import DAILY_RL_ASSETS
from tests.daily_fixtures import daily_resources, linked_data_dir

SMALL = {"ops": {"daily_update": {"config": {"rollouts_per_headline": 2, "max_new_tokens": 24, "batch_size": 8}}}}


def test_sections_is_the_default_and_call_first_adds_the_call_line(monkeypatch):
    monkeypatch.delenv("FLYWHEEL_NOTE_FORMAT", raising=False)
    user = trading_note_messages("Oracle recalls products", "Units sold over two years.")[1]["content"]
    assert user.endswith(", ".join(NOTE_SECTIONS) + ".") and CALL_FIRST_LINE not in user
    monkeypatch.setenv("FLYWHEEL_NOTE_FORMAT", "call_first")
    for messages in (
        trading_note_messages("Oracle recalls", ""),
        note_messages("Oracle recalls", "", "An evolved system"),
    ):
        assert messages[1]["content"].endswith(CALL_FIRST_LINE)
    # an explicit format wins over the variable (tiny-local's build is always trained on `sections`)
    assert CALL_FIRST_LINE not in trading_note_messages("Oracle recalls", "", "sections")[1]["content"]


def test_an_unknown_format_is_refused_with_the_choices(monkeypatch):
    with pytest.raises(ValueError, match="sections, call_first"):
        trading_note_messages("Oracle recalls", "", "prose")
    problems = settings_problems({"FLYWHEEL_NOTE_FORMAT": "prose"})
    assert len(problems) == 1 and "call_first" in problems[0]


@pytest.mark.parametrize("line, side, symbol", [("Buy ORCL", "long", "ORCL"), ("Sell NVDA", "short", "NVDA")])
def test_a_note_that_opens_on_its_call_is_read_as_that_call(line, side, symbol):
    call = parse_call(f"Trade Recommendation: {line}\nRationale: the recall.\nTimeframe: 5 days\nStop Loss: 3%")
    assert (call.parse_status, call.side, call.symbol) == ("ok", side, symbol)


def test_the_loop_samples_policy_and_baseline_under_the_format(tmp_path, tiny_model_dir, monkeypatch):
    root = linked_data_dir(tmp_path / "data", tiny_model_dir)
    monkeypatch.setenv("FLYWHEEL_DATA_DIR", str(root))
    monkeypatch.setenv("FLYWHEEL_NOTE_FORMAT", "call_first")
    res = daily_resources(root)
    day = "2025-11-03"
    assert dg.materialize(DAILY_RL_ASSETS, partition_key=day, resources=res, run_config=SMALL).success
    for table in ("rollouts", "baseline_rollouts"):
        prompts = res["warehouse"].read(table, day)["prompt"]
        assert len(prompts) and all(json.loads(p)[1]["content"].endswith(CALL_FIRST_LINE) for p in prompts), table
