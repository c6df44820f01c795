"""A step process for tests/pipelines/test_pipes_steps.py, started as 2 processes by a launcher: rank 1
fails with its own exception while rank 0 waits (the launcher stops it). The step's failure must lead
with rank 1's exception, not only with the launcher's summary of exit statuses."""

import time

from outcome_flywheel.steps.entry import main, rank
from outcome_flywheel.steps.probe import STEP as PROBE

REASON = "rank 1's own reason: its shard of the day is empty"


def run(pipes) -> None:
    if rank() == 1:
        raise RuntimeError(REASON)
    time.sleep(120)  # rank 0: stopped by the launcher once rank 1 has failed


if __name__ == "__main__":
    main(PROBE, run, distributed=True)
