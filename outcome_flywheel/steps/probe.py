"""The `probe` step: loads no model; reports the process's launcher environment (rank, world size,
the Python running it). Checks that a launcher (python, accelerate, torchrun) starts a step whose
rank 0 reaches Dagster through Pipes, in the time it takes the launcher to start."""

from __future__ import annotations

import os
import sys

from outcome_flywheel.steps import Step
from outcome_flywheel.steps.entry import main, rank, world_size

# This step, as its asset names it (the step runner launches `python -m outcome_flywheel.steps.probe`).
STEP = Step("probe", "outcome_flywheel.steps.probe", processes="every")

PROBE_KEY = "probe"


def run(pipes) -> None:
    if pipes is None:  # ranks other than 0: nothing to report
        return
    pipes.log.info(f"probe: rank {rank()} of {world_size()}, pid {os.getpid()}")
    pipes.report_custom_message(
        {
            PROBE_KEY: {
                "rank": rank(),
                "world_size": world_size(),
                "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
                "python": sys.executable,
                "pid": os.getpid(),
                "extras": dict(pipes.extras),
                "passed_env": {k: os.environ[k] for k in sorted(os.environ) if k.startswith("FLYWHEEL_PROBE_")},
            }
        }
    )


if __name__ == "__main__":
    main(STEP, run, distributed=True)
