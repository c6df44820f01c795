"""The heavy steps as their own processes, and what every step process shares (Pipes, launchers, payloads).

Each step is launched by an asset through Dagster Pipes (`resources/steps.py` picks where: a local
subprocess, the asset's own process, or a Kubernetes pod). A step reads what the asset sent as Pipes
extras (the resources' settings and the run config, as JSON), writes its outputs where the method
always writes them (the warehouse, the checkpoint and adapter folders) and reports back through
Pipes: log lines, each asset's materialization metadata and the asset checks. Plain Python and
`dagster_pipes` only: the pod or machine running a step needs the project, not Dagster.

Each step module declares its `Step` (its name, the module `python -m` runs, how many processes it can
use) beside its body, and the asset that launches it passes that `Step` to the step runner: no registry.
The steps: `daily_update` (judge, GSPO training, gate, checkpoint, rollout generation, verify),
`preference_adapter` (weighted-DPO training of the LoRA adapter), `distillation`, `note_scorer`, and
`probe` (reports its launcher's ranks; checks a launcher without loading a model).
"""

from dataclasses import dataclass

PROCESSES = ("one", "data_parallel", "every")


@dataclass(frozen=True)
class Step:
    """A heavy step, declared beside its body (`STEP` in the module `python -m` runs) and named by the asset
    that launches it: its name (logs, errors), its module, and how many processes it can use:
    `one` (its whole body would run in every process: more are refused, and a launcher asked for several
    starts one, plainly), `data_parallel` (a training step: rank 0 runs it, the other ranks join its
    trainers, `entry.run_data_parallel`) or `every` (every process runs it: the probe reports its rank)."""

    name: str
    module: str
    processes: str = "one"

    def __post_init__(self):
        if self.processes not in PROCESSES:
            raise ValueError(f"step {self.name}: processes {self.processes!r}, one of {', '.join(PROCESSES)}")

    @property
    def data_parallel(self) -> bool:
        return self.processes == "data_parallel"

    @property
    def multi_process(self) -> bool:
        """It may be launched as several processes (FLYWHEEL_STEP_PROCESSES > 1)."""
        return self.processes != "one"
