"""The review pages in a real browser (headless Chromium from Debian's packages, Selenium through
Debian's chromedriver), on the small world: the walk-through of `scripts/browser_test.py` (sign in,
feedback with a <script> correction shown as text, a curator's approval, the pair after
materialising feedback_pairs, the style panel, the status page). `make browser-test` installs the
browser and runs the same walk-through on a copy of the demo's data. `make setup` installs the browser
wherever apt-get is, so there the test runs (CI included) and fails when the browser is missing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from outcome_flywheel.storage import Warehouse
from scripts.browser_test import CHROMEDRIVER, CHROMIUM, run_in_browser
from tests.daily_history_fixtures import write_history
from tests.service_fixtures import TOKEN, make_state, make_world, publish_adapter, service_environment

MISSING = [tool for tool in (CHROMIUM, CHROMEDRIVER) if not Path(tool).exists()]
# Where apt-get is (CI, every Debian machine) `make setup` installs the browser: missing there, the test
# fails and says so. It is skipped only where nothing installs it (macOS: no Debian packages).
pytestmark = pytest.mark.skipif(
    bool(MISSING) and shutil.which("apt-get") is None,
    reason="needs Debian's chromium and chromium-driver, which `make setup` installs where apt-get is",
)


def test_the_pages_in_a_browser(tmp_path, tiny_model_dir, monkeypatch):
    if MISSING:
        pytest.fail(
            f"{', '.join(MISSING)} missing: `make setup` installs Debian's chromium and chromium-driver (as root or with sudo)"
        )
    root = make_world(tmp_path / "data", tiny_model_dir)
    publish_adapter(root, "run-a", seed=1)
    write_history(Warehouse(data_dir=str(root)))  # eight days of the daily loop: the status page's charts
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    service_environment(monkeypatch, root, home)
    summary = run_in_browser(make_state(root), TOKEN, tmp_path / "shots", materialize_timeout=240)
    assert summary["passed"] and summary["style_panel"]["score"].endswith("%")
    shots = sorted((tmp_path / "shots").glob("*.png"))
    assert [p.name for p in shots] == ["curation-pairs.png", "curation.png", "notes.png", "proposal.png", "status.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000 for p in shots)
