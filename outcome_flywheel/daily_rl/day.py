"""One day of the daily loop, end to end: the recipe that calls each stage once.

`run_daily_update` is what the `daily_update` step (`day_step.py`) runs; it reads and writes the
warehouse and the dated checkpoints and returns everything the asset reports (`DailyUpdateResult`).
In order:

1. score    rollouts(D-1) ranked by the judge against headlines(D) (or of the override day H):
            `reward/rollout_scores.py`, with the note scorer's signal (`note_scorer/signal.py`)
1b. matured earlier days' notes whose price outcome is known by D, not yet trained on price
            (`reward/matured.py`; what trained is written to the `reward_ledger`, `reward/ledger.py`)
2. train    checkpoint(D-1) + GSPO (`models/train/gspo.py`) on the usable scores of D and the matured
            notes -> a candidate, which the evaluation gate (`policy/gate.py`) accepts as checkpoint(D)
            or rejects
2b. prompts the prompt evolver (`policy/prompt_evolver.py`) counts D's scores as trials of the variants
            D-1's notes were written under, maybe writes and tests a new variant, picks one per headline
3. generate 8 notes per headline of D from checkpoint(D), each headline under its variant
            (`policy/rollouts.py`)
4. verify   the checkpoint on disk loads, writes text and gives the stored behaviour log-probs back
            (`policy/verify.py`); only then is it marked verified (the next day may train from it,
            `latest` moves)"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from datetime import date
from typing import Sequence

import numpy as np
import pandas as pd

from outcome_flywheel.daily_rl.day_settings import DailyUpdateSettings, check_objective
from outcome_flywheel.daily_rl.judge.llm_judge import Judge
from outcome_flywheel.daily_rl.note_scorer.signal import scorer_signals
from outcome_flywheel.daily_rl.partitions import DailyUpdateError, previous_day, stable_seed
from outcome_flywheel.daily_rl.policy.checkpoints import (
    UnverifiedCheckpoint,
    behaviour_versions,
    load_policy,
    parent_checkpoint,
    publish_checkpoint,
    read_checkpoint,
    republish_parent,
)
from outcome_flywheel.daily_rl.policy.gate import GateResult, gate_update, not_trained
from outcome_flywheel.daily_rl.policy.prompt_evolver import PromptEvolver, heldout_scorer, prompt_writer
from outcome_flywheel.daily_rl.policy.rollouts import (
    ROLLOUT_SAMPLING,
    check_behaviour_policy,
    generate_rollouts,
    kl_to_base,
    sampling_temperature,
)
from outcome_flywheel.daily_rl.policy.verify import verify_day
from outcome_flywheel.daily_rl.reward.examples import training_examples
from outcome_flywheel.daily_rl.reward.ledger import ledger_frame
from outcome_flywheel.daily_rl.reward.matured import MaturedBatch, collect_matured
from outcome_flywheel.daily_rl.reward.rollout_scores import score_previous_rollouts
from outcome_flywheel.daily_rl.reward.training_record import judged_ledger, price_training_row
from outcome_flywheel.daily_rl.worlds.prices import judge_outcome_titles
from outcome_flywheel.models.loader import ModelLoader
from outcome_flywheel.models.train.gspo import GRADIENT_PARTS, train_gspo
from outcome_flywheel.models.train.gspo_config import GSPOConfig
from outcome_flywheel.storage import Warehouse


def quartiles(values: Sequence[float]) -> tuple[float, float]:
    """(median, inter-quartile range); NaN for no values."""
    if not len(values):
        return float("nan"), float("nan")
    q1, med, q3 = np.percentile(np.asarray(values, dtype=float), [25, 50, 75])
    return float(med), float(q3 - q1)


@dataclass
class DailyUpdateResult:
    """Everything one day's update wrote and measured, for the asset's metadata and checks."""

    day: str
    prediction_day: str
    outcome_day: str
    scores: pd.DataFrame
    rollouts: pd.DataFrame
    headlines: int
    checkpoint: dict
    checkpoint_dir: str
    training_row: dict
    price_row: dict
    ledger: pd.DataFrame
    gspo: GSPOConfig
    trained: bool
    gate: GateResult
    n_rollouts: int
    max_new_tokens: int
    timings: dict[str, float]
    checks: dict[str, dict] = field(default_factory=dict)
    prompt_variants: pd.DataFrame = field(default_factory=pd.DataFrame)  # the prompt evolver's state of D
    prompt_events: list[str] = field(default_factory=list)
    train_stats: object = None  # TrainStats of the GSPO step's per-step figures (None: not trained), for the MLflow run


def outcome_day_for(day: str, override: str | None) -> tuple[str, str]:
    """(prediction day D-1, outcome day) of partition D; the outcome day must come after D-1."""
    prediction_day = previous_day(day)
    outcome_day = override or day
    try:
        date.fromisoformat(outcome_day)
    except ValueError as err:
        raise DailyUpdateError(f"outcome_headlines_date must be YYYY-MM-DD, got {outcome_day!r}") from err
    if outcome_day <= prediction_day:
        raise DailyUpdateError(f"outcome headlines ({outcome_day}) must come after the predictions ({prediction_day})")
    return prediction_day, outcome_day


def run_daily_update(
    warehouse: Warehouse, models: ModelLoader, judge: Judge, day: str, settings: DailyUpdateSettings, market_data=None
) -> DailyUpdateResult:
    """Score yesterday's rollouts, take the matured notes of earlier days (with `market_data`), train
    the policy with GSPO, generate today's rollouts, verify; write `rollout_scores`, `reward_ledger`,
    `price_training`, `rollouts`, `policy_training` and checkpoint D. Raises `DailyUpdateError`."""
    prediction_day, outcome_day = outcome_day_for(day, settings.outcome_headlines_date)
    check_objective(settings)
    n_rollouts, max_new_tokens = settings.sizes(models)
    seed = models.seed
    timings: dict[str, float] = {}

    # The parent is checked first: nothing is scored or written when it may not be trained from.
    ckpt_root = warehouse.path("checkpoints", "policy")
    try:  # a re-run keeps the parent the first run chose (a distillation of D-1 may have come since)
        parent = parent_checkpoint(
            ckpt_root, day, pinned=(read_checkpoint(ckpt_root / day) or {}).get("parent_checkpoint")
        )
    except UnverifiedCheckpoint as err:
        raise DailyUpdateError(str(err)) from err
    lineage = behaviour_versions(ckpt_root, parent)

    started = time.perf_counter()
    prev_rollouts = warehouse.read("rollouts", prediction_day)
    try:  # pi_old must be the checkpoint this day trains, or one it was distilled from (off-policy, with TIS)
        check_behaviour_policy(prev_rollouts, parent[1]["policy_version"] if parent else None, prediction_day, lineage)
    except ValueError as err:
        raise DailyUpdateError(str(err)) from err
    off_policy = (
        bool(len(prev_rollouts))
        and parent is not None
        and set(prev_rollouts["policy_version"]) != {parent[1]["policy_version"]}
    )
    universe = market_data.universe() if market_data is not None else None
    prices_file = market_data.prices_file if market_data is not None and market_data.source == "file" else None
    scorer = scorer_signals(warehouse, prediction_day) if float(settings.reward.weights.get("scorer", 0.0)) else None
    # a world names its own follow-ups of the notes' headlines (none to name on the first day)
    world_titles = (
        judge_outcome_titles(prices_file, prev_rollouts, prediction_day) if prices_file and len(prev_rollouts) else None
    )
    scores = score_previous_rollouts(
        warehouse,
        models,
        judge,
        day,
        prediction_day,
        outcome_day,
        prev_rollouts,
        settings.reward,
        universe,
        world_titles,
        scorer,
    )
    warehouse.write("rollout_scores", scores, partition=day)
    timings["score_s"] = time.perf_counter() - started
    evolver = PromptEvolver.load(warehouse, day, settings.prompt_evolver, seed)
    evolver.record(prev_rollouts, scores)

    started = time.perf_counter()
    parent_dir, parent_info = parent if parent else (None, None)
    parent_version = parent_info["policy_version"] if parent_info else None
    temperature = sampling_temperature(prev_rollouts) if len(prev_rollouts) else ROLLOUT_SAMPLING.temperature
    policy = load_policy(models, parent_dir, parent_info)
    tokenizer = policy.tokenizer if settings.gspo.objective == "token" else None
    matured = matured_notes(warehouse, market_data, day, parent_version, settings, temperature, tokenizer)
    timings["matured_s"] = time.perf_counter() - started
    judged, judged_keys = training_examples(
        prev_rollouts,
        scores,
        with_keys=True,
        reward=settings.reward,
        tokenizer=tokenizer,
        relevance_span=settings.credit.relevance_span,
    )
    examples = judged + matured.examples
    gspo = replace(
        settings.gspo,
        seed=stable_seed(seed, day, "shuffle") % (2**31),
        temperature=temperature if examples else 1.0,
        # notes sampled days ago, or by the checkpoint a distilled parent came from, need pi_old = the
        # parent recomputed, for the truncated IS weight
        old_logprobs="recompute" if matured.examples or off_policy else settings.gspo.old_logprobs,
    )
    todays = warehouse.read("headlines", day)
    stats, gate = None, not_trained("nothing to train on" if parent_info else "first day: the base policy")
    if examples:
        # LoRA init and anything random in the trainer draw from the framework's generator: a re-run repeats them.
        policy.framework.seed(stable_seed(seed, day, "train") % (2**31))
        stats = train_gspo(policy, examples, gspo)
        policy, gate = gate_update(
            models,
            policy,
            parent,
            stats,
            trained_notes(warehouse, prev_rollouts, scores, matured),
            todays,
            settings.gate,
        )
    is_ratios = (
        dict(zip(judged_keys + matured.example_keys, stats.extra.get("is_ratio_by_example", []))) if stats else {}
    )
    ledger = ledger_frame(
        judged_ledger(day, prev_rollouts, scores, settings.reward, parent_version, is_ratios, lineage)
        + [
            {**row, "is_ratio": is_ratios.get((row["note_date"], row["headline_id"], row["rollout_index"]), np.nan)}
            for row in matured.ledger
        ]
    )
    warehouse.write("reward_ledger", ledger, partition=day)
    price_row = price_training_row(
        day, ledger, matured, stats, gspo, settings.matured().max_staleness if matured.window else None
    )
    warehouse.write("price_training", pd.DataFrame([price_row]), partition=day)
    info = {
        "date": day,
        "parent_date": parent_info["date"] if parent_info else None,
        "parent_version": parent_info["policy_version"] if parent_info else None,
        "parent_checkpoint": parent_dir.name if parent_dir else None,  # a re-run of D trains from the same one
        "base_model": models.base_model,
        "backend": models.backend,
        "trained": stats is not None,
        "examples": len(examples),
        "objective": gspo.objective,
        "learning_rate": gspo.learning_rate,
        "outcome_headlines_date": outcome_day,
        "gate": gate.verdict,
        "gate_reason": gate.reason,
    }
    if gate.verdict == "rejected":
        info = republish_parent(ckpt_root, day, parent_dir, parent_info, info)
    else:
        is_base = stats is None and (parent_info is None or parent_info["kind"] == "base")
        info = publish_checkpoint(policy, ckpt_root, day, info, is_base=is_base)
    timings["train_s"] = time.perf_counter() - started

    started = time.perf_counter()
    if evolver.due():  # a candidate prompt, tested on the held-out headlines by D's policy
        heldout = heldout_scorer(
            policy,
            settings.reward,
            replace(ROLLOUT_SAMPLING, max_new_tokens=max_new_tokens),
            settings.prompt_evolver.heldout_samples,
            seed,
            day,
        )
        evolver.evolve(heldout, prompt_writer(models, judge))
    versions = evolver.assign(list(todays["headline_id"])) if len(todays) else []
    rollouts = generate_rollouts(
        policy,
        todays,
        day,
        seed,
        n_rollouts,
        max_new_tokens,
        info["policy_version"],
        versions,
        {v["version"]: v["system_prompt"] for v in evolver.live()},
    )
    warehouse.write("rollouts", rollouts, partition=day)
    timings["generate_s"] = time.perf_counter() - started

    # Exact KL(policy || base) per token over the vocabulary, at the positions the new policy just sampled.
    started = time.perf_counter()
    kl = 0.0
    if not rollouts.empty and info["kind"] != "base":
        kl = kl_to_base(policy, rollouts, base=None if policy.has_adapter else models.load())
    timings["kl_s"] = time.perf_counter() - started
    del policy

    training_row = training_summary(
        day, info, stats, examples, scores, rollouts, len(todays), kl, gspo, outcome_day, timings, gate
    )
    warehouse.write("policy_training", pd.DataFrame([training_row]), partition=day)
    prompt_variants = evolver.write(warehouse)
    checks = verify_day(warehouse, models, day, scores, rollouts)
    return DailyUpdateResult(
        day=day,
        prediction_day=prediction_day,
        outcome_day=outcome_day,
        scores=scores,
        rollouts=rollouts,
        headlines=len(todays),
        checkpoint=info,
        checkpoint_dir=str(ckpt_root / day),
        training_row=training_row,
        price_row=price_row,
        ledger=ledger,
        gspo=gspo,
        trained=stats is not None,
        gate=gate,
        n_rollouts=n_rollouts,
        max_new_tokens=max_new_tokens,
        timings=timings,
        checks=checks,
        prompt_variants=prompt_variants,
        prompt_events=evolver.events,
        train_stats=stats,
    )


def matured_notes(
    warehouse: Warehouse,
    market_data,
    day: str,
    parent_version: str | None,
    settings: DailyUpdateSettings,
    temperature: float,
    tokenizer=None,
) -> MaturedBatch:
    """The delayed step (`reward/matured.py`), when the price signal is weighted and there is market data."""
    if market_data is None or float(settings.reward.weights.get("price", 0.0)) == 0.0:
        return MaturedBatch()
    root = warehouse.path("checkpoints", "policy")
    return collect_matured(
        warehouse,
        market_data,
        lambda d: (read_checkpoint(root / d) or {}).get("policy_version"),
        day,
        parent_version,
        settings.matured(),
        settings.reward.share("price"),
        temperature,
        tokenizer=tokenizer,
        # a day the gate rejected kept its parent's weights: its price groups go back to pending
        rejected=lambda d: (read_checkpoint(root / d) or {}).get("gate") == "rejected",
    )


def trained_notes(
    warehouse: Warehouse, prev_rollouts: pd.DataFrame, scores: pd.DataFrame, matured: MaturedBatch
) -> pd.DataFrame:
    """The rollout rows the update trained on: D-1's usable scored notes, then the matured notes."""
    trained = (
        prev_rollouts.merge(
            scores.loc[scores["usable"], ["headline_id", "rollout_index"]], on=["headline_id", "rollout_index"]
        )
        if len(scores)
        else prev_rollouts.iloc[:0]
    )
    keys = set(matured.example_keys)
    older = [
        f[[(d, h, int(i)) in keys for d, h, i in zip(f["date"], f["headline_id"], f["rollout_index"])]]
        for f in (warehouse.read("rollouts", d) for d in sorted({k[0] for k in keys}))
    ]
    return pd.concat([trained, *older], ignore_index=True) if older else trained


def training_summary(
    day, info, stats, examples, scores, rollouts, headlines, kl, gspo, outcome_day, timings, gate=None
) -> dict:
    """One `policy_training` row: what the day trained on, how it went and the gate's verdict."""
    grad_median, grad_iqr = quartiles(stats.grad_norms if stats else [])
    usable = scores[scores["usable"]] if not scores.empty else scores
    nan = float("nan")
    return dict(
        date=day,
        policy_version=info["policy_version"],
        kind=info["kind"],
        parent_version=info["parent_version"],
        trained=stats is not None,
        examples=len(examples),
        steps=stats.steps if stats else 0,
        loss=stats.mean_loss if stats else nan,
        mean_reward=float(usable["reward"].mean()) if len(usable) else nan,
        kl_to_base=kl,
        grad_norm_median=grad_median,
        grad_norm_iqr=grad_iqr,
        clip_fraction=float(np.mean(stats.extra.get("clip_fraction", [np.nan]))) if stats else nan,
        kl_penalty=float(np.mean(stats.extra.get("kl", [np.nan]))) if stats else nan,
        kl_reference=str(stats.extra.get("kl_reference", "")) if stats else "",
        optimizer_moments=str(stats.extra.get("optimizer_moments", "")) if stats else "",
        behavior_logprob_gap_max=float(stats.extra.get("behavior_logprob_gap_max", np.nan)) if stats else nan,
        train_wall_s=stats.wall_s if stats else 0.0,
        # how the memory budget ran the steps (models/train/memory.py)
        train_micro_batches=stats.micro_batches if stats else 0,
        train_recomputed=stats.layers_recomputed if stats else False,
        # each reward part's pull on the weights (models/train/gspo.py, gradient_shares)
        **{f"grad_share_{p}": float(stats.extra.get(f"grad_share_{p}", nan)) if stats else nan for p in GRADIENT_PARTS},
        objective=gspo.objective,
        learning_rate=gspo.learning_rate,
        headlines=headlines,
        rollouts=len(rollouts),
        generated_tokens=int(rollouts["n_tokens"].sum()) if len(rollouts) else 0,
        mean_structure=float(rollouts["structure_score"].mean()) if len(rollouts) else nan,
        scored=len(scores),
        usable=len(usable),
        outcome_headlines_date=outcome_day,
        **(gate or not_trained("")).columns(),
        **timings,
    )
