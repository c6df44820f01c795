"""The suite's test files heaviest first, so that `make test`'s workers end together.

pytest-xdist's `--dist loadfile` hands each worker a whole file at a time, in collection order (the
Makefile turns off xdist's own reorder, which goes by the number of tests in a file, not their time).
A file of minutes handed out last keeps one worker busy while the other idles, so the files are
collected in the order of their seconds in a recorded run (`file_seconds.json` beside this module),
heaviest first: the longest-processing-time-first rule. A file the record does not know goes last,
the tests within a file keep their order, and a stale record only costs idle time, never a result.
The gain is small on this suite, whose files are many and short beside its total: replayed over the
quiet record, xdist's order ends 22 s after the ideal (1,104 s against 1,082), this one at it.

    make test PYTEST_ARGS=--record-file-seconds   # writes tests/file_seconds.json from this run
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

RECORD = Path(__file__).with_name("file_seconds.json")
_seconds: defaultdict[str, float] = defaultdict(float)


def pytest_addoption(parser):
    parser.addoption(
        "--record-file-seconds",
        action="store_true",
        help=f"write each test file's seconds (setup, call and teardown) in this run to {RECORD.name}",
    )


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def recorded_seconds(path: Path = RECORD) -> dict[str, float]:
    return json.loads(path.read_text()) if path.exists() else {}


def heaviest_first(nodeids: list[str], seconds: dict[str, float]) -> list[int]:
    """The positions of `nodeids` with their files in descending recorded seconds (unknown: 0); a
    stable order, so each file's tests stay together and in their order."""
    return sorted(range(len(nodeids)), key=lambda k: -seconds.get(file_of(nodeids[k]), 0.0))


def pytest_collection_modifyitems(config, items):
    order = heaviest_first([item.nodeid for item in items], recorded_seconds())
    items[:] = [items[k] for k in order]


def pytest_runtest_logreport(report):
    _seconds[file_of(report.nodeid)] += report.duration


def pytest_sessionfinish(session):
    config = session.config
    # under xdist the controller hears every worker's reports; a worker (workerinput) writes nothing
    if config.getoption("--record-file-seconds") and not hasattr(config, "workerinput") and _seconds:
        ordered = dict(sorted(((f, round(s, 1)) for f, s in _seconds.items()), key=lambda fs: -fs[1]))
        temporary = RECORD.with_suffix(".tmp")
        temporary.write_text(json.dumps(ordered, indent=1) + "\n")
        temporary.replace(RECORD)
