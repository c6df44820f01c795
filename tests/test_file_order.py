"""The suite's file order (tests/file_order.py): heaviest recorded file first, each file's tests together and in
their order, unknown files last; the record names only files that exist."""

from __future__ import annotations

from outcome_flywheel.settings import PROJECT_ROOT
from tests.file_order import RECORD, heaviest_first, recorded_seconds


def test_files_go_heaviest_first_with_their_tests_together_and_in_order():
    ids = ["a.py::t1", "a.py::t2", "b.py::t1", "c.py::t1", "c.py::t2[x]", "c.py::t2[y]", "d.py::t"]
    seconds = {"a.py": 3.0, "c.py": 50.0, "d.py": 3.0}
    assert [ids[k] for k in heaviest_first(ids, seconds)] == [
        "c.py::t1",
        "c.py::t2[x]",
        "c.py::t2[y]",
        "a.py::t1",
        "a.py::t2",
        "d.py::t",
        "b.py::t1",
    ]
    assert heaviest_first(ids, {}) == list(range(len(ids)))


def test_the_record_names_files_that_exist():
    seconds = recorded_seconds()
    assert seconds, f"{RECORD} is missing: make test PYTEST_ARGS=--record-file-seconds"
    missing = [f for f in seconds if not (PROJECT_ROOT / f).is_file()]
    assert not missing, f"renamed or removed since {RECORD.name} was recorded (record it again): {missing}"
