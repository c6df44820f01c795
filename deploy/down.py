"""`make down`: stop what `make up` started, by the pids it recorded, and nothing else.

    python -m deploy.down [--home DIR]

The service first, then the webserver, the daemon and the code server (each with the processes it
started: run workers and their steps), then the MLflow server (its clients are stopped), each only after
checking that its pid still names the process `make up` started (start time and command line): TERM, a
grace period, then KILL. PostgreSQL last, with `pg_ctl stop -m fast`, on the cluster and port
`<home>/deploy.json` records (what runs, whatever the settings now say). Nothing recorded: it says so. It keeps deploy.json: `make clean-prod` reads it.

A `make up` still starting on the home (it holds `<home>/up.lock`) is asked to stop first
(`<home>/up.stop` naming it, then SIGTERM): it stops what it had started and exits non-zero saying
why; `make down` waits for it, then stops what is left, holding the lock itself meanwhile, so that
no `make up` starts anything on the home while it stops.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from deploy import guard, processes
from deploy.postgres import Cluster, find_binaries
from deploy.settings import home_of, parser, recorded, resolve

ORDER = ("service", "webserver", "daemon", "code_server", "mlflow")  # the MLflow server after its clients
UP_WAIT_S = 300  # for a `make up` asked to stop to stop what it started (each piece: TERM, up to 30 s, KILL)


def down(d, names=None) -> list[str]:
    """Stop the recorded processes (those of `names`, default all); one line per piece."""
    lines = []
    for name in ORDER:
        if (names is None or name in names) and processes.read_record(d.home, name):
            lines.append(processes.stop(d.home, name))
    record = processes.read_record(d.home, "postgres") if names is None or "postgres" in names else None
    if record:
        if record.process() is None:
            lines.append(f"postgres: pid {record.pid} was not running (stale pid file removed)")
        else:
            bin_dir = find_binaries()
            output = Cluster(d.pg_dir, d.pg_port, bin_dir).stop() if bin_dir else ""
            alive = record.process() is not None
            if alive:  # pg_ctl could not stop it (or is gone): the recorded pid, as for the others
                lines.append(processes.stop(d.home, "postgres"))
            else:
                lines.append(
                    f"postgres: stopped pid {record.pid} with pg_ctl ({output.splitlines()[-1] if output else 'stopped'})"
                )
        processes.remove_record(d.home, "postgres")
    return lines


def stop_up(home) -> list[str]:
    """Ask the `make up` running on `home` (if one is) to stop, and wait until it has; one line per `make up`."""
    lines, asked = [], set()
    deadline = time.monotonic() + UP_WAIT_S
    while (holder := guard.lock_holder(home)) is not None:
        pid, what = holder
        if what == "make up" and pid and pid not in asked:
            guard.request_stop(home, pid, f"`make down` (pid {os.getpid()})")
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            asked.add(pid)
            lines.append(
                f"make up: pid {pid} was starting the deployment: asked it to stop, it stops what it started "
                "(its own output says what), the rest is stopped below"
            )
        if time.monotonic() > deadline:
            lines.append(f"{what}: pid {pid} still holds {home / guard.LOCK_FILE} after {UP_WAIT_S} s: stopping anyway")
            break
        time.sleep(0.2)
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parser("make down", "Stop what `make up` started (by pid) and nothing else.").parse_args(argv)
    home = home_of(args)
    lines = []
    for _ in range(10):  # a `make up` that started after the first one ended is stopped too
        lines += stop_up(home)
        if not home.is_dir():
            break
        try:
            with guard.up_lock(home, "make down"):  # no `make up` starts anything while this one stops
                guard.clear_stop_request(home)
                deployment = recorded(home) or resolve(args)  # what `make up` started, not what the settings say now
                lines += down(deployment)
            break
        except guard.Busy:
            continue
    if not lines:
        print(f"make down: nothing is up (no pid files under {home / 'pids'})")
        return 0
    print("\n".join(["make down:"] + [f"  {line}" for line in lines]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
