"""scripts/walk_calls.py: a handle followed through the calls of a tiny made-up project (counted exactly),
and a smoke run on the project's own day."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from scripts.walk_calls import main, walk
from tests import PROJECT_ROOT

FILES = {
    "pkg/a.py": """
        from pkg.b import helper
        from pkg.handle import Handle
        from pkg.store import Store


        def entry(h: Handle, n, other):
            print(h.name)  # a part of the handle as an argument: a stop, not followed
            helper(h, n)  # into b.py, then c.py, back to a.py
            other.go(n)  # not a stop
            prev = h.items  # a part, no alias
            prev.count()  # not a stop
            s = Store(h)  # the store keeps the handle as self.handle: s.handle is tracked
            s.fetch(n)  # a method on its holder
            finish(h)  # entered already from c.py: counted, not entered again
            helper(h, 2)


        def finish(h):
            h.close()


        def run(s: Store, other):
            s.fetch(1)
            s.other.x()  # a part of the holder that is not the handle: not a stop
            other.go(s.size)  # neither
        """,
    "pkg/b.py": """
        from pkg.c import deeper


        def helper(x, n):
            return deeper(n, x=x)
        """,
    "pkg/c.py": """
        from pkg import a


        def deeper(n, x=None):
            a.finish(x)
            return n
        """,
    "pkg/handle.py": """
        class Handle:
            def read(self):
                return self.raw()

            def raw(self):
                return 1

            def close(self):
                pass
        """,
    "pkg/store.py": """
        from pkg.handle import Handle


        class Store:
            def __init__(self, handle: Handle):
                self.handle, self.size = handle, 0

            def fetch(self, n):
                wh = self.handle
                wh.read()
                self.size += n
                self.helper2(lambda: n)

            def helper2(self, f):
                return f()
        """,
}


def make(root: Path) -> Path:
    for name, text in FILES.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
        (path.parent / "__init__.py").touch()
    return root


def test_a_handle_through_two_files_and_back(tmp_path):
    stops, figures = walk(make(tmp_path), "pkg.a:entry", "h")
    assert [(s.depth, s.call, s.callee, s.file) for s in stops] == [
        (0, "print", None, "pkg/a.py"),
        (0, "helper", "pkg.b.helper", "pkg/b.py"),
        (1, "deeper", "pkg.c.deeper", "pkg/c.py"),
        (2, "a.finish", "pkg.a.finish", "pkg/a.py"),
        (3, "h.close", "pkg.handle.Handle.close", "pkg/handle.py"),
        (0, "Store", "pkg.store.Store.__init__", "pkg/store.py"),
        (0, "s.fetch", "pkg.store.Store.fetch", "pkg/store.py"),
        (1, "wh.read", "pkg.handle.Handle.read", "pkg/handle.py"),
        (2, "self.raw", "pkg.handle.Handle.raw", "pkg/handle.py"),
        (1, "self.helper2", "pkg.store.Store.helper2", "pkg/store.py"),
        (0, "finish", "pkg.a.finish", "pkg/a.py"),
        (0, "helper", "pkg.b.helper", "pkg/b.py"),
    ]
    # files: a b c a | handle store store handle handle store a b -> back to a, handle, store, a, b
    assert figures == {
        "entry": "pkg.a:entry",
        "handle": "h",
        "stops": 12,
        "files": 5,
        "returns": 5,
        "by_file": {"pkg/a.py": 2, "pkg/handle.py": 1, "pkg/store.py": 1, "pkg/b.py": 1},
    }


def test_a_handle_a_holder_keeps_as_an_attribute(tmp_path):
    stops, figures = walk(make(tmp_path), "pkg.a:run", "s.handle")
    assert [(s.call, s.file) for s in stops] == [
        ("s.fetch", "pkg/store.py"),
        ("wh.read", "pkg/handle.py"),
        ("self.raw", "pkg/handle.py"),
        ("self.helper2", "pkg/store.py"),
    ]
    assert (figures["stops"], figures["files"], figures["returns"]) == (4, 2, 1)


def test_the_command_prints_a_tree_then_one_json_line(tmp_path, capsys):
    assert main(["pkg.a:run", "s.handle", "--show", "--root", str(make(tmp_path))]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "pkg/a.py:23  s.fetch(..)  -> pkg.store.Store.fetch"
    assert lines[1].startswith("  pkg/store.py:10  wh.read(..)")
    assert json.loads(lines[-1]) == {"entry": "pkg.a:run", "handle": "s.handle", "stops": 4, "files": 2, "returns": 1}


def test_the_days_walks_on_the_project():
    """Issue 48's bounds on following a day: the model backend in at most 30 stops with at most 8 returns to a
    file already left, the warehouse in at most 25 stops (None: no bound, the figure is printed)."""
    for entry, handle, most_stops, most_returns in [
        ("outcome_flywheel.daily_rl.day:run_daily_update", "models", 30, 8),
        ("outcome_flywheel.daily_rl.day:run_daily_update", "store.warehouse", 25, None),
        ("outcome_flywheel.daily_rl.day_step:run", "warehouse", None, None),
    ]:
        stops, figures = walk(PROJECT_ROOT, entry, handle)
        print(json.dumps(figures))
        assert figures["stops"] > 0
        assert most_stops is None or figures["stops"] <= most_stops, figures
        assert most_returns is None or figures["returns"] <= most_returns, figures
