"""The `daily_update` step: one day of the daily loop (`run_daily_update`: judge, GSPO training, gate,
checkpoint, rollout generation, KL, verify) in its own process, reported through Dagster Pipes.

Extras (from the asset): `warehouse`, `models`, `judge`, `market_data` (or None), `settings`
(`DailyUpdateSettings`) and `tracking` (`Tracker`, or absent: no MLflow record), each as its dataclass's
JSON; `follow_ups`: what happened next in a synthetic world, for the judge (absent: the outcome day's
headlines). The partition key is the day. Reported: the three keys' materializations with their metadata (the
checkpoint's carries the MLflow run's link), the four blocking checks and the gate's check (WARN when it
rejected the update). `latest` moves only once the day's blocking checks passed
(`policy/verify.py`): a process that dies before that leaves it where it was.
"""

from __future__ import annotations

import dataclasses
import os
import time

from outcome_flywheel.daily_rl.day import run_daily_update
from outcome_flywheel.daily_rl.day_record import LOOP, day_tags, record_day
from outcome_flywheel.daily_rl.day_result import (
    checkpoint_metadata,
    evolver_metadata,
    record_metadata,
    rollouts_metadata,
    scores_metadata,
)
from outcome_flywheel.daily_rl.day_settings import DailyUpdateSettings
from outcome_flywheel.daily_rl.day_store import DayStore
from outcome_flywheel.daily_rl.judge.llm_judge import Judge
from outcome_flywheel.daily_rl.partitions import DailyUpdateError
from outcome_flywheel.daily_rl.policy.verify import DAILY_UPDATE_CHECKS, UPDATE_ACCEPTED_BY_GATE, gate_check
from outcome_flywheel.market_data import MarketData
from outcome_flywheel.models.loader import ModelLoader
from outcome_flywheel.steps import Step
from outcome_flywheel.steps.codec import from_payload
from outcome_flywheel.steps.entry import main
from outcome_flywheel.steps.metadata import present
from outcome_flywheel.storage import Warehouse
from outcome_flywheel.tracking import Tracker
from outcome_flywheel.training_audit import current

# This step, as its asset names it (the step runner launches `python -m outcome_flywheel.daily_rl.day_step`).
STEP = Step("daily_update", "outcome_flywheel.daily_rl.day_step", processes="data_parallel")

# check -> the key it belongs to (the checks are declared in verify.py)
CHECK_ASSET = {check.name: check.asset for check in DAILY_UPDATE_CHECKS}


def run(pipes) -> None:
    extras = pipes.extras
    warehouse = from_payload(Warehouse, extras["warehouse"])
    models = from_payload(ModelLoader, extras["models"])
    judge = from_payload(Judge, extras["judge"])
    market_data = from_payload(MarketData, extras["market_data"]) if extras.get("market_data") else None
    settings = from_payload(DailyUpdateSettings, extras["settings"])
    day = pipes.partition_key
    pipes.log.info(
        f"daily_update {day}: {models.base_model} on {models.backend}/{models.device}, process {os.getpid()}"
    )
    started = time.perf_counter()
    # the MLflow run and the registry's mirror (outcome_flywheel/tracking/): a failed record is a warning
    tracker = from_payload(Tracker, extras["tracking"]) if extras.get("tracking") else None
    try:
        with DayStore(warehouse, market_data) as store:
            result = run_daily_update(store, models, judge, day, settings, extras.get("follow_ups"))
    except DailyUpdateError:
        raise  # refused before anything ran or was written: not a failed training
    except BaseException as err:  # a day that failed on its way: a FAILED MLflow run with the error, then re-raised
        if tracker is not None:
            params = {"settings": dataclasses.asdict(settings), "models": models.base_model}
            tracker.record_failure(
                LOOP, f"daily_update {day}", day_tags(day, pipes.run_id), err, pipes.log.warning, params
            )
        raise
    entry = current()
    if entry is not None:  # the audit row: what the day trained from (a distilled parent: its notes were off-policy)
        entry.inputs.update(
            parent_checkpoint=result.checkpoint.get("parent_checkpoint"),
            parent_version=result.checkpoint.get("parent_version"),
            policy_version=result.checkpoint.get("policy_version"),
        )
    pipes.log.info(
        f"daily_update {day}: gate {result.gate.verdict}, {len(result.rollouts)} rollouts, "
        f"{time.perf_counter() - started:.1f} s in the step"
    )
    stats = result.update.stats
    if stats is not None and stats.extra.get("lora_settings_ignored"):  # the run config's LoRA did not apply
        pipes.log.warning(f"daily_update {day}: {stats.extra['lora_adapter']}")
    pipes.report_asset_materialization(
        asset_key="rollout_scores", metadata=scores_metadata(result, judge, models, settings)
    )
    on_record = record_day(tracker, result, settings, models, judge, pipes.run_id, pipes.log.warning) if tracker else {}
    pipes.report_asset_materialization(
        asset_key="policy_checkpoint", metadata={**checkpoint_metadata(result), **record_metadata(on_record)}
    )
    pipes.report_asset_materialization(asset_key="rollouts", metadata=rollouts_metadata(result))
    pipes.report_asset_materialization(asset_key="prompt_evolver", metadata=evolver_metadata(result))
    for name, check in result.checks.items():
        pipes.report_asset_check(
            check_name=name,
            asset_key=CHECK_ASSET[name],
            passed=bool(check["passed"]),
            metadata=present(check["metadata"]) or None,
        )
    gate = gate_check(result.gate)  # not blocking: a rejected update is a warning, the day goes on
    pipes.report_asset_check(
        check_name=UPDATE_ACCEPTED_BY_GATE.name,
        asset_key=UPDATE_ACCEPTED_BY_GATE.asset,
        passed=gate["passed"],
        severity="WARN",
        metadata=gate["metadata"],
    )


if __name__ == "__main__":
    main(STEP, run)
