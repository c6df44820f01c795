"""How a step process is started: its command line per launcher, and the environment it inherits.

`python` runs the step as one process. `accelerate` (`accelerate launch`) and `torchrun` start
`processes` copies of it on the machine, each with RANK / LOCAL_RANK / WORLD_SIZE set; only rank 0
talks to Dagster (`entry.py`). Both launchers are invoked as modules of the interpreter that runs
the step (`python -m accelerate.commands.launch`, `python -m torch.distributed.run`), so the
command needs no console script on PATH and a virtual environment is used as it is. Only the steps that
can use several processes (`Step.multi_process`) get several; any other runs as one, launched plainly.

When a launch of several processes fails, the launcher's summary (at the end of its stderr) names the
rank lost first and, when that rank recorded its exception (`entry.record_for_launcher`), the exception:
`launch_root_cause` reads both.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, field, replace
from typing import Mapping

from outcome_flywheel.steps import Step

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

    def for_step(self, step: Step) -> "StepLaunch":
        """How `step` starts: this launch, or one process started plainly (`python`) for a step that
        cannot use several (`Step.processes` one: its whole body would run in every process)."""
        if int(self.processes) == 1 or step.multi_process:
            return self
        return replace(self, launcher="python", processes=1)

    def command(self, step: Step) -> list[str]:
        """The argv that runs `step` (`for_step`'s launch)."""
        return self.for_step(step).module_command(step.module)

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


def exit_status(code: int) -> str:
    """How a step process ended, in words; a kill says which signal (SIGKILL: the out-of-memory killer's)."""
    if code < 0 or code in (128 + signal.SIGKILL, 128 + signal.SIGTERM):
        number = -code if code < 0 else code - 128
        name = signal.Signals(number).name
        why = " (out of memory, or killed)" if number == signal.SIGKILL else ""
        return f"was killed by {name}{why}, exit status {code}"
    return f"exited with status {code}"


# torchrun's (and accelerate's, which runs it) summary of a failed launch: the first process to fail, up to
# the summary's closing rule; its `traceback :` is the rank's recorded exception (else a pointer to the docs)
LAUNCH_ROOT_CAUSE = re.compile(
    r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)(.*?)(?:^=+\s*$|\Z)",
    re.DOTALL | re.MULTILINE,
)
REASON_CHARS = 1500  # of a rank's exception, in a failure's first line


# Each process entry of the summary ("[k]:" then its fields), the root cause's and the other failures'
LAUNCH_FAILURE = re.compile(
    r"^\[\d+\]:\s*$.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)(.*?)(?=^\[\d+\]:\s*$|^-{3,}\s*$|^=+\s*$|\Z)",
    re.DOTALL | re.MULTILINE,
)


def launch_root_cause(launcher_output: str) -> str | None:
    """The process a multi-process launch lost first, in words, with its exception when it recorded one
    ("rank 1 exited with status 1 first: StepError: ...", "rank 1 was killed by SIGKILL ... first"), from
    the launcher's summary at the end of its output; None when there is none (one process, no launcher).

    torchrun orders failures by time, and a rank's time is when it wrote its error file, else when torchrun saw
    it die: a rank whose collective broke when its peer was killed can record that before torchrun notices the
    kill, and torchrun then stops it with SIGTERM. So a root cause stopped by SIGTERM yields to a failure in the
    summary that was not (SIGTERM is how torchrun stops the survivors; a rank SIGTERM'd from outside, whose peers
    then fail on the broken collective, is named after them: the rarer case, told apart by nothing in the summary)."""
    found = LAUNCH_ROOT_CAUSE.search(launcher_output or "")
    if not found:
        return None
    rank, code, details = found.group(1), int(found.group(2)), found.group(3)
    sigterm = (-signal.SIGTERM, 128 + signal.SIGTERM)  # the launcher's stop, as a status or a shell's code
    if code in sigterm:
        summary = launcher_output[max(0, launcher_output.rfind("Failures:", 0, found.start())) : found.start()]
        others = [m for m in LAUNCH_FAILURE.finditer(summary) if int(m.group(2)) not in sigterm]
        if others:
            rank, code, details = others[0].group(1), int(others[0].group(2)), others[0].group(3)
    cause = f"rank {rank} {exit_status(code)} first"
    reason = recorded_exception(details)
    return f"{cause}: {reason}" if reason else cause


def recorded_exception(details: str) -> str | None:
    """The exception at the end of a summary entry's `traceback :` (its lines indented by two spaces,
    the traceback's frames by more); None when the rank recorded none."""
    _, _, traceback = details.partition("traceback :")
    lines = traceback.rstrip().splitlines()
    if not lines or not lines[0].strip().startswith("Traceback"):
        return None  # "To enable traceback see: ...", or a signal's "Signal 9 (SIGKILL) received by PID ..."
    tail: list[str] = []
    for line in reversed(lines[1:]):
        if line.startswith("   ") or not line.strip():  # a frame: the exception's lines are all read
            if tail:
                break
            continue
        tail.insert(0, line.strip())
    text = " ".join(tail)
    return text[:REASON_CHARS] + (" ..." if len(text) > REASON_CHARS else "") if text else None
