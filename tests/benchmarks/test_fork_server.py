"""The benchmark smoke's fork server (`fork_server.py`), on modules that take no time: a child that ends at
once (its status and output lines may reach the pipe together), one that fails, one past its timeout."""

from __future__ import annotations

import json
import os
import time

import pytest

from tests.benchmarks.fork_server import ForkServer


@pytest.fixture
def server(tmp_path):
    (tmp_path / "sleeper.py").write_text("import time\nprint('started', flush=True)\ntime.sleep(60)\n")
    (tmp_path / "failing.py").write_text("import sys\nprint('to stderr', file=sys.stderr)\nraise SystemExit(3)\n")
    forks = ForkServer(dict(os.environ), tmp_path, preload=())
    yield forks
    forks.close()


def test_quick_children_failures_and_timeouts_are_reported(server, tmp_path):
    env = dict(os.environ, FORK_TEST="seen")
    for _ in range(3):  # a child that ends at once, again and again: no line is lost in a buffer
        done = server.run("platform", [], tmp_path, env, tmp_path, timeout=60)
        assert done.returncode == 0 and done.stdout.strip()
    failed = server.run("failing", [], tmp_path, env, tmp_path, timeout=60)
    assert failed.returncode == 3 and "to stderr" in failed.stderr
    slept = server.run("sleeper", [], tmp_path, env, tmp_path, timeout=3)
    assert slept.returncode == -9 and "started" in slept.stdout
    missing = server.run("no_such_module", [], tmp_path, env, tmp_path, timeout=60)
    assert missing.returncode == 1 and "No module named" in missing.stderr


def test_two_lines_that_reach_the_pipe_together_are_both_read(server, tmp_path):
    """The child's pid and its exit status written before the test reads either: both are read, the second
    without waiting (a buffered reader would keep it where select() does not look, and time out)."""
    out = str(tmp_path / "quick.out")
    request = dict(module="platform", args=[], cwd=str(tmp_path), env=dict(os.environ), stdout=out, stderr=out)
    server.process.stdin.write(json.dumps(request) + "\n")
    server.process.stdin.flush()
    time.sleep(3)  # the child has long ended: both lines are in the pipe
    assert "pid" in json.loads(server._line(10))
    assert json.loads(server._line(10)) == {"returncode": 0}
