"""A step process's side of Dagster Pipes: open the connection, run the step, report how it ended.

`main(step)` is what a step module runs under `python -m` (e.g. `outcome_flywheel.daily_rl.day_step`). It opens Pipes from the
bootstrap variables the step runner set (`DAGSTER_PIPES_CONTEXT`, `DAGSTER_PIPES_MESSAGES`), runs
the step's `run(pipes)`, and on an error reports it as a custom message (the asset's failure shows
it) and exits 1 after printing the traceback to stderr (its tail is in the failure too).
`run_in_process` runs the same `run(pipes)` over the same protocol inside the caller's process.

Test hook: `FLYWHEEL_STEP_CRASH=train` makes a step process kill itself with SIGKILL (what the
out-of-memory killer sends) when training starts: GSPO in `daily_update`, weighted DPO in
`preference_adapter`. Only `main` honours it, never the in-process runner, so it cannot kill an
orchestrator. It exists so tests can prove that a killed training fails the step and leaves
`latest` where it was.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import traceback
from contextlib import contextmanager
from typing import Callable, Iterator, Mapping

from dagster_pipes import (
    PipesContext,
    PipesDefaultContextLoader,
    PipesDefaultMessageWriter,
    PipesEnvVarParamsLoader,
    PipesMappingParamsLoader,
    PipesParamsLoader,
)

from outcome_flywheel.steps import Step

CRASH_VARIABLE = "FLYWHEEL_STEP_CRASH"
CRASH_POINTS = ("train",)
ERROR_KEY = "step_error"  # custom message {ERROR_KEY: "Type: message"}: why the step failed
_open: list[PipesContext] = []  # the context open in this process, for the crash hook's last log line


class StepError(RuntimeError):
    """A step process that cannot run as launched (not under Pipes, several processes where one is needed)."""


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


@contextmanager
def open_step(params_loader: PipesParamsLoader | None = None, distributed: bool = False) -> Iterator[PipesContext]:
    """The step's Pipes context (closed on exit, with the exception if one ended it).

    A launcher that starts several processes (accelerate, torchrun) gives each a RANK: rank 0
    reports to Dagster; the others get None and must write nothing. A step that is not
    `distributed` refuses more than one process: it would run its whole body (sampling, judging, the
    warehouse and checkpoint writes) in every process, each writing the same outputs (docs/pipes.md,
    multi-GPU). The training steps (`Step.data_parallel`) run data-parallel through `main` instead:
    rank 0 opens the step as `distributed`, the other ranks only join its trainers.
    """
    loader = params_loader or PipesEnvVarParamsLoader()
    if not loader.is_dagster_pipes_process():
        raise StepError(
            "not launched through Dagster Pipes (DAGSTER_PIPES_CONTEXT is unset): steps are started by "
            "their assets' step runner (resources/steps.py), not by hand"
        )
    if world_size() > 1 and not distributed:
        raise StepError(
            f"WORLD_SIZE={world_size()}: this step would run its whole body (sampling, judging, the "
            "warehouse and checkpoint writes) in every process; only the training steps "
            "(daily_update, preference_adapter, distillation) run data-parallel, rank 0 alone running the step, "
            "and only when started by `main`: launch it with FLYWHEEL_STEP_PROCESSES=1 "
            "(docs/pipes.md, multi-GPU)"
        )
    if rank() != 0:
        yield None
        return
    # Made here, not with open_dagster_pipes(): that keeps one context per process for good, and the
    # in-process runner opens a fresh one for every step it runs.
    with PipesContext(loader, PipesDefaultContextLoader(), PipesDefaultMessageWriter()) as pipes:
        _open.append(pipes)
        try:
            yield pipes
        except Exception as err:
            pipes.report_custom_message({ERROR_KEY: f"{type(err).__name__}: {err}"[:4000]})
            raise
        finally:
            _open.remove(pipes)


def step_extras(params_loader: PipesParamsLoader | None = None) -> Mapping:
    """The extras the asset sent, read from the injected context (for ranks other than 0, which open no Pipes)."""
    loader = params_loader or PipesEnvVarParamsLoader()
    with PipesDefaultContextLoader().load_context(loader.load_context_params()) as data:
        return dict(data["extras"] or {})


def run_in_process(step: Step, bootstrap_env: Mapping[str, str]) -> None:
    """Run `step` over Pipes in this process (the `in_process` runner): its `run(pipes)`, exceptions raised."""
    run = importlib.import_module(step.module).run
    with open_step(PipesMappingParamsLoader(bootstrap_env)) as pipes:
        run_guarded(step.name, pipes, run)


def main(step: Step, run: Callable[[PipesContext | None], None], distributed: bool = False) -> None:
    """The process entry point: run the step; exit 1 with the traceback on stderr when it fails.

    A training step (`Step.data_parallel`) launched as several processes (torchrun) runs data-parallel:
    rank 0 runs the step (its Pipes, its writes) and each trainer it calls (and the daily update's rollout
    sampling) is joined by the other ranks, which write nothing (`run_data_parallel`)."""
    install_crash_hook(os.environ.get(CRASH_VARIABLE, ""))
    try:
        if world_size() > 1 and step.data_parallel and not distributed:
            run_data_parallel(step.name, run)
            return
        with open_step(distributed=distributed) as pipes:
            run_guarded(step.name, pipes, run)
    except Exception as err:
        traceback.print_exc()
        sys.stderr.flush()
        record_for_launcher(err)
        sys.exit(1)


def record_for_launcher(err: BaseException) -> None:
    """Under torchrun (and accelerate, which runs it) each rank has an error file (TORCHELASTIC_ERROR_FILE)
    that the launcher reads when the rank fails: with the exception recorded there, the launcher's summary
    names the failed rank's exception and traceback, not only its exit status, and the step's failure
    leads with it (resources/steps.py). No launcher, no file: nothing to do."""
    if not os.environ.get("TORCHELASTIC_ERROR_FILE"):
        return
    try:
        from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

        ErrorHandler().record_exception(err)
    except Exception:  # the traceback is on stderr already; the exit status still fails the launch
        traceback.print_exc()


def run_data_parallel(step: str, run: Callable[[PipesContext | None], None]) -> None:
    """The step on rank 0, its trainers and rollout sampling joined by the other ranks
    (models/torch/followers.py: `lead`, `follow`). Rank 0 tells the others it is done only when the step
    succeeded; when it fails it exits 1 and the launcher (torchrun) stops the other ranks, so none waits
    on it. A framework without data parallelism (mlx) refuses in its trainer (models/train/shards.py)."""
    from outcome_flywheel.models.torch import followers
    from outcome_flywheel.models.torch.training import init_from_env
    from outcome_flywheel.models.train.shards import LEADERS

    init_from_env()
    if rank() != 0:
        followers.follow(_policy)
        followers.end_process()
        return  # end_process does not return; a test's stand-in for it does
    joined: list[str] = []

    def lead(trainer, backend, args) -> None:
        followers.lead(trainer, backend, args)
        joined.append(trainer)

    LEADERS.append(lead)
    try:
        with open_step(distributed=True) as pipes:
            run_guarded(step, pipes, run)
            trained = ", ".join(call for call in joined if call != "sample") or "nothing"
            sampled = " and sampled the rollouts" if "sample" in joined else ""
            pipes.log.info(
                f"data parallel: {world_size()} processes trained {trained}{sampled} "
                "(rank 0 ran the step and wrote its outputs)"
            )
    finally:
        LEADERS.remove(lead)
    followers.finish()
    followers.end_process()


def _policy(spec: Mapping) -> object:
    """A follower's copy of rank 0's base model and sampler (`followers.follow` lays rank 0's adapter and
    weights on it)."""
    from outcome_flywheel.models.torch.backend import TorchBackend

    return TorchBackend(
        spec["model_path"],
        device=spec["device"],
        dtype=spec["dtype"],
        master_weights=spec["master_weights"],
        sampler=spec.get("sampler", "torch"),
        static_decode=spec.get("static_decode"),
    )


def run_guarded(step: str, pipes: PipesContext | None, run: Callable[[PipesContext | None], None]) -> None:
    """Run the step; a training step (`training_audit.TRAINING_STEPS`) under the single trainer lock,
    with its `training_audit` row written however it ends (docs/tiers.md, "Safety")."""
    from outcome_flywheel.training_audit import (
        TRAINING_STEPS,
        audited_training,
        daily_gate_from_warehouse,
        step_audit_inputs,
    )

    extras = dict(pipes.extras or {}) if pipes is not None else {}
    if (
        pipes is None
        or step not in TRAINING_STEPS
        or extras.get("action", "train") != "train"
        or "warehouse" not in extras
    ):
        run(pipes)
        return
    from outcome_flywheel.steps.codec import from_payload
    from outcome_flywheel.storage import Warehouse

    warehouse = from_payload(Warehouse, extras["warehouse"])
    tier, partition = TRAINING_STEPS[step], pipes.partition_key if pipes.is_partition_step else None
    training_id = extras.get("training_id") or f"{tier}:{pipes.run_id}:{partition or ''}"
    trigger = extras.get("trigger") or f"run {pipes.run_id[:8]} ({pipes.job_name or 'asset materialization'})"
    with audited_training(
        warehouse, tier, training_id, trigger, step_audit_inputs(step, extras, partition), log=pipes.log.info
    ) as entry:
        run(pipes)
        if step == "daily_update":  # its gate's verdict is in the day's policy_training row
            entry.gate_verdict, entry.gate_reason, figures = daily_gate_from_warehouse(warehouse, partition)
            entry.inputs.update(figures)


def install_crash_hook(point: str) -> None:
    """`FLYWHEEL_STEP_CRASH=train`: SIGKILL this process when a GSPO or weighted-DPO training starts."""
    if not point:
        return
    if point not in CRASH_POINTS:
        raise StepError(f"{CRASH_VARIABLE}={point!r}: one of {', '.join(CRASH_POINTS)}")
    from outcome_flywheel.models.interface import ModelBackend

    def killed(*_args, **_kwargs):
        for pipes in _open:
            pipes.log.warning(f"{CRASH_VARIABLE}={point}: training started, killing this process with SIGKILL")
        print(f"{CRASH_VARIABLE}={point}: training started; SIGKILL", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    # Every trainer (models/train/: GSPO, DPO, SFT) prepares its backend first: that is where training starts.
    ModelBackend.prepare_for_training = killed
