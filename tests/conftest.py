"""Shared fixtures: a tiny-local model built once per machine (cached under .cache/), and a
fresh data dir per test with that model linked in where the `base_model` asset puts it."""

from __future__ import annotations

import os
from pathlib import Path

# Under pytest-xdist each worker gets its share of the cores for torch's (and its subprocesses') threads:
# two workers of two threads each on two cores wait on each other's spinning threads, and a tiny model's
# step slows down several times over. Set before torch is imported; a value the caller set is kept.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
if _WORKERS > 1:
    _THREADS = str(max(1, len(os.sched_getaffinity(0)) // _WORKERS))
    for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_name, _THREADS)

import pytest  # noqa: E402

from outcome_flywheel.models.loader import ModelLoader  # noqa: E402
from outcome_flywheel.models.provision.tiny_local import cached_tiny_local  # noqa: E402
from outcome_flywheel.settings import PROJECT_ROOT  # noqa: E402
from outcome_flywheel.storage import Warehouse  # noqa: E402

SHARED_DATA = PROJECT_ROOT.parent / "shared" / "data"
pytest_plugins = ["tests.file_order"]  # the heaviest test files first


def pytest_configure(config):
    if _WORKERS > 1:  # in case torch was imported before the variables were set
        import torch

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    config.addinivalue_line(
        "markers",
        "production: the production shape on real servers (make up / make down, tests/deploy/test_production.py)",
    )
    config.addinivalue_line(
        "markers", "slow: a real-model loop of minutes; `make test-slow` runs them, CI's second stage (.ci/run)"
    )


@pytest.fixture(autouse=True)
def fixed_seeds():
    """Every test starts from the same global random state, whatever ran before it: a test that
    passes alone passes in the suite, in any order, on any machine."""
    import random

    import numpy as np
    import torch

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """tiny-local with the default config, installed or built once per machine (under a lock: test workers side
    by side wait for the first) and reused while its fingerprint holds."""
    return cached_tiny_local()


@pytest.fixture()
def data_dir(tmp_path, monkeypatch, tiny_model_dir) -> Path:
    """An empty FLYWHEEL_DATA_DIR holding only the prebuilt tiny-local model."""
    root = tmp_path / "data"
    (root / "models").mkdir(parents=True)
    os.symlink(tiny_model_dir, root / "models" / "tiny-local")
    monkeypatch.setenv("FLYWHEEL_DATA_DIR", str(root))
    return root


@pytest.fixture()
def warehouse(data_dir) -> Warehouse:
    return Warehouse(data_dir=str(data_dir))


@pytest.fixture()
def model_backend(data_dir) -> ModelLoader:
    return ModelLoader(data_dir=str(data_dir), base_model="tiny-local", backend="torch", device="cpu")


@pytest.fixture()
def torch_policy(model_backend):
    """The tiny-local base loaded with the torch backend."""
    return model_backend.load()


def shared_data(*parts: str) -> Path:
    """A path under ../shared/data; tests that need it skip where it is absent."""
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} is not present on this machine")
    return path


@pytest.fixture()
def world(tmp_path, tiny_model_dir) -> Path:
    """The review service's small world (tests/service_fixtures.py): tiny-local, one day of notes, a short audit log."""
    from tests.service_fixtures import make_world

    return make_world(tmp_path / "data", tiny_model_dir)


@pytest.fixture()
def client(world):
    """The review service on `world`, through FastAPI's TestClient (token: service_fixtures.TOKEN)."""
    from tests.service_fixtures import make_state, test_client

    return test_client(make_state(world))
