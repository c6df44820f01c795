"""The evaluation gate's decisions on fake models: loss, KL budget, probe regression, thresholds."""

import json

import numpy as np
import pandas as pd
import pytest

from outcome_flywheel.daily_rl.policy.gate import GateConfig, evaluate_update
from outcome_flywheel.daily_rl.policy.rollouts import generate_rollouts
from outcome_flywheel.models.interface import TrainStats
from outcome_flywheel.models.train.gspo import train_gspo
from outcome_flywheel.models.train.gspo_config import GSPOConfig, GSPOExample

FULL_NOTE = "\n".join(
    f"{s}: x" for s in ("Trade Recommendation", "Rationale", "Risk Factors", "Timeframe", "Position Size", "Stop Loss")
)


class FakePolicy:
    """KL `kl_per_token` to any reference it is given; `kl_to_base` with its adapter off (reference None)."""

    def __init__(self, kl_per_token: float, note: str, kl_to_base: float | None = None):
        self.kl_per_token, self.note, self.kl_base = kl_per_token, note, kl_to_base
        self.has_adapter = kl_to_base is not None
        self.kl_reference = None

    def token_kl(self, prompts, responses, temperature=1.0, reference=None, **_):
        if reference is None:
            assert self.has_adapter, "the KL to the base of a policy without an adapter needs the base"
            return [np.full(len(r), self.kl_base) for r in responses]
        self.kl_reference = reference
        return [np.full(len(r), self.kl_per_token) for r in responses]

    def token_kls(self, prompts, responses, pairs, temperature=1.0, **_):
        """Each (p, q) as p's `token_kl` to q (None: the base the fakes share)."""
        return [p.token_kl(prompts, responses, temperature, reference=q) for p, q in pairs]

    def greedy(self, prompts, max_new_tokens):
        return [self.note] * len(prompts)


TRAINED_ON = pd.DataFrame(
    {
        "headline_id": ["h1", "h1"],
        "rollout_index": [0, 1],
        "prompt": [json.dumps([])] * 2,
        "response_ids": [[1, 2, 3], [4, 5]],
        "temperature": [0.8, 0.8],
    }
)
HEADLINES = pd.DataFrame({"headline_id": ["b", "a"], "title": ["B news", "A news"], "summary": ["", ""]})


def _stats(*losses):
    stats = TrainStats()
    for loss in losses:
        stats.record(loss, 1.0, {})
    return stats


NO_BOUND = GateConfig(max_kl_to_base=None)  # the fakes below without an adapter: the bound has its own tests


def _gate(candidate, stats=None, config=NO_BOUND, parent=None):
    parent = parent or FakePolicy(0.0, FULL_NOTE)
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
    assert (
        _gate(FakePolicy(0.3, FULL_NOTE), config=GateConfig(max_kl_to_parent=0.5, max_kl_to_base=None))[0].verdict
        == "accepted"
    )


def test_probe_regression_is_rejected_within_tolerance_accepted():
    half = "\n".join(FULL_NOTE.splitlines()[:3])  # 3 of the 6 sections
    result, _ = _gate(FakePolicy(0.0, half))
    assert (
        result.verdict == "rejected"
        and "probe regression: structure 0.500 vs the parent's 1.000 on 2 headlines" in result.reason
    )
    assert (
        _gate(FakePolicy(0.0, half), config=GateConfig(max_probe_regression=0.5, max_kl_to_base=None))[0].verdict
        == "accepted"
    )


def test_thresholds_are_validated():
    for bad in (
        dict(max_kl_to_parent=0),
        dict(max_probe_regression=-0.1),
        dict(probe_headlines=0),
        dict(max_kl_to_base=0),
        dict(max_kl_to_base=float("nan")),
        dict(max_kl_to_base=float("inf")),
        dict(max_kl_to_base="0.1"),
    ):
        with pytest.raises(ValueError):
            GateConfig(**bad)


# How each rule names itself in the verdict's reason (what `policy_training.gate_reason` records).
RULES = {"loss": "training loss", "kl": "KL to the parent", "bound": "KL to the base", "probe": "probe regression"}
HALF_NOTE = "\n".join(FULL_NOTE.splitlines()[:3])  # 3 of the 6 sections: structure 0.5


def _rules_named(reason: str) -> list[str]:
    return [rule for rule, words in RULES.items() if words in reason]


@pytest.mark.parametrize(
    "rule, candidate, stats",
    [
        ("loss", FakePolicy(0.0, FULL_NOTE), _stats(0.1, float("inf"))),
        ("loss", FakePolicy(0.0, FULL_NOTE), TrainStats()),  # no step ran: nothing shows the update is sane
        ("kl", FakePolicy(0.3, FULL_NOTE), None),
        ("kl", FakePolicy(float("nan"), FULL_NOTE), None),
        ("probe", FakePolicy(0.0, HALF_NOTE), None),
    ],
    ids=["inf-loss", "no-step", "kl-over-budget", "kl-nan", "probe-regression"],
)
def test_a_rejection_names_the_one_rule_that_rejected(rule, candidate, stats):
    result, _ = _gate(candidate, stats)
    assert result.verdict == "rejected"
    assert _rules_named(result.reason) == [rule], result.reason


def test_a_nan_kl_is_said_to_be_not_finite_not_over_the_budget():
    result, _ = _gate(FakePolicy(float("nan"), FULL_NOTE))
    assert result.reason.startswith("KL to the parent is not a finite number (nan)"), result.reason


def test_the_rules_are_applied_in_order_and_the_first_that_fails_is_named():
    # every rule would fail: the loss is named (its KL and probe are never measured)
    result, _ = _gate(FakePolicy(0.3, HALF_NOTE), _stats(float("nan")))
    assert _rules_named(result.reason) == ["loss"] and result.kl_to_parent != result.kl_to_parent
    # the KL and the probe would fail: the KL is named
    result, _ = _gate(FakePolicy(0.3, HALF_NOTE))
    assert _rules_named(result.reason) == ["kl"] and result.probe_structure == 0.5


def test_an_accepted_update_says_every_rule_passed():
    result, _ = _gate(FakePolicy(0.01, FULL_NOTE))
    assert result.verdict == "accepted"
    assert (
        result.reason
        == "loss finite; KL to the parent 0.01 <= 0.25; probe structure 1.000 vs the parent's 1.000 on 2 headlines"
    )


BOUND = GateConfig(max_kl_to_base=0.3)


def test_the_bound_is_on_by_default():
    assert GateConfig().max_kl_to_base == 0.2


def test_the_bound_keeps_the_parent_when_a_day_would_move_the_policy_further_than_it_from_the_base():
    parent = FakePolicy(0.0, FULL_NOTE, kl_to_base=0.2)
    result, _ = _gate(FakePolicy(0.01, FULL_NOTE, kl_to_base=0.35), config=BOUND, parent=parent)
    assert result.verdict == "rejected" and _rules_named(result.reason) == ["bound"], result.reason
    assert "KL to the base 0.35 nats/token is over the bound 0.3 and the parent's 0.2" in result.reason
    assert result.columns()["gate_kl_to_base"] == pytest.approx(0.35)
    # within the bound: accepted, and the reason says the bound held
    result, _ = _gate(FakePolicy(0.01, FULL_NOTE, kl_to_base=0.25), config=BOUND, parent=parent)
    assert result.verdict == "accepted" and "KL to the base 0.25 within the bound 0.3" in result.reason
    # a parent already past the bound (the bound was lowered): a day back toward the base is taken ...
    far = FakePolicy(0.0, FULL_NOTE, kl_to_base=0.5)
    assert _gate(FakePolicy(0.01, FULL_NOTE, kl_to_base=0.45), config=BOUND, parent=far)[0].verdict == "accepted"
    # ... and one further away is not
    assert _gate(FakePolicy(0.01, FULL_NOTE, kl_to_base=0.55), config=BOUND, parent=far)[0].verdict == "rejected"
    # the first trained day: the parent is the base (no adapter), its KL to itself is 0
    result, _ = _gate(FakePolicy(0.01, FULL_NOTE, kl_to_base=0.35), config=BOUND)
    assert result.verdict == "rejected" and result.parent_kl_to_base == 0.0
    # a broken candidate is said to be broken, not over the bound
    result, _ = _gate(FakePolicy(0.01, FULL_NOTE, kl_to_base=float("nan")), config=BOUND, parent=parent)
    assert result.reason.startswith("KL to the base is not a finite number (nan)"), result.reason


def test_without_the_bound_the_kl_to_the_base_is_not_measured():
    result, _ = _gate(FakePolicy(0.01, FULL_NOTE, kl_to_base=9.0))
    assert result.verdict == "accepted" and np.isnan(result.kl_to_base) and "base" not in result.reason


def _trained(model_backend, rollouts, learning_rate):
    """A candidate trained with GSPO from the base on `rollouts`, best notes of each group up, worst down."""
    advantages = np.tile(np.linspace(-1.5, 1.5, 4), len(rollouts) // 4)
    examples = [
        GSPOExample(json.loads(r.prompt), list(r.response_ids), list(r.behavior_logprobs), float(a))
        for r, a in zip(rollouts.itertuples(), advantages)
    ]
    candidate = model_backend.load()
    candidate.framework.seed(1)
    stats = train_gspo(
        candidate, examples, GSPOConfig(learning_rate=learning_rate, batch_size=4, temperature=0.8, epochs=1)
    )
    return candidate, stats


def test_on_tiny_local_a_healthy_update_is_accepted_and_a_destructive_one_rejected_by_the_kl_budget(model_backend):
    """Real GSPO steps on tiny-local (not fakes): a small learning rate moves the policy a little and
    passes every rule; a learning rate of 5 blows the distribution apart and the KL budget rejects it."""
    headlines = pd.DataFrame(
        {
            "headline_id": ["h1", "h2"],
            "title": ["Apple beats quarterly estimates", "Boeing recalls products"],
            "summary": ["Revenue rose 8%.", ""],
        }
    )
    parent = model_backend.load()
    rollouts = generate_rollouts(parent, headlines, "2025-11-05", 0, 4, 32, "base:tiny-local")
    config = GateConfig(probe_headlines=2, probe_max_new_tokens=40)

    candidate, stats = _trained(model_backend, rollouts, 1e-3)
    healthy = evaluate_update(candidate, parent, stats, rollouts, headlines, config)
    assert healthy.verdict == "accepted", healthy.reason
    assert 0 < healthy.kl_to_parent < config.max_kl_to_parent  # it moved, within the budget
    assert (
        len(healthy.probe_notes) == 2
        and healthy.probe_structure >= healthy.probe_parent_structure - config.max_probe_regression
    )

    candidate, stats = _trained(model_backend, rollouts, 5.0)
    destructive = evaluate_update(candidate, parent, stats, rollouts, headlines, config)
    assert np.isfinite(stats.losses).all()  # the loss alone does not show it: the KL does
    assert destructive.verdict == "rejected" and _rules_named(destructive.reason) == ["kl"], destructive.reason
    assert destructive.kl_to_parent > config.max_kl_to_parent

    # the bound on its own (the parent's budget out of the way): the same candidate is too far from the base
    bounded = GateConfig(
        probe_headlines=2, probe_max_new_tokens=40, max_kl_to_parent=1e9, max_kl_to_base=config.max_kl_to_parent
    )
    destructive = evaluate_update(candidate, parent, stats, rollouts, headlines, bounded)
    assert destructive.verdict == "rejected" and _rules_named(destructive.reason) == ["bound"], destructive.reason
    # the parent is the base: the KL to the base is the KL to the parent, measured with the adapter off
    assert destructive.parent_kl_to_base == 0.0
    # two fp32 forwards of the same weights (the base loaded vs the adapter switched off): per-token
    # differences of ~1e-6 nats against a KL over 0.25, so 1e-3 relative is far outside rounding
    assert destructive.kl_to_base == pytest.approx(destructive.kl_to_parent, rel=1e-3)
