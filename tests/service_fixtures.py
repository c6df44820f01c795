"""A small world for the service's tests: a data dir with tiny-local, one day of notes (two
headlines, three notes each, one note holding markup), a three-line audit log, and a service state
pointing at them with a known token."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pandas as pd

from outcome_flywheel.feedback.log import FeedbackLog
from outcome_flywheel.models.interface import LoraSettings
from outcome_flywheel.models.loader import ModelLoader
from outcome_flywheel.preferences.audit_log_file import BUNDLED_AUDIT_LOG, AuditLog
from outcome_flywheel.preferences.status import ADAPTERS_DIR, TRAIN_INFO
from outcome_flywheel.preferences.style_scorer import StyleScorer
from outcome_flywheel.storage import Warehouse, atomic_symlink
from service.config import ServiceConfig
from service.state import ServiceState
from tests.mlx_fixtures import perturb_torch_lora

TOKEN = "test-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
DAY = "2025-11-04"
HEADLINES = ("aaaa11112222", "bbbb33334444")
MARKUP_NOTE = "Trade Recommendation: Buy NVDA.\n<b>bold</b> <img src=x onerror=alert(2)>"


def write_notes(warehouse: Warehouse, day: str = DAY) -> None:
    rows, heads = [], []
    for h, headline_id in enumerate(HEADLINES):
        title = f"Headline {h}: chips rally"
        heads.append(
            {
                "date": day,
                "headline_id": headline_id,
                "title": title,
                "summary": "A summary.",
                "source": "test",
                "link": None,
            }
        )
        prompt = json.dumps([{"role": "user", "content": f"Write a trading note on: {title}"}])
        for i in range(3):
            response = (
                MARKUP_NOTE
                if (h, i) == (0, 2)
                else f"Trade Recommendation: {'Buy' if i % 2 == 0 else 'Sell'} NVDA.\nNote {h}-{i}."
            )
            rows.append(
                {
                    "date": day,
                    "headline_id": headline_id,
                    "rollout_index": i,
                    "title": title,
                    "summary": "A summary.",
                    "prompt": prompt,
                    "response": response,
                    "structure_score": 0.5 + 0.1 * i,
                    "policy_version": f"{day}@base",
                }
            )
    warehouse.write("rollouts", pd.DataFrame(rows), partition=day)
    warehouse.write("headlines", pd.DataFrame(heads), partition=day)


def small_audit_log(path: Path, n: int = 3) -> Path:
    lines = BUNDLED_AUDIT_LOG.read_text().splitlines()[:n]
    path.write_text("\n".join(lines) + "\n")
    return path


def make_state(root: Path, instance_factory=None) -> ServiceState:
    warehouse = Warehouse(data_dir=str(root))
    kwargs = {"instance_factory": instance_factory} if instance_factory else {}
    return ServiceState(
        config=ServiceConfig(token=TOKEN),
        warehouse=warehouse,
        audit_log=AuditLog(path=str(root / "audit_log.jsonl"), data_dir=str(root)),
        feedback_log=FeedbackLog(data_dir=str(root)),
        scorer=StyleScorer(
            warehouse, ModelLoader(data_dir=str(root), base_model="tiny-local", backend="torch", device="cpu")
        ),
        **kwargs,
    )


def test_client(state: ServiceState):
    """FastAPI's TestClient on the app, as a browser on the loopback address (the Host the service accepts)."""
    from fastapi.testclient import TestClient

    from service.app import create_app

    return TestClient(create_app(state), base_url="http://127.0.0.1")


test_client.__test__ = False  # a helper, not a test


def make_world(root: Path, tiny_model_dir: Path) -> Path:
    (root / "models").mkdir(parents=True)
    os.symlink(tiny_model_dir, root / "models" / "tiny-local")
    write_notes(Warehouse(data_dir=str(root)))
    small_audit_log(root / "audit_log.jsonl")
    return root


def publish_adapter(root: Path, name: str, seed: int) -> Path:
    """A LoRA adapter with random (seeded) weights, published as `latest` the way the adapter
    asset does: a real adapter the scorer must load, different for each seed."""
    backend = ModelLoader(data_dir=str(root), base_model="tiny-local", backend="torch", device="cpu").load()
    backend.add_lora(LoraSettings())
    perturb_torch_lora(backend, seed=seed)
    folder = root.joinpath(*ADAPTERS_DIR, name)
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    backend.save(folder)
    (folder / TRAIN_INFO).write_text(
        json.dumps({"run": name, "config": {"completion_unit": "sequence", "beta": 0.1}, "prompt_context_keys": []})
    )
    atomic_symlink(folder, root.joinpath(*ADAPTERS_DIR, "latest"))
    return folder


def service_environment(monkeypatch, root: Path, home: Path) -> None:
    """The variables a live service's Dagster runs read: the instance home, the data dir and audit log
    of `root`, torch on one thread (the shared 2-core machine)."""
    for name, value in {
        "DAGSTER_HOME": str(home),
        "FLYWHEEL_DATA_DIR": str(root),
        "FLYWHEEL_AUDIT_LOG": str(root / "audit_log.jsonl"),
        "OMP_NUM_THREADS": "1",
    }.items():
        monkeypatch.setenv(name, value)
