"""The counterfactual term of a GSPO minibatch (formula and papers: `gspo_config.py`; the rows:
`daily_rl/reward/counterfactual.py`), written once for torch and mlx: the own action's probability comes
from the minibatch's own forward, the other action's from one more forward over the teacher-forced rows."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from outcome_flywheel.models.interface import ModelBackend
from outcome_flywheel.models.train.batching import EncodedExample, padded

if TYPE_CHECKING:
    from outcome_flywheel.models.train.gspo_config import GSPOConfig, GSPOExample


def other_rows(batch: Sequence[EncodedExample]) -> list[EncodedExample]:
    """The teacher-forced other-side rows of the examples that carry the term, in batch order."""
    return [
        replace(b, response_ids=list(b.counterfactual.other_response_ids), counterfactual=None, name_mask=None)
        for b in batch
        if b.counterfactual is not None
    ]


def old_side_margins(
    backend: ModelBackend,
    batches: Sequence[Sequence[EncodedExample]],
    old_by_batch: Sequence[Any],
    logprobs: Callable[[Sequence[EncodedExample]], tuple[Any, Any]],
) -> list[np.ndarray]:
    """Per batch, x_old = l_own - l_other at pi_old for each example that carries the term (in batch order, as
    `other_rows`), for the lean anchor: the own rows' from `old_by_batch` (pi_old, [B, T]), the other rows' from a
    no-grad forward now, before any step; empty for a batch without a carrier."""
    fw = backend.framework
    out: list[np.ndarray] = []
    with fw.inference(backend):
        for batch, old in zip(batches, old_by_batch):
            carriers = [b for b in batch if b.counterfactual is not None]
            if not carriers:
                out.append(np.zeros(0))
                continue
            old = fw.to_numpy(old).astype(np.float64)
            own = [
                float((old[k, : len(b.response_ids)] * np.asarray(b.counterfactual.own_mask, np.float64)).sum())
                for k, b in enumerate(batch)
                if b.counterfactual is not None
            ]
            other_logp, _ = logprobs(other_rows(carriers))
            other_logp = fw.to_numpy(other_logp).astype(np.float64)
            other = [
                float(
                    (other_logp[k, : len(c.counterfactual.other_mask)] * np.asarray(c.counterfactual.other_mask)).sum()
                )
                for k, c in enumerate(carriers)
            ]
            out.append(np.array(own) - np.array(other))
    return out


def long_win_share(examples: Sequence["GSPOExample"]) -> float | None:
    """p, the lean target's share (`GSPOConfig.side_lean_target`): of the update's side pairs whose two sides'
    outcomes differ (d_i c_i != 0), the share where long did better (d_i c_i > 0), counted once a note, with one
    win and one loss added (Laplace's rule of succession: a day where one side won every pair asks for a finite
    margin); None where the update holds no such pair. Every rank reads the same `examples`."""
    signs = [
        np.sign(e.counterfactual.direction * e.counterfactual.coefficient)
        for e in examples
        if e.counterfactual is not None and e.counterfactual.direction * e.counterfactual.coefficient != 0
    ]
    return (sum(s > 0 for s in signs) + 1.0) / (len(signs) + 2.0) if signs else None


@dataclass(frozen=True)
class SideLean:
    """What the lean terms read in one minibatch (`fw.side_lean_loss`): the anchor's x_old at pi_old of its carriers
    (None: the anchor is off) and lambda, the target's share p (None: off) and weight."""

    old_margins: np.ndarray | None
    anchor: float
    long_share: float | None
    target: float


def side_leans(
    backend: ModelBackend,
    config: "GSPOConfig",
    examples: Sequence["GSPOExample"],
    batches: Sequence[Sequence[EncodedExample]],
    old_by_batch: Sequence[Any],
    logprobs: Callable[[Sequence[EncodedExample]], tuple[Any, Any]],
) -> list[SideLean] | None:
    """Per batch, the lean terms' `SideLean`, or None where both are off (or the target has no side pair to read
    and the anchor is off). The anchor's margins cost one no-grad forward of the other rows (`old_side_margins`)."""
    share = long_win_share(examples) if config.side_lean_target > 0 else None
    if not config.side_lean_anchor > 0 and share is None:
        return None
    olds = old_side_margins(backend, batches, old_by_batch, logprobs) if config.side_lean_anchor > 0 else None
    return [
        SideLean(olds[k] if olds is not None else None, config.side_lean_anchor, share, config.side_lean_target)
        for k in range(len(batches))
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
    lean: SideLean | None = None,
) -> tuple[Any, dict[str, float]]:
    """-sum_i c_i (pi_theta(own_i) - pi_theta(other_i)) / Z over the batch's examples with a counterfactual
    (`logp`: the batch's own forward, [B, T]), or under `form` `pair` the logistic loss on each pair
    (`fw.side_pair_loss`; `centered_pair`: on the side pairs' margins less their mean, so a minibatch with one
    side pair trains none); a zero loss when none has one or the term is not `on` (past `counterfactual_epochs`).
    Metrics (the framework's scalars): the term's value, and per decision (side, name) the mean own and other
    action's probabilities (NaN where no example has that decision's term). `lean` (`side_leans`) adds the lean
    terms on the side pairs (`fw.side_lean_loss`) while the term is on: the anchor and its metric `side_lean` (0
    where the term is off), the target and its metrics `side_lean_margin` (NaN where the term is off or the batch
    has no side pair) and `side_lean_share` (p)."""
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
    leaning: dict[str, Any] = {}  # the lean terms' metrics (the framework's scalars), where they ran
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
            pairs = (logp, own_mask, fw.as_array(backend, rows), other_logp, other_mask)  # both rows of each pair
            directions = None  # each carrier's side (0 on a name pair): what `centered_pair` and the lean terms read
            if form == "centered_pair" or lean is not None:
                directions = fw.as_array(backend, np.array([c.counterfactual.direction for c in carriers], np.float32))
            centring = directions if form == "centered_pair" else None
            loss, pair = fw.side_pair_loss(*pairs, fw.as_array(backend, coefficients[rows]), normaliser, centring)
            value = pair["side_loss"]
            if lean is not None:
                if fw.side_lean_loss is None:
                    raise ValueError(f"the {fw.name} framework has no side_lean_loss for the lean terms")
                old = (
                    None if lean.old_margins is None else fw.as_array(backend, np.asarray(lean.old_margins, np.float32))
                )
                lean_loss, leaning = fw.side_lean_loss(
                    *pairs, directions, old, lean.anchor, lean.long_share, lean.target
                )
                loss = loss + lean_loss
    metrics = {"counterfactual_loss": value}
    if lean is not None and lean.old_margins is not None:
        metrics["side_lean"] = leaning.get("side_lean", 0.0)
    if lean is not None and lean.long_share is not None:
        metrics["side_lean_margin"] = leaning.get("side_lean_margin", float("nan"))
        metrics["side_lean_share"] = lean.long_share
    for decision in DECISIONS:
        metrics[f"{decision}_probability_own"] = own[decision]
        metrics[f"{decision}_probability_other"] = other[decision]
    return loss, metrics
