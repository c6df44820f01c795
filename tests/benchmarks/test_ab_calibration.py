"""`benchmarks.ab_calibration`'s simulated notes carry text the A/B reads back: each note's call and its headline's
company, so the share of calls on the company is labelled like the other metrics."""

from __future__ import annotations

import numpy as np

from benchmarks import ab_calibration as ab
from outcome_flywheel.daily_rl.evaluation.ab import with_relevance
from outcome_flywheel.daily_rl.notes.calls import parse_call


def test_a_notes_text_parses_back_to_its_call():
    for symbol in (*ab.WALK_SYMBOLS, "AMZN", "GOOGL"):
        for side, word in ((1, "long"), (-1, "short")):
            call = parse_call(ab.note_text(symbol, side))
            assert (call.symbol, call.side, call.parse_status) == (symbol, word, "ok")
    assert parse_call(ab.note_text(None, 0)).parse_status == "no_trade"


def test_a_simulated_run_has_the_relevance_the_calls_say():
    rng = np.random.default_rng(0)
    closes = ab.random_walk(rng, 12, list(ab.WALK_SYMBOLS))
    rollouts, baseline, outcomes, _, _ = ab.simulate(rng, closes, 10, 1, 0.0, 0.0)
    for notes in (rollouts, baseline):
        relevance = with_relevance(notes)["relevance"]
        assert relevance.notna().all()  # every title names its topic's ticker
        assert 0.0 < relevance.mean() < 1.0
    rng = np.random.default_rng(1)
    labels = ab.labels_of(rng, ab.random_walk(rng, 12, list(ab.WALK_SYMBOLS)), 10, 1, 0.0, walk=True)
    assert set(ab.METRICS) <= set(labels) and labels["headline_company_share"] != "not enough data"
