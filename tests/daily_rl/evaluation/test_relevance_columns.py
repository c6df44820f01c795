"""`evaluation.ab.with_relevance` says which column is missing (it raised a bare KeyError: 'response' on notes
without text, which is how `benchmarks.ab_calibration` broke when the share of calls on the company came in)."""

from __future__ import annotations

import pandas as pd
import pytest

from outcome_flywheel.daily_rl.evaluation.ab import evaluate_day, with_relevance


def _notes(**columns) -> pd.DataFrame:
    base = dict(date="2025-11-05", headline_id=["h0", "h0"], rollout_index=[0, 1], structure_score=0.5)
    return pd.DataFrame({**base, **columns})


def test_notes_without_text_are_a_clear_error():
    with pytest.raises(ValueError, match=r"needs the notes' columns \['response'\]"):
        with_relevance(_notes(title="Apple shares jump"))
    with pytest.raises(ValueError, match=r"\['response', 'title'\]"):
        evaluate_day(_notes(), _notes(), pd.DataFrame(columns=["date", "source", "status"]), pd.DataFrame())


def test_notes_with_text_and_title_are_read_without_a_summary():
    notes = _notes(title="Apple shares jump", response=["Trade Recommendation: Buy AAPL.", "No trade today."])
    assert with_relevance(notes)["relevance"].tolist() == [1.0, 0.0]
    assert with_relevance(notes.iloc[:0])["relevance"].empty  # no notes: nothing to read
