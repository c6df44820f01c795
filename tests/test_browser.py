"""The review pages in a real browser (headless Chromium from Debian's packages, Selenium through
Debian's chromedriver), on the small world: the walk-through of `scripts/browser_test.py` (sign in,
feedback with a <script> correction shown as text, a curator's approval, the pair after
materialising feedback_pairs, the style panel, the status page). `make browser-test` installs the
browser and runs the same walk-through on a copy of the demo's data; here it is skipped without it."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.browser_test import CHROMEDRIVER, CHROMIUM, run_in_browser
from tests.service_fixtures import TOKEN, make_state, make_world, publish_adapter

pytestmark = pytest.mark.skipif(not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()),
                                reason="needs Debian's chromium and chromium-driver: `make browser-test` installs them")


def test_the_pages_in_a_browser(tmp_path, tiny_model_dir, monkeypatch):
    root = make_world(tmp_path / "data", tiny_model_dir)
    publish_adapter(root, "run-a", seed=1)
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    for name, value in {"DAGSTER_HOME": str(home), "FLYWHEEL_DATA_DIR": str(root), "FLYWHEEL_AUDIT_LOG": str(root / "audit_log.jsonl"),
                        "OMP_NUM_THREADS": "1"}.items():
        monkeypatch.setenv(name, value)
    summary = run_in_browser(make_state(root), TOKEN, tmp_path / "shots", materialize_timeout=240)
    assert summary["passed"] and summary["style_panel"]["score"].endswith("%")
    shots = sorted((tmp_path / "shots").glob("*.png"))
    assert [p.name for p in shots] == ["curation-pairs.png", "curation.png", "notes.png", "proposal.png", "status.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000 for p in shots)
