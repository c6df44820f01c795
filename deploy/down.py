"""`make down`: stop what `make up` started, by the pids it recorded, and nothing else.

    python -m deploy.down [--home DIR]

The service first, then the webserver, the daemon and the code server (each with the processes it
started: run workers and their steps), each only after checking that its pid still names the process
`make up` started (start time and command line): TERM, a grace period, then KILL. PostgreSQL last,
with `pg_ctl stop -m fast`, on the cluster and port `<home>/deploy.json` records (what runs, whatever
the settings now say). Nothing recorded: it says so. It keeps deploy.json: `make clean-prod` reads it.
"""

from __future__ import annotations

import sys

from deploy import processes
from deploy.postgres import Cluster, find_binaries
from deploy.settings import home_of, parser, recorded, resolve

ORDER = ("service", "webserver", "daemon", "code_server")


def down(d) -> list[str]:
    """Stop the recorded processes; one line per piece."""
    lines = []
    for name in ORDER:
        if processes.read_record(d.home, name):
            lines.append(processes.stop(d.home, name))
    record = processes.read_record(d.home, "postgres")
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


def main(argv: list[str] | None = None) -> int:
    args = parser("make down", "Stop what `make up` started (by pid) and nothing else.").parse_args(argv)
    deployment = recorded(home_of(args)) or resolve(args)  # what `make up` started, not what the settings say now
    lines = down(deployment)
    if not lines:
        print(f"make down: nothing is up (no pid files under {deployment.home / 'pids'})")
        return 0
    print("\n".join(["make down:"] + [f"  {line}" for line in lines]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
