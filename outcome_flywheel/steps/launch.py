"""How a step process is started: its command line per launcher, and the environment it inherits.

`python` runs the step as one process. `accelerate` (`accelerate launch`) and `torchrun` start
`processes` copies of it on the machine, each with RANK / LOCAL_RANK / WORLD_SIZE set; only rank 0
talks to Dagster (`entry.py`). Both launchers are invoked as modules of the interpreter that runs
the step (`python -m accelerate.commands.launch`, `python -m torch.distributed.run`), so the
command needs no console script on PATH and a virtual environment is used as it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from outcome_flywheel.steps import step_module

LAUNCHERS = ("python", "accelerate", "torchrun")
# What a step process must see of the orchestrator's environment when it does not inherit all of it
# (a pod): the project's settings (the warehouse URL among them), object-storage credentials and
# endpoints, and the model hub's cache and offline switches.
PASSTHROUGH_PREFIXES = ("FLYWHEEL_", "AWS_", "HF_", "TRANSFORMERS_")
PASSTHROUGH_NAMES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TOKENIZERS_PARALLELISM", "PYTORCH_CUDA_ALLOC_CONF")


@dataclass(frozen=True)
class StepLaunch:
    """How a step process starts: the launcher and how many processes it starts."""

    launcher: str = field(
        default="python",
        metadata={
            "help": (
                "FLYWHEEL_STEP_LAUNCHER: `python` (one process), `accelerate` (`accelerate launch`) or `torchrun` "
                "(`processes` processes on the machine, rank 0 reports to Dagster)."
            )
        },
    )
    processes: int = field(
        default=1,
        metadata={"help": "FLYWHEEL_STEP_PROCESSES: processes the launcher starts (GPUs used on the machine)."},
    )
    python: str = field(
        default="python",
        metadata={"help": "The interpreter that runs the step (the orchestrator's own for a local subprocess)."},
    )

    def __post_init__(self):
        if self.launcher not in LAUNCHERS:
            raise ValueError(f"launcher {self.launcher!r}: one of {', '.join(LAUNCHERS)}")
        if int(self.processes) < 1:
            raise ValueError(f"processes {self.processes!r}: an integer >= 1")
        if self.launcher == "python" and int(self.processes) != 1:
            raise ValueError("the `python` launcher starts one process: use `accelerate` or `torchrun` for more")

    def command(self, step: str) -> list[str]:
        """The argv that runs `step`."""
        return self.module_command(step_module(step))

    def module_command(self, module: str, *args: str) -> list[str]:
        """The argv that runs `python -m module args...` under this launcher (a step, or a benchmark's
        or test's own worker)."""
        n = str(int(self.processes))
        if self.launcher == "accelerate":
            # --num_machines 1 and the mixed precision given: accelerate asks for neither then, and
            # never reads a stale `accelerate config` file's values for them. --multi_gpu for several:
            # without it accelerate starts N processes only where it sees several GPUs, and one
            # process elsewhere (one GPU, a CPU), silently; with it, torch.distributed.run starts N
            # (the ranks pick NCCL or gloo themselves, models/torch/training.init_from_env).
            several = ["--multi_gpu"] if int(self.processes) > 1 else []
            return [
                self.python,
                "-m",
                "accelerate.commands.launch",
                *several,
                "--num_machines",
                "1",
                "--num_processes",
                n,
                "--mixed_precision",
                "no",
                "--dynamo_backend",
                "no",
                "-m",
                module,
                *args,
            ]
        if self.launcher == "torchrun":
            return [
                self.python,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nnodes",
                "1",
                "--nproc_per_node",
                n,
                "-m",
                module,
                *args,
            ]
        return [self.python, "-m", module, *args]


def passthrough_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The part of `environ` a step process on another machine needs (see PASSTHROUGH_PREFIXES)."""
    return {k: v for k, v in sorted(environ.items()) if k.startswith(PASSTHROUGH_PREFIXES) or k in PASSTHROUGH_NAMES}
