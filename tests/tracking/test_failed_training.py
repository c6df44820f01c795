"""A training that fails mid-training, on the record: a real weighted-DPO training of tiny-local whose second
optimiser step raises (as an out-of-memory error would), recorded in a real MLflow SQLite store. The run ends
FAILED with the error in its tags, and the exception still fails the caller: both where the run is open around
the training (`with tracker.start(...)`) and where the run is recorded once the training has ended
(`with tracker.failures(...)`). A dead tracking server changes none of it but the record."""

from __future__ import annotations

import socket

import pytest
import torch
from mlflow import MlflowClient

from outcome_flywheel.models.loader import load_backend
from outcome_flywheel.models.train.dpo import train_weighted_dpo
from outcome_flywheel.models.train.dpo_config import PreferencePair, WeightedDPOConfig
from outcome_flywheel.tracking import Tracker
from tests.mlx_fixtures import PROMPTS, RESPONSES

OOM = "CUDA out of memory. Tried to allocate 2.00 GiB (raised by the test at optimiser step 2)"
CONFIG = WeightedDPOConfig(epochs=2, batch_size=2, reference_batch_size=2)  # 2 pairs a step: 4 steps


class OutOfMemory(RuntimeError):
    pass


@pytest.fixture()
def failing_step(monkeypatch):
    """AdamW's second step raises: the training fails after one optimiser step was taken."""
    steps = []
    original = torch.optim.AdamW.step

    def step(self, *args, **kwargs):
        steps.append(1)
        if len(steps) == 2:
            raise OutOfMemory(OOM)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", step)
    return steps


def _train(tiny_model_dir):
    backend = load_backend("torch", tiny_model_dir, device="cpu")
    pairs = [
        PreferencePair(PROMPTS[i % 3], RESPONSES[i % 3], RESPONSES[(i + 1) % 3] + " now" * i, w)
        for i, w in enumerate([1.0, 3.0, 0.3, 1.5])
    ]
    return train_weighted_dpo(backend, pairs, CONFIG)


def _client(tracker: Tracker) -> MlflowClient:
    return MlflowClient(tracking_uri=tracker.store_uri(), registry_uri=tracker.store_uri())


def _only_run(tracker: Tracker):
    client = _client(tracker)
    experiment = client.get_experiment_by_name("outcome-flywheel/preferences")
    (run,) = client.search_runs([experiment.experiment_id])
    return run


def _assert_failed_with_the_error(run, name: str) -> None:
    assert run.info.run_name == name
    assert run.info.status == "FAILED" and run.info.end_time is not None
    assert run.data.tags["error"] == f"OutOfMemory: {OOM}"
    assert run.data.tags["error_type"] == "OutOfMemory"
    trace = run.data.tags["error_traceback"]
    assert trace.startswith("Traceback") and "train_weighted_dpo" in trace and trace.rstrip().endswith(OOM)
    assert run.data.params["dpo.epochs"] == "2" and run.data.params["dpo.batch_size"] == "2"
    assert run.data.tags["asset_key"] == "preference_adapter"


def test_a_run_open_around_a_training_that_fails_ends_failed_with_the_error(tmp_path, tiny_model_dir, failing_step):
    tracker = Tracker(data_dir=str(tmp_path))
    warnings = []
    with pytest.raises(OutOfMemory, match="out of memory"):  # the training's own exception, unchanged
        with tracker.start(
            "preferences", "preference_adapter r1", {"asset_key": "preference_adapter"}, warnings.append
        ) as run:
            run.params({"dpo": CONFIG.as_dict()})
            _train(tiny_model_dir)
    assert len(failing_step) == 2  # it failed mid-training: one optimiser step taken, the second raised
    assert not warnings and run.error is None  # the record itself went fine
    recorded = _only_run(tracker)
    assert recorded.info.run_id == run.run_id
    _assert_failed_with_the_error(recorded, "preference_adapter r1")
    assert run.links()["mlflow_record"] == "recorded"


def test_a_training_recorded_once_it_ends_is_a_failed_run_when_it_raises(tmp_path, tiny_model_dir, failing_step):
    """The steps record their run after the training (the figures are the trainer's result): `failures` around
    the training records a failed one and lets the exception through."""
    tracker = Tracker(data_dir=str(tmp_path))
    tags = {"asset_key": "preference_adapter", "partition": "", "dagster_run_id": "abc"}
    with pytest.raises(OutOfMemory, match="out of memory"):
        with tracker.failures("preferences", "preference_adapter r2", tags, params={"dpo": CONFIG.as_dict()}):
            _train(tiny_model_dir)
    assert len(failing_step) == 2
    recorded = _only_run(tracker)
    _assert_failed_with_the_error(recorded, "preference_adapter r2")
    assert recorded.data.tags["dagster_run_id"] == "abc"


def test_a_training_that_succeeds_inside_failures_records_nothing_there(tmp_path):
    tracker = Tracker(data_dir=str(tmp_path))
    with tracker.failures("preferences", "fine"):
        pass
    assert not (tmp_path / "mlflow").exists()  # no store touched: the run is the caller's to record


def test_a_failing_training_with_a_dead_server_raises_its_own_error(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tracker = Tracker(data_dir=str(tmp_path), tracking_uri=f"http://127.0.0.1:{port}", timeout_s=2)
    warnings = []
    with pytest.raises(OutOfMemory, match="out of memory"):  # not the tracker's connection error
        with tracker.failures("preferences", "dead", log=warnings.append):
            raise OutOfMemory(OOM)
    assert len(warnings) == 1 and "start the run" in warnings[0]
