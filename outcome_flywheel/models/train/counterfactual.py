"""The counterfactual side term of a GSPO minibatch (formula and papers: `gspo_config.py`; the rows:
`daily_rl/reward/counterfactual.py`), written once for torch and mlx: the own side's probability comes
from the minibatch's own forward, the other side's from one more forward over the teacher-forced rows."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Sequence

import numpy as np

from outcome_flywheel.models.interface import ModelBackend
from outcome_flywheel.models.train.batching import EncodedExample, padded


def other_rows(batch: Sequence[EncodedExample]) -> list[EncodedExample]:
    """The teacher-forced other-side rows of the examples that carry the term, in batch order."""
    return [
        replace(b, response_ids=list(b.counterfactual.other_response_ids), counterfactual=None)
        for b in batch
        if b.counterfactual is not None
    ]


def side_term(
    backend: ModelBackend,
    batch: Sequence[EncodedExample],
    logp: Any,
    logprobs: Callable[[Sequence[EncodedExample]], tuple[Any, Any]],
    normaliser: float,
    on: bool = True,
) -> tuple[Any, dict[str, float]]:
    """-sum_i c_i (pi_theta(own_i) - pi_theta(other_i)) / Z over the batch's examples with a counterfactual
    (`logp`: the batch's own forward, [B, T]); a zero loss when none has one or the term is not `on` (past
    `counterfactual_epochs`). Metrics (the framework's scalars):
    the term's value and the mean own and other side probabilities (NaN where no example has the term)."""
    fw = backend.framework
    if fw.side_probability_loss is None:
        raise ValueError(f"the {fw.name} framework has no side_probability_loss for the counterfactual side term")
    if not on:
        batch = [replace(b, counterfactual=None) for b in batch]
    width = max(len(b.response_ids) for b in batch)
    own_mask = padded([b.counterfactual.own_mask if b.counterfactual else [] for b in batch], width)
    coefficients = np.array([b.counterfactual.coefficient if b.counterfactual else 0.0 for b in batch], np.float32)
    loss, own = fw.side_probability_loss(
        logp, fw.as_array(backend, own_mask), fw.as_array(backend, coefficients), normaliser
    )
    others = other_rows(batch)
    other = own  # no carrier: a zero loss, NaN probabilities (the metrics keep their keys and types)
    if others:
        other_logp, _ = logprobs(others)
        carriers = [b.counterfactual for b in batch if b.counterfactual is not None]
        other_mask = padded([c.other_mask for c in carriers], max(len(b.response_ids) for b in others))
        other_coefficients = np.array([-c.coefficient for c in carriers], np.float32)
        other_loss, other = fw.side_probability_loss(
            other_logp, fw.as_array(backend, other_mask), fw.as_array(backend, other_coefficients), normaliser
        )
        loss = loss + other_loss
    return loss, {
        "counterfactual_loss": own["side_loss"] + (other["side_loss"] if others else 0.0),
        "side_probability_own": own["side_probability"],
        "side_probability_other": other["side_probability"],
    }
