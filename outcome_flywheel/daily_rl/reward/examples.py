"""GSPO training examples from D-1's scored notes: each usable note's sampled tokens, behaviour
log-probs and per-token advantages (the whole-note part and the call-line parts, `credit`)."""

from __future__ import annotations

import json
import zlib

import pandas as pd

from outcome_flywheel.daily_rl.reward.signals import RewardConfig


def training_examples(
    rollouts: pd.DataFrame,
    scores: pd.DataFrame,
    min_abs_advantage: float = 1e-8,
    with_keys: bool = False,
    reward: RewardConfig | None = None,
    tokenizer=None,
    relevance_span: str = "ticker",
    name_c: float = 0.0,
):
    """GSPO examples from the usable scored rollouts (notes whose every token's advantage is 0 carry no
    gradient); with `with_keys`, also each example's (note date, headline_id, rollout_index).

    Without `reward`: one advantage per note, `advantage` (whole-note signals only). With it and the
    policy's `tokenizer`: the note's advantage share(note) * advantage (the sequence part) and
    share(relevance) * relevance_advantage on the call's `relevance_span` (`credit.py`; the whole call line
    where that span selects no token, the whole note where there is no call line). `name_c` > 0 (with a
    tokenizer): a call with a side carries the counterfactual name term (`counterfactual.name_counterfactual`:
    a call on another company against the headline's, one on the headline's company against a decoy, one of
    the day's other headlines' companies picked by the note's key), so it trains even where its advantages are 0."""
    from outcome_flywheel.daily_rl.reward.counterfactual import name_counterfactual
    from outcome_flywheel.daily_rl.reward.credit import call_token_mask, judged_token_advantages
    from outcome_flywheel.models.train.gspo_config import GSPOExample

    if rollouts.empty or scores.empty:
        return ([], []) if with_keys else []
    columns = ["headline_id", "rollout_index", "advantage", "usable"]
    relevance = "relevance_advantage" in scores.columns
    merged = rollouts.merge(
        scores[columns + (["relevance_advantage"] if relevance else [])],
        on=["headline_id", "rollout_index"],
        how="inner",
    )
    if not relevance:
        merged["relevance_advantage"] = 0.0
    merged["relevance_advantage"] = merged["relevance_advantage"].fillna(0.0)
    if reward is None:
        keep = merged["advantage"].abs() > min_abs_advantage
    else:
        keep = (merged["advantage"].abs() * reward.share("note") > min_abs_advantage) | (
            merged["relevance_advantage"].abs() * reward.share("relevance") > min_abs_advantage
        )
    decoys = day_companies(rollouts) if name_c else []
    merged = merged[merged["usable"] & merged["response_ids"].map(len).gt(0)]
    merged = merged.sort_values(["headline_id", "rollout_index"])
    examples, kept = [], []
    for r, trains in zip(merged.itertuples(), keep.loc[merged.index]):
        ids = [int(t) for t in r.response_ids]
        headline = (getattr(r, "title", None), getattr(r, "summary", None))
        pick = zlib.crc32(f"{r.headline_id}/{r.rollout_index}".encode())
        term = name_counterfactual(tokenizer, ids, r.response, headline, name_c, decoys, pick)
        if not trains and term is None:
            continue
        name = call_token_mask(tokenizer, ids, r.response, "ticker") if tokenizer is not None else None
        token_adv = None
        if reward is not None and reward.share("relevance") and float(r.relevance_advantage):
            mask = None
            if tokenizer is not None:
                span = (
                    name if relevance_span == "ticker" else call_token_mask(tokenizer, ids, r.response, relevance_span)
                )
                mask = span or call_token_mask(tokenizer, ids, r.response)  # no such span: the whole call line
            token_adv = judged_token_advantages(reward, len(ids), float(r.relevance_advantage), mask)
        examples.append(
            GSPOExample(
                prompt=json.loads(r.prompt),
                response_ids=ids,
                behavior_logprobs=[float(x) for x in r.behavior_logprobs],
                advantage=float(r.advantage) * (reward.share("note") if reward is not None else 1.0),
                token_advantages=token_adv,
                counterfactual=term,
                name_mask=name,
            )
        )
        kept.append((str(r.date), str(r.headline_id), int(r.rollout_index)))
    return (examples, kept) if with_keys else examples


def day_companies(rollouts: pd.DataFrame) -> list[str]:
    """The first company each of the day's headlines names (`relevance.headline_symbols`), each once, sorted:
    the name term's decoys."""
    from outcome_flywheel.daily_rl.notes.relevance import headline_symbols

    heads = rollouts.drop_duplicates("headline_id")
    named = (headline_symbols(t, s) for t, s in zip(heads.get("title", []), heads.get("summary", [])))
    return sorted({found[0] for found in named if found})
