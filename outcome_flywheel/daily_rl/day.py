"""One day of the daily loop: the recipe. A `Day` goes in; each stage takes data and returns data; the
store (`day_store.py`) is read at the start and written at the end.

1. score     D-1's notes ranked by the judge against what happened next (`judge/`), made into
             rewards with people's ratings, relevance and the note scorer's signal (`reward/rollout_scores.py`)
2. matured   earlier days' notes whose price outcome is known by D (`reward/matured.py`)
3. update    the parent + GSPO on both -> a candidate the gate accepts or rejects (`policy/update.py`),
             staged as checkpoint D
4. prompts   the prompt evolver counts D-1's groups as trials, maybe tests a new variant, picks one per
             headline (`policy/prompt_evolver.py`)
5. generate  8 notes per headline of D from checkpoint D (`policy/rollouts.py`), and their KL to the base
6. record    the ledger, the delayed step's row and the training row (`day_result.py`), written with the
             rest; checkpoint D published, verified on disk (`policy/verify.py`), and only then marked
             verified (the next day may train from it, `latest` moves)
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import replace

import pandas as pd

from outcome_flywheel.daily_rl.day_result import DailyUpdateResult, checkpoint_info, day_record_tables
from outcome_flywheel.daily_rl.day_settings import DailyUpdateSettings, check_objective
from outcome_flywheel.daily_rl.day_store import Day, DayInputs, DayStore, DayTables
from outcome_flywheel.daily_rl.judge.llm_judge import Judge
from outcome_flywheel.daily_rl.note_scorer.signal import scorer_signals
from outcome_flywheel.daily_rl.policy.checkpoints import load_policy
from outcome_flywheel.daily_rl.policy.prompt_evolver import PromptEvolver, heldout_scorer, prompt_writer
from outcome_flywheel.daily_rl.policy.rollouts import (
    ROLLOUT_SAMPLING,
    generate_rollouts,
    kl_to_base,
    sampling_temperature,
    spread_sample,
)
from outcome_flywheel.daily_rl.policy.update import update_policy
from outcome_flywheel.daily_rl.policy.verify import verify_day
from outcome_flywheel.daily_rl.reward.matured import MaturedBatch, collect_matured
from outcome_flywheel.daily_rl.reward.rollout_scores import human_signals, judge_inputs, score_rollouts
from outcome_flywheel.models.loader import ModelLoader


def run_daily_update(
    store: DayStore, models: ModelLoader, judge: Judge, day: str, settings: DailyUpdateSettings, follow_ups=None
) -> DailyUpdateResult:
    """Score D-1's notes, take the matured ones, update and gate the policy, generate D's notes, record and
    verify. `follow_ups`: a world's own follow-ups for the judge (None: the outcome day's headlines).
    Writes rollout_scores, reward_ledger, price_training, rollouts, policy_training, the prompt evolver's
    state and checkpoint D. Raises `DailyUpdateError` before anything is written when the day cannot run."""
    check_objective(settings)
    d = store.open(day, settings, models.seed)
    inputs = store.read(d, settings, follow_ups)
    settings, n_rollouts, max_new_tokens = settings.sized(models)
    timings: dict[str, float] = {}
    with timed(timings, "score_s"):
        scores = score_notes(d, inputs, models, judge, settings)
    evolver = PromptEvolver(day, settings.prompt_evolver, d.seed, inputs.evolver_variants, inputs.evolver_experiences)
    evolver.record(inputs.prev_rollouts, scores)

    with timed(timings, "matured_s"):
        prev = inputs.prev_rollouts
        temperature = sampling_temperature(prev) if len(prev) else ROLLOUT_SAMPLING.temperature
        policy = load_policy(models, d.parent_dir, d.parent_info)
        tokenizer = policy.tokenizer if settings.gspo.objective == "token" else None
        matured = matured_notes(d, inputs, store.market_data, settings, temperature, tokenizer)
    with timed(timings, "train_s"):
        update = update_policy(policy, models, d.parent, inputs, scores, matured, settings, temperature, d.seed, day)
        policy, info = update.policy, checkpoint_info(d, models, update)
        staged = store.stage(policy, d, info, update)
    with timed(timings, "generate_s"):
        if evolver.due():  # a candidate prompt, tested on the held-out headlines by D's policy
            sampling = replace(ROLLOUT_SAMPLING, max_new_tokens=max_new_tokens)
            heldout = heldout_scorer(
                policy, settings.reward, sampling, settings.prompt_evolver.heldout_samples, d.seed, day
            )
            evolver.evolve(heldout, prompt_writer(models, judge))
        todays = inputs.headlines
        versions = evolver.assign(list(todays["headline_id"])) if len(todays) else []
        prompts = {v["version"]: v["system_prompt"] for v in evolver.live()}
        version = staged.info["policy_version"]
        rollouts = generate_rollouts(
            policy, todays, day, d.seed, n_rollouts, max_new_tokens, version, versions, prompts
        )
    with timed(timings, "kl_s"):  # exact KL(policy || base) per token, at the positions the new policy sampled
        is_base = rollouts.empty or staged.info["kind"] == "base"
        measured = spread_sample(rollouts, settings.kl_to_base_rollouts)
        kl = 0.0 if is_base else kl_to_base(policy, measured, base=None if policy.has_adapter else models.load())
    del policy

    ledger, price_row, training_row = day_record_tables(
        d, scores, prev, matured, update, settings, staged.info, rollouts, len(todays), kl, timings
    )
    variants, experiences = evolver.frames()
    tables = DayTables(
        scores, ledger, pd.DataFrame([price_row]), rollouts, pd.DataFrame([training_row]), variants, experiences
    )
    info = store.write(d, tables, staged)
    checks = verify_day(lambda dtype=None: store.load_checkpoint(models, day, dtype), info, scores, rollouts)
    if all(c["passed"] for c in checks.values()):
        store.checkpoints.mark_verified(day)  # only now may the next day train from it, and `latest` move
    checkpoint_dir, headlines = str(store.checkpoints.root / day), len(todays)
    return DailyUpdateResult(d, update, tables, info, checkpoint_dir, price_row, training_row, headlines,
                             n_rollouts, max_new_tokens, timings, checks, evolver.events)  # fmt: skip


@contextmanager
def timed(timings: dict[str, float], name: str):
    started = time.perf_counter()
    yield
    timings[name] = time.perf_counter() - started


def score_notes(d: Day, inputs: DayInputs, models: ModelLoader, judge: Judge, settings) -> pd.DataFrame:
    """rollout_scores(D): the judge ranks each headline's notes of D-1 (the judge ranks, nothing else);
    `reward/` makes the ranks and the other signals into rewards."""
    prev = inputs.prev_rollouts
    groups = judge_inputs(prev, inputs.outcome_titles, judge.outcome_context, d.seed, d.day) if len(prev) else None
    judgements = judge.rank(judge.load(models), groups.groups) if groups is not None else []
    scorer = scorer_signals(inputs.scorer_state, inputs.scorer_features)
    return score_rollouts(
        groups,
        judgements,
        d.day,
        d.prediction_day,
        d.outcome_day,
        prev,
        settings.reward,
        inputs.universe,
        human_signals(inputs.human),
        scorer if settings.reward.weighs("scorer") else None,
        settings.credit.relevance_baseline,
    )


def matured_notes(d: Day, inputs: DayInputs, market_data, settings, temperature: float, tokenizer) -> MaturedBatch:
    """The delayed step (`reward/matured.py`), when the price signal is weighted and there is market data."""
    if market_data is None or not settings.reward.weighs("price"):
        return MaturedBatch()
    return collect_matured(
        inputs.earlier_ledgers,
        inputs.note_rollouts,
        market_data,
        inputs.versions,
        d.day,
        d.parent_version,
        settings.matured(),
        settings.reward.share("price"),
        temperature,
        tokenizer=tokenizer,
    )
