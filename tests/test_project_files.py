"""The project's own files: the environment is the locked one, and what the code cites exists."""

from __future__ import annotations

import re
import subprocess
from importlib import metadata

from outcome_flywheel.settings import PROJECT_ROOT

LOCK = PROJECT_ROOT / "requirements.lock"


def _locked() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[name.strip().lower().replace("_", "-")] = version.strip()
    return pins


def test_setup_installs_the_locked_versions():
    """`make setup` installs from requirements.lock, and this environment holds exactly those
    versions (torch's local build tag aside), so a fresh clone gets what CI tested."""
    makefile = (PROJECT_ROOT / "Makefile").read_text()
    assert '-c $(LOCK) -e ".[test,mlx]"' in makefile and "LOCK := requirements.lock" in makefile
    pins = _locked()
    assert {"torch", "transformers", "dagster", "peft", "trl", "numpy"} <= set(pins)
    assert all(re.fullmatch(r"[0-9][0-9A-Za-z.!]*", v) for v in pins.values()), "pins are plain versions"
    # the first of each name on sys.path, the one `import` finds: setuptools, once imported (Inductor's
    # C++ build does), appends its _vendor folder, whose older platformdirs and tomli come later
    installed: dict[str, str] = {}
    for dist in metadata.distributions():
        installed.setdefault(dist.metadata["Name"].lower().replace("_", "-"), dist.version)
    mismatched = {
        name: (version, installed[name])
        for name, version in pins.items()
        if name in installed and installed[name].split("+")[0] != version
    }
    assert not mismatched, f"installed versions differ from requirements.lock (run `make setup`): {mismatched}"
    assert installed["torch"].split("+")[0] == pins["torch"]


def test_code_and_docs_cite_only_files_the_repository_has():
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=PROJECT_ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    texts = [f for f in tracked if f.endswith((".py", ".md", ".yaml", ".toml")) and not f.startswith("tests/")]
    cited = set()
    for name in texts:
        body = (PROJECT_ROOT / name).read_text()
        assert "DESIGN.md" not in body, f"{name} cites DESIGN.md, which the repository does not have"
        cited |= set(re.findall(r"\bdocs/[a-z_]+\.md\b", body))
    missing = sorted(c for c in cited if not (PROJECT_ROOT / c).exists())
    assert not missing, missing
