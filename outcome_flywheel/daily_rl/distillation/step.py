"""The `distillation` step (tier 3) in its own process, reported through Dagster Pipes. Two actions:

- `samples` (the `distill_samples` asset, partition D): the teacher answers the day's selected
  headlines (`samples.select_headlines`) with thinking on; its traces and the verified
  corrections become `distill_samples` rows of D. Generation only: no trainer lock.
- `train` (the `distilled_policy` asset): one distillation run (`distill`: read its inputs, run
  `distillation.train.run_distillation`, write its rows), under the single trainer lock with its
  `training_audit` row (the step entry does both).

This module is the tier's edge: it alone reads and writes the warehouse (`read_inputs` at the start,
`record_run` at the end); `samples.py` and `train.py` take data and return data.

Extras: `action`, `warehouse`, `models` (their dataclasses' JSON); `samples`: `teacher` (a name,
FLYWHEEL_TEACHER_MODEL's value), `max_new_tokens`; `train`: `run`, `config` (`DistillConfig`), `tracking`
(`Tracker`, or absent: no MLflow record of the run, `day_record.record_distilled`).
"""

from __future__ import annotations

import json
import os

import pandas as pd

from outcome_flywheel.daily_rl.day_record import record_distilled
from outcome_flywheel.daily_rl.distillation.samples import (
    SAMPLES_TABLE,
    correction_samples,
    samples_frame,
    select_headlines,
    teacher_samples,
)
from outcome_flywheel.daily_rl.distillation.train import (
    RUNS_TABLE,
    USED_TABLE,
    DistillConfig,
    DistillInputs,
    DistillResult,
    fresh_samples,
    latest_parent,
    min_samples,
    run_distillation,
    teacher_dir,
)
from outcome_flywheel.daily_rl.partitions import previous_day
from outcome_flywheel.models.loader import ModelLoader, load_backend
from outcome_flywheel.steps import Step
from outcome_flywheel.steps.codec import from_payload
from outcome_flywheel.steps.entry import main
from outcome_flywheel.steps.metadata import md, num, present
from outcome_flywheel.storage import Warehouse
from outcome_flywheel.tracking import Tracker
from outcome_flywheel.training_audit import current

# This step, as its asset names it (the step runner launches `python -m outcome_flywheel.daily_rl.distillation.step`).
STEP = Step("distillation", "outcome_flywheel.daily_rl.distillation.step", processes="data_parallel")


def run(pipes) -> None:
    extras = pipes.extras
    warehouse = from_payload(Warehouse, extras["warehouse"])
    models = from_payload(ModelLoader, extras["models"])
    if extras["action"] == "samples":
        report_samples(pipes, *make_samples(warehouse, models, pipes.partition_key, extras, pipes.log.info))
    elif extras["action"] == "train":
        train(pipes, warehouse, models, extras)
    else:
        raise ValueError(f"distillation step: unknown action {extras['action']!r} (samples | train)")


def make_samples(warehouse: Warehouse, models: ModelLoader, day: str, extras: dict, log=print):
    """(samples frame of D, picks, teacher folder): the teacher's traces and the corrections of D."""
    headlines = warehouse.read("headlines", day) if warehouse.exists("headlines", day) else None
    scores = warehouse.read("rollout_scores", day) if warehouse.exists("rollout_scores", day) else None
    prev = previous_day(day)
    prev_rollouts = warehouse.read("rollouts", prev) if warehouse.exists("rollouts", prev) else None
    empty = pd.DataFrame()
    picks = select_headlines(
        day,
        headlines if headlines is not None else empty,
        scores if scores is not None else empty,
        prev_rollouts if prev_rollouts is not None else empty,
        models.seed,
    )
    folder = teacher_dir(models, extras.get("teacher"), log=log)
    log(
        f"distill_samples {day}: teacher {extras.get('teacher')} ({folder}) answers {len(picks)} headlines, process {os.getpid()}"
    )
    teacher = load_backend(models.backend, folder, device=models.device)
    rows = teacher_samples(
        teacher, str(extras.get("teacher")), day, picks, models.seed, int(extras.get("max_new_tokens", 256))
    )
    del teacher
    pairs = warehouse.read("feedback_pairs") if warehouse.exists("feedback_pairs") else empty
    rows += [r for r in correction_samples(pairs) if r["date"] == day]
    frame = samples_frame(rows)
    warehouse.write(SAMPLES_TABLE, frame, partition=day)
    return frame, picks, folder


def report_samples(pipes, frame, picks, folder) -> None:
    by_phase = frame["phase"].value_counts().to_dict() if len(frame) else {}
    with_reasoning = int((frame["phase"] == "reasoning").sum()) if len(frame) else 0
    teacher_rows = frame[frame["source"] == "teacher"] if len(frame) else frame
    pipes.report_asset_materialization(
        metadata=present(
            {
                "dagster/row_count": len(frame),
                "teacher_model": str(folder),
                "headlines_answered": len(picks),
                "picked_random": sum(p["why"].startswith("random") for p in picks),
                "picked_confident": sum(p["why"].startswith("confident") for p in picks),
                "traces_with_reasoning": with_reasoning,
                "traces_without_reasoning": int((teacher_rows["phase"] == "answer").sum()) - with_reasoning
                if len(frame)
                else 0,
                "corrections": int((frame["source"] == "correction").sum()) if len(frame) else 0,
                **{f"samples_{phase}": int(n) for phase, n in by_phase.items()},
                "example": md(f"```\n{frame['completion'].iloc[0][:500]}\n```") if len(frame) else None,
            }
        )
    )


def unused_samples(warehouse: Warehouse) -> pd.DataFrame:
    """Samples no distillation run has trained on yet."""
    samples = warehouse.read_all(SAMPLES_TABLE) if warehouse.partitions(SAMPLES_TABLE) else pd.DataFrame()
    used = warehouse.find(USED_TABLE)
    return fresh_samples(samples, pd.DataFrame(columns=["sample_id"]) if used is None else used)


def ready_to_distill(warehouse: Warehouse, threshold: int | None = None) -> tuple[bool, int, int]:
    """(ready, new samples, threshold): a run starts when at least `threshold` new samples exist."""
    need = min_samples() if threshold is None else int(threshold)
    count = len(unused_samples(warehouse))
    return count >= need, count, need


def read_inputs(warehouse: Warehouse) -> DistillInputs:
    """A run's inputs: the unused samples, the latest verified checkpoint and its day's notes and headlines."""
    root = warehouse.path("checkpoints", "policy")
    parent_dir, parent_info = latest_parent(root)
    day = str(parent_info["date"])
    rollouts, headlines = warehouse.read("rollouts", day), warehouse.read("headlines", day)  # empty when absent
    return DistillInputs(unused_samples(warehouse), root, parent_dir, parent_info, rollouts, headlines)


def record_run(warehouse: Warehouse, result: DistillResult, samples: pd.DataFrame) -> None:
    """The run's samples count as used and its row joins `distillation_runs`; a re-run of the same run id
    replaces its rows."""
    used, row = result.used_rows(samples), pd.DataFrame([result.row()])
    for table, rows in ((USED_TABLE, used), (RUNS_TABLE, row)):
        previous = warehouse.find(table)
        kept = previous[previous["run_id"] != result.run_id] if previous is not None and len(previous) else None
        warehouse.write(table, rows if kept is None else pd.concat([kept, rows], ignore_index=True))


def distill(warehouse: Warehouse, models: ModelLoader, run_id: str, config: DistillConfig, log=print) -> DistillResult:
    """One distillation run: read its inputs, train, gate and publish (`run_distillation`), write its rows."""
    inputs = read_inputs(warehouse)
    result = run_distillation(inputs, models, run_id, config, log=log)
    record_run(warehouse, result, inputs.samples)
    return result


def train(pipes, warehouse: Warehouse, models: ModelLoader, extras: dict) -> None:
    config = from_payload(DistillConfig, extras["config"])
    result = distill(warehouse, models, extras["run"], config, log=pipes.log.info)
    entry = current()
    if entry is not None:  # the audit row of this training (the step entry holds it)
        entry.gate_verdict, entry.gate_reason = result.gate.verdict, result.gate.reason
        entry.inputs.update(
            samples=result.samples,
            parent_version=result.parent_version,
            run=result.run_id,
            policy_version=result.policy_version,
        )
    tracker = from_payload(Tracker, extras["tracking"]) if extras.get("tracking") else None
    root = warehouse.path("checkpoints", "policy")
    on_record = record_distilled(tracker, result, config, root, pipes.run_id, pipes.log.warning) if tracker else {}
    ab = result.ab
    pipes.report_asset_materialization(
        metadata=present(
            {
                "run": result.run_id,
                "samples": result.samples,
                "parent_version": result.parent_version,
                "checkpoint": result.checkpoint or None,
                "policy_version": result.policy_version or None,
                "gate": result.gate.verdict,
                "gate_reason": result.gate.reason,
                "gate_kl_to_parent": num(result.gate.kl_to_parent, 6),
                "gate_probe_structure": num(result.gate.probe_structure),
                "gate_probe_parent_structure": num(result.gate.probe_parent_structure),
                "phases": md(phase_table(result.phases)),
                "ab_structure_distilled": num(ab["policy"]) if ab.get("policy") is not None else None,
                "ab_structure_parent": num(ab["base"]) if ab.get("base") is not None else None,
                "ab_difference": num(ab["difference"]) if ab.get("difference") is not None else None,
                "ab_ci_low": num(ab["ci_low"]) if ab.get("ci_low") is not None else None,
                "ab_ci_high": num(ab["ci_high"]) if ab.get("ci_high") is not None else None,
                "ab_n": ab.get("n"),
                "ab_label": ab.get("label"),
                "ab_test": ab.get("test"),
                "wall_seconds": round(result.wall_s, 2),
                **on_record,
            }
        )
        | (
            {"mlflow_run_url": {"raw_value": on_record["mlflow_run_url"], "type": "url"}}
            if on_record.get("mlflow_run_url")
            else {}
        )
    )
    pipes.report_asset_check(
        check_name="distilled_accepted_by_gate",
        passed=result.gate.verdict == "accepted",
        severity="WARN",
        metadata={"gate": result.gate.verdict, "reason": result.gate.reason},
    )
    pipes.report_custom_message({"distillation": json.loads(json.dumps(result.row(), default=str))})


def phase_table(phases: list[dict]) -> str:
    rows = "".join(
        f"| {p['phase']} | {p['examples']} | {p['steps']} | {p.get('loss_first', float('nan')):.4f} | "
        f"{p.get('loss_last', float('nan')):.4f} | {p.get('lora_adapter', '')} |\n"
        for p in phases
    )
    head = "| phase | examples | steps | loss first | loss last | adapter trained |\n"
    return head + "| --- | --- | --- | --- | --- | --- |\n" + rows


if __name__ == "__main__":
    main(STEP, run)
