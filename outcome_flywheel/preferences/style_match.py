"""Style-match scoring and adapter training over the framework-neutral `ModelBackend` interface.

The adapter learned (weighted DPO) from pairs that set a plan against holding or against the
operator's own orders. Its implicit reward of a plan y for the decision's prompt x is the DPO one,

    r(y) = log pi(y | x) - log ref(y | x)        (pi = base + adapter, ref = base),

summed over tokens and, with the `line` unit, over the plan's lines (outcome_flywheel/models/segments.py),
the same log-probs the trainer contrasted. A proposal is read against holding, as the pairs read it:

    margin_logp       = r(candidate) - r(hold)
    style_match_score = sigmoid(beta * margin_logp)

the probability, in the adapter's Bradley-Terry model, that the operator prefers the candidate to
holding (0.5 = indifferent). `unit` and `beta` are those the adapter was trained with
(`scoring_settings` reads them from its train_info.json).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from outcome_flywheel.models.interface import Messages, ModelBackend
from outcome_flywheel.models.segments import encode_segments, flatten_segments
from outcome_flywheel.preferences.metrics import sigmoid
from outcome_flywheel.preferences.status import TRAIN_INFO
from outcome_flywheel.preferences.weighting import HOLD_TEXT


def scoring_settings(adapter_dir: Path | None = None) -> tuple[str, float]:
    """(completion unit, beta) the adapter in `adapter_dir` was trained with; the trainer's defaults
    when there is no record. An adapter recorded without a unit predates line scoring: `sequence`."""
    from outcome_flywheel.models.train.dpo_config import WeightedDPOConfig

    defaults = WeightedDPOConfig()
    info_path = Path(adapter_dir) / TRAIN_INFO if adapter_dir else None
    if info_path is None or not info_path.exists():
        return defaults.completion_unit, defaults.beta
    config = json.loads(info_path.read_text()).get("config", {})
    return str(config.get("completion_unit", "sequence")), float(config.get("beta", defaults.beta))


def implicit_rewards(
    backend: ModelBackend, prompts: Sequence[Messages], completions: Sequence[str], unit: str
) -> np.ndarray:
    """r(y) = log pi(y|x) - log ref(y|x) per completion, summed over tokens and segments."""
    segments = [encode_segments(backend.encode_response, text, unit) for text in completions]
    flat_prompts, flat_responses, owner = flatten_segments(prompts, segments)
    with_adapter = backend.response_logprobs(flat_prompts, flat_responses, use_adapter=True)
    base = backend.response_logprobs(flat_prompts, flat_responses, use_adapter=False)
    per_row = np.array(
        [float(np.sum(a, dtype=np.float64)) - float(np.sum(b, dtype=np.float64)) for a, b in zip(with_adapter, base)]
    )
    return np.bincount(np.asarray(owner, dtype=int), weights=per_row, minlength=len(completions))


def score_candidates(
    backend: ModelBackend, prompts: Sequence[Messages], candidates: Sequence[str], unit: str, beta: float
) -> tuple[np.ndarray, np.ndarray]:
    """(margin_logp, style_match_score) per candidate; the backend must hold the adapter."""
    if not backend.has_adapter:
        raise ValueError("style scores need a preference adapter loaded on the backend")
    prompts = list(prompts)
    rewards = implicit_rewards(backend, prompts + prompts, list(candidates) + [HOLD_TEXT] * len(prompts), unit)
    n = len(prompts)
    margin = rewards[:n] - rewards[n:]
    return margin, np.array([sigmoid(beta * float(m)) for m in margin])


def training_pairs(pairs: pd.DataFrame):
    """`PreferencePair`s of the training split with their exact weights (swaps already applied)."""
    from outcome_flywheel.models.train.dpo_config import PreferencePair

    train = pairs[pairs["split"] == "train"].sort_values("decision_id")
    return [
        PreferencePair(
            prompt=json.loads(r.prompt), chosen=r.chosen, rejected=r.rejected, weight=float(r.effective_weight)
        )
        for r in train.itertuples(index=False)
    ]


def score_holdout(backend: ModelBackend, pairs: pd.DataFrame, unit: str, beta: float) -> pd.DataFrame:
    """Every holdout decision's proposal scored against its own prompt."""
    hold = pairs[pairs["split"] == "holdout"].sort_values("decision_id").reset_index(drop=True)
    cols = ["decision_id", "decision_date", "decision", "verdict", "vs_spy_pct", "proposal_plan"]
    out = hold[cols].copy()
    if hold.empty:
        out["margin_logp"] = pd.Series(dtype=float)
        out["style_match_score"] = pd.Series(dtype=float)
        return out
    m, s = score_candidates(
        backend, [json.loads(p) for p in hold["prompt"]], hold["proposal_plan"].tolist(), unit, beta
    )
    out["margin_logp"] = m
    out["style_match_score"] = s
    return out
