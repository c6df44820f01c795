"""Style-match scoring and adapter training over the framework-neutral `ModelBackend` interface.

margin = mean token logp(candidate | prompt; base + adapter) - mean token logp(candidate | prompt; base)
style_match_score = sigmoid(margin)

The mean (not the sum) makes plans of different lengths comparable; the base term removes what
the base model already finds likely, so the score says what the adapter learned from the operator.
"""

from __future__ import annotations

import json
from typing import Sequence

import numpy as np
import pandas as pd

from assets.flywheel.metrics import margins, sigmoid
from resources.models.interface import Messages, ModelBackend


def score_candidates(backend: ModelBackend, prompts: Sequence[Messages], candidates: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(margin_logp, style_match_score) per candidate; the backend must hold the adapter."""
    if not backend.has_adapter:
        raise ValueError("style scores need a preference adapter loaded on the backend")
    responses = [backend.encode_response(c) for c in candidates]
    with_adapter = backend.response_logprobs(list(prompts), responses, use_adapter=True)
    base = backend.response_logprobs(list(prompts), responses, use_adapter=False)
    m = margins(with_adapter, base)
    return m, np.array([sigmoid(float(x)) for x in m])


def training_pairs(pairs: pd.DataFrame):
    """`PreferencePair`s of the training split with their exact weights (swaps already applied)."""
    from resources.models.weighted_dpo import PreferencePair

    train = pairs[pairs["split"] == "train"].sort_values("decision_id")
    return [
        PreferencePair(prompt=json.loads(r.prompt), chosen=r.chosen, rejected=r.rejected, weight=float(r.effective_weight))
        for r in train.itertuples(index=False)
    ]


def score_holdout(backend: ModelBackend, pairs: pd.DataFrame) -> pd.DataFrame:
    """Every holdout decision's proposal scored against its own prompt."""
    hold = pairs[pairs["split"] == "holdout"].sort_values("decision_id").reset_index(drop=True)
    cols = ["decision_id", "decision_date", "decision", "verdict", "vs_spy_pct", "proposal_plan"]
    out = hold[cols].copy()
    if hold.empty:
        out["margin_logp"] = pd.Series(dtype=float)
        out["style_match_score"] = pd.Series(dtype=float)
        return out
    m, s = score_candidates(backend, [json.loads(p) for p in hold["prompt"]], hold["proposal_plan"].tolist())
    out["margin_logp"] = m
    out["style_match_score"] = s
    return out
