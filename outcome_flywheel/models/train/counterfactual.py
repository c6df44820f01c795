"""The counterfactual term of a GSPO minibatch (formula and papers: `gspo_config.py`; the rows:
`daily_rl/reward/counterfactual.py`), written once for torch and mlx: the own action's probability comes
from the minibatch's own forward, the other action's from one more forward over the teacher-forced rows."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Sequence

import numpy as np

from outcome_flywheel.models.interface import ModelBackend
from outcome_flywheel.models.train.batching import EncodedExample, padded


def other_rows(batch: Sequence[EncodedExample]) -> list[EncodedExample]:
    """The teacher-forced other-side rows of the examples that carry the term, in batch order."""
    return [
        replace(b, response_ids=list(b.counterfactual.other_response_ids), counterfactual=None, name_mask=None)
        for b in batch
        if b.counterfactual is not None
    ]


# The decision each example's term is about, by the reward part the example carries: the side of a matured call,
# the name of a judged one (`daily_rl/reward/counterfactual.py`); reported apart, as `<decision>_probability_*`.
DECISIONS = {"side": "price", "name": "relevance"}


def counterfactual_term(
    backend: ModelBackend,
    batch: Sequence[EncodedExample],
    logp: Any,
    logprobs: Callable[[Sequence[EncodedExample]], tuple[Any, Any]],
    normaliser: float,
    on: bool = True,
    form: str = "probability",
) -> tuple[Any, dict[str, float]]:
    """-sum_i c_i (pi_theta(own_i) - pi_theta(other_i)) / Z over the batch's examples with a counterfactual
    (`logp`: the batch's own forward, [B, T]), or under `form` `pair` the logistic loss on each pair
    (`fw.side_pair_loss`; `centered_pair`: on the side pairs' margins less their mean, so a minibatch with one
    side pair trains none); a zero loss when none has one or the term is not `on` (past `counterfactual_epochs`).
    Metrics (the framework's scalars): the term's value, and per decision (side, name) the mean own and other
    action's probabilities (NaN where no example has that decision's term)."""
    fw = backend.framework
    if fw.side_probability_loss is None:
        raise ValueError(f"the {fw.name} framework has no side_probability_loss for the counterfactual term")
    if not on:
        batch = [replace(b, counterfactual=None) for b in batch]
    carriers = [b for b in batch if b.counterfactual is not None]

    def term(rows_logp, mask, coefficients, parts):
        """The term over some rows, its value as a metric, and each decision's mean probability on its rows."""
        loss, metrics = fw.side_probability_loss(rows_logp, mask, fw.as_array(backend, coefficients), normaliser)
        means = {
            decision: fw.side_probability_loss(
                rows_logp, mask, fw.as_array(backend, np.where(parts == part, coefficients, 0.0)), normaliser
            )[1]["side_probability"]
            for decision, part in DECISIONS.items()
        }
        return loss, metrics["side_loss"], means

    width = max(len(b.response_ids) for b in batch)
    coefficients = np.array([b.counterfactual.coefficient if b.counterfactual else 0.0 for b in batch], np.float32)
    own_mask = fw.as_array(
        backend, padded([b.counterfactual.own_mask if b.counterfactual else [] for b in batch], width)
    )
    loss, value, own = term(logp, own_mask, coefficients, np.array([b.token_part for b in batch]))
    other = own  # no carrier: a zero loss, NaN probabilities (the metrics keep their keys and types)
    if carriers:
        others = other_rows(carriers)
        other_logp, _ = logprobs(others)
        other_width = max(len(b.response_ids) for b in others)
        other_mask = fw.as_array(backend, padded([c.counterfactual.other_mask for c in carriers], other_width))
        other_coefficients = np.array([-c.counterfactual.coefficient for c in carriers], np.float32)
        other_loss, other_value, other = term(
            other_logp, other_mask, other_coefficients, np.array([c.token_part for c in carriers])
        )
        loss, value = loss + other_loss, value + other_value
        if form in ("pair", "centered_pair"):  # the probabilities above stay as metrics; the pair's loss trains
            if fw.side_pair_loss is None:
                raise ValueError(f"the {fw.name} framework has no side_pair_loss for counterfactual_form {form!r}")
            rows = np.array([i for i, b in enumerate(batch) if b.counterfactual is not None], dtype=np.int64)
            centring = None  # `centered_pair`: each carrier's side direction (0 on a name pair)
            if form == "centered_pair":
                centring = fw.as_array(backend, np.array([c.counterfactual.direction for c in carriers], np.float32))
            loss, pair = fw.side_pair_loss(
                logp,
                own_mask,
                fw.as_array(backend, rows),
                other_logp,
                other_mask,
                fw.as_array(backend, coefficients[rows]),
                normaliser,
                centring,
            )
            value = pair["side_loss"]
    metrics = {"counterfactual_loss": value}
    for decision in DECISIONS:
        metrics[f"{decision}_probability_own"] = own[decision]
        metrics[f"{decision}_probability_other"] = other[decision]
    return loss, metrics
