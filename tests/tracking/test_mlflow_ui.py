"""The MLflow UI on what the tracker records: a real `mlflow server` on 127.0.0.1 over a store the tracker wrote
(days' runs and the registry's mirror of an accepted and a rejected day, no model trained; a third day recorded
through the server itself), one run page and the registered model's versions opened in headless Chromium,
screenshotted, their text checked."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from outcome_flywheel.daily_rl.day_record import mirror_policy
from outcome_flywheel.tracking import Tracker
from scripts.browser_test import CHROMEDRIVER, CHROMIUM, make_driver

MISSING = [tool for tool in (CHROMIUM, CHROMEDRIVER) if not Path(tool).exists()]
pytestmark = pytest.mark.skipif(
    bool(MISSING) and shutil.which("apt-get") is None,
    reason="needs Debian's chromium and chromium-driver, which `make setup` installs where apt-get is",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


DAYS = (
    ("2025-11-04", "accepted", "2025-11-04@aaa", "within the KL budget"),
    ("2025-11-05", "rejected", "2025-11-04@aaa", "kl_to_parent 0.3 > 0.25"),
    ("2025-11-06", "accepted", "2025-11-06@bbb", "within the KL budget"),
)


def _record(data_dir: Path, days, tracker: Tracker) -> dict[str, str]:
    """Days as the daily step records them: params, per-step metrics, the registry's mirror."""
    root = data_dir / "checkpoints" / "policy"
    urls = {}
    for name, gate, version, reason in days:
        (root / name).mkdir(parents=True)
        info = {"verified": True, "date": name, "policy_version": version, "kind": "lora", "gate": gate}
        (root / name / "checkpoint.json").write_text(json.dumps(info))
        (root / "latest").unlink(missing_ok=True)
        (root / "latest").symlink_to(name)
        with tracker.start("daily_rl", f"daily_update {name}", {"partition": name, "gate": gate}) as run:
            run.params({"gspo": {"learning_rate": 1e-5, "epochs": 2}, "settings": {"rollouts_per_headline": 8}})
            run.series({"loss": [0.5, 0.4, 0.3], "clip_fraction": [0.0, 0.1, 0.05], "kl": [0.0, 1e-3, 2e-3]})
            mirror_policy(run, root, name, gate, reason)
        assert run.error is None, run.error
        urls[name] = run.url().split("#", 1)[1]
    return urls


def _page_text(driver, url: str, expected: str, timeout_s: float = 90) -> str:
    driver.get(url)
    deadline, text = time.monotonic() + timeout_s, ""
    while time.monotonic() < deadline:
        text = driver.find_element("tag name", "body").text
        if expected in text:
            time.sleep(1)  # the rest of the page's requests
            return driver.find_element("tag name", "body").text
        time.sleep(0.5)
    raise AssertionError(f"{expected!r} not on {url} after {timeout_s} s:\n{text[:2000]}")


def test_the_mlflow_ui_shows_a_run_and_the_models_versions(tmp_path):
    if MISSING:
        pytest.fail(f"{', '.join(MISSING)} missing: `make setup` installs Debian's chromium and chromium-driver")
    data = tmp_path / "data"
    tracker = Tracker(data_dir=str(data))
    urls = _record(data, DAYS[:2], tracker)  # into the embedded store, as `make demo` does
    port = _free_port()
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "mlflow"), "server", "--backend-store-uri", tracker.store_uri()]
        + ["--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "server.log", "w"),
        cwd=tmp_path,  # its default artifact folder (./mlartifacts)
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},  # as README's command: no job runners
        start_new_session=True,  # its workers in its own group, stopped together below
    )
    base = f"http://127.0.0.1:{port}"
    driver = None
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if urllib.request.urlopen(f"{base}/health", timeout=2).read() == b"OK":
                    break
            except OSError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, (tmp_path / "server.log").read_text()[-3000:]
            time.sleep(1)
        # the third day through the server: the checkpoint folder registered by reference (a JSON artifact
        # naming it: the server refuses a local path as a source)
        urls.update(_record(data, DAYS[2:], Tracker(data_dir=str(data), tracking_uri=base, timeout_s=60)))
        driver = make_driver()
        run_page = _page_text(driver, f"{base}/#{urls['2025-11-05']}", "daily_update 2025-11-05")
        driver.save_screenshot(str(tmp_path / "mlflow-run.png"))
        for text in ("gspo.learning_rate", "settings.rollouts_per_headline", "loss", "clip_fraction", "Finished"):
            assert text in run_page, (text, run_page[:2000])
        models = _page_text(driver, f"{base}/#/models/daily-policy", "Version 4")
        driver.save_screenshot(str(tmp_path / "mlflow-model.png"))
        for text in ("Version 3", "@ champion", "@ challenger", "kl_to_parent 0.3 > 0.25", "registered by reference"):
            assert text in models, (text, models[:3000])
    finally:
        if driver is not None:
            driver.quit()
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=30)
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracker.store_uri(), registry_uri=tracker.store_uri())
    champion = client.get_model_version_by_alias("daily-policy", "champion")
    assert champion.tags["checkpoint"] == "2025-11-06" and champion.source.startswith("runs:/")
    assert champion.tags["checkpoint_uri"] == (data / "checkpoints" / "policy" / "2025-11-06").resolve().as_uri()
    shots = [tmp_path / "mlflow-run.png", tmp_path / "mlflow-model.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000 for p in shots)
