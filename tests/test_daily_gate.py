"""The evaluation gate's decisions on fake models: loss, KL budget, probe regression, thresholds."""

import json

import numpy as np
import pandas as pd
import pytest

from outcome_flywheel.daily_rl.gate import GateConfig, evaluate_update
from outcome_flywheel.models.interface import TrainStats

FULL_NOTE = "\n".join(f"{s}: x" for s in ("Trade Recommendation", "Rationale", "Risk Factors", "Timeframe", "Position Size", "Stop Loss"))


class FakePolicy:
    def __init__(self, kl_per_token: float, note: str):
        self.kl_per_token, self.note = kl_per_token, note
        self.kl_reference = None

    def token_kl(self, prompts, responses, temperature=1.0, reference=None, **_):
        self.kl_reference = reference
        return [np.full(len(r), self.kl_per_token) for r in responses]

    def greedy(self, prompts, max_new_tokens):
        return [self.note] * len(prompts)


TRAINED_ON = pd.DataFrame({"headline_id": ["h1", "h1"], "rollout_index": [0, 1], "prompt": [json.dumps([])] * 2,
                           "response_ids": [[1, 2, 3], [4, 5]], "temperature": [0.8, 0.8]})
HEADLINES = pd.DataFrame({"headline_id": ["b", "a"], "title": ["B news", "A news"], "summary": ["", ""]})


def _stats(*losses):
    stats = TrainStats()
    for loss in losses:
        stats.record(loss, 1.0, {})
    return stats


def _gate(candidate, stats=None, config=GateConfig()):
    parent = FakePolicy(0.0, FULL_NOTE)
    return evaluate_update(candidate, parent, stats or _stats(0.1, 0.2), TRAINED_ON, HEADLINES, config), parent


def test_a_sane_update_is_accepted_and_measured_against_the_parent():
    candidate = FakePolicy(0.01, FULL_NOTE)
    result, parent = _gate(candidate)
    assert result.verdict == "accepted" and candidate.kl_reference is parent
    assert result.kl_to_parent == pytest.approx(0.01) and result.probe_structure == result.probe_parent_structure == 1.0


def test_non_finite_loss_is_rejected():
    result, _ = _gate(FakePolicy(0.0, FULL_NOTE), _stats(0.1, float("nan")))
    assert result.verdict == "rejected" and "non-finite training loss (1 of 2 steps)" in result.reason


def test_kl_over_budget_is_rejected():
    result, _ = _gate(FakePolicy(0.3, FULL_NOTE))
    assert result.verdict == "rejected" and "over the budget 0.25" in result.reason
    assert _gate(FakePolicy(0.3, FULL_NOTE), config=GateConfig(max_kl_to_parent=0.5))[0].verdict == "accepted"


def test_probe_regression_is_rejected_within_tolerance_accepted():
    half = "\n".join(FULL_NOTE.splitlines()[:3])  # 3 of the 6 sections
    result, _ = _gate(FakePolicy(0.0, half))
    assert result.verdict == "rejected" and "probe regression: structure 0.500 vs the parent's 1.000 on 2 headlines" in result.reason
    assert _gate(FakePolicy(0.0, half), config=GateConfig(max_probe_regression=0.5))[0].verdict == "accepted"


def test_thresholds_are_validated():
    for bad in (dict(max_kl_to_parent=0), dict(max_probe_regression=-0.1), dict(probe_headlines=0)):
        with pytest.raises(ValueError):
            GateConfig(**bad)
