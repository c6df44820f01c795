"""One way for every benchmark to keep its result: run it with `--record` and its result goes to
benchmarks/results/<benchmark>.json with the machine, the date (UTC), the git commit and the arguments beside it.

The file is a JSON object `{"benchmark": name, "runs": [...]}`, one entry per (arguments, machine): a run with the same
arguments on the same machine replaces its entry, so a CPU run and a GPU run of one benchmark both stay. It is written
atomically (a temp file beside it, then a rename). `--record` is off by default, so smoke runs write nothing into the
repository; `BENCHMARK_RESULTS_DIR` sends the file to another folder (the tests use it). Figures in the docs point here
instead of being copied into prose by hand. The last printed line stays the result, one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
RESULTS = PROJECT / "benchmarks" / "results"
DIR_VARIABLE = "BENCHMARK_RESULTS_DIR"


def add_record_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--record",
        action="store_true",
        help="also write the result, with the machine, the date (UTC) and the git commit, to "
        f"benchmarks/results/<benchmark>.json (or ${DIR_VARIABLE}/<benchmark>.json)",
    )


def results_dir() -> Path:
    return Path(os.environ.get(DIR_VARIABLE) or RESULTS)


def cpu_model() -> str | None:
    """The CPU's model name (`platform.processor()` is empty on Linux: /proc/cpuinfo's "model name" there)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip() or None
    except OSError:
        pass
    return platform.processor() or None


def cpu_capability() -> str | None:
    """The vector kernels torch runs on this CPU (AVX512, AVX2, ...). The kernels and the CPU decide how each sum
    rounds, and a sampled run of the same seeds can part ways between machines (docs/daily_rl.md)."""
    try:
        import torch

        return torch.backends.cpu.get_cpu_capability()
    except Exception:  # no torch, or one without the query: unknown, as far as the record goes
        return None


def machine() -> dict:
    """What the figures were measured on: the parts that identify the machine (no load, no host name)."""
    found = dict(
        platform=platform.platform(),
        arch=platform.machine(),
        processor=platform.processor() or None,
        cpu_model=cpu_model(),
        cpu_capability=cpu_capability(),
        cpu_count=os.cpu_count(),
        python=platform.python_version(),
        gpu=None,
    )
    try:
        import torch

        found["torch"] = torch.__version__
        if torch.cuda.is_available():
            found["gpu"] = torch.cuda.get_device_name(0)
            found["gpu_count"] = torch.cuda.device_count()
    except Exception:  # no torch, or a CUDA that cannot answer: a machine without a GPU, as far as the record goes
        pass
    return found


def git_commit() -> dict:
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=PROJECT, capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            return ""

    commit = git("rev-parse", "HEAD").strip()
    if not commit:  # a copy without .git (a lent GPU machine): the commit it was copied from, when given
        return dict(commit=os.environ.get("GIT_COMMIT") or None, dirty=None)
    return dict(commit=commit, dirty=bool(git("status", "--porcelain", "--untracked-files=no").strip()))


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def _key(entry: dict) -> tuple:
    """Runs of the same arguments on the same kind of machine replace each other (a new kernel or torch does not
    make another machine)."""
    m = entry.get("machine") or {}
    return json.dumps(entry.get("args")), m.get("arch"), m.get("processor"), m.get("cpu_count"), m.get("gpu")


def write_result(name: str, result: dict, args: list[str] | None = None, directory: Path | None = None) -> Path:
    """Add this run's result to <directory>/<name>.json (default: results_dir()), replacing the entry of the same
    arguments on the same machine; returns the file's path."""
    path = (directory or results_dir()) / f"{name}.json"
    entry = dict(
        recorded_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        machine=machine(),
        load_average=_load_average(),  # the 1, 5 and 15 minute averages when it ended: times under load are slower
        git=git_commit(),
        args=[a for a in (sys.argv[1:] if args is None else args) if a != "--record"],
        result=result,
    )
    runs = []
    if path.exists():
        try:
            runs = json.loads(path.read_text()).get("runs", [])
        except (ValueError, AttributeError):
            runs = []
    runs = [r for r in runs if _key(r) != _key(entry)]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(dict(benchmark=name, runs=[*runs, entry]), indent=1, default=str) + "\n")
    os.replace(tmp, path)
    return path


def finish(name: str, result: dict, record: bool, argv: list[str] | None = None) -> dict:
    """The benchmark's end: with `record`, write the result (and say where), then print it as the last line. `argv`:
    the arguments main() parsed, when not the command line's."""
    if record:
        print(f"recorded in {write_result(name, result, argv)}")
    print(json.dumps(result, default=str))
    return result
