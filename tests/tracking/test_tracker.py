"""The tracker alone (no model): what a dead server, `off` and a failing figure do to a run and its links."""

import os
import socket
import time

from outcome_flywheel.tracking import Tracker
from outcome_flywheel.tracking.tracker import flat


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_dead_server_is_one_warning_and_no_retry(tmp_path):
    warnings = []
    tracker = Tracker(data_dir=str(tmp_path), tracking_uri=f"http://127.0.0.1:{_closed_port()}", timeout_s=2)
    started = time.perf_counter()
    with tracker.start("daily_rl", "dead", {"partition": "2025-11-04"}, warnings.append) as run:
        run.params({"a": 1})
        run.series({"loss": [1.0, 0.5]})
    assert time.perf_counter() - started < 20  # no retries with backoff (MLflow's default: 7, minutes)
    assert len(warnings) == 1 and "start the run" in warnings[0] and "training goes on" in warnings[0]
    links = run.links()
    assert links["mlflow_record"].startswith("failed: start the run: ") and "mlflow_run_url" not in links
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ and "MLFLOW_HTTP_REQUEST_TIMEOUT" not in os.environ


def test_off_records_nothing_and_says_so(tmp_path):
    with Tracker(data_dir=str(tmp_path), tracking_uri="off").start("daily_rl", "off") as run:
        run.metrics({"loss": 1.0})
    assert run.links() == {"mlflow_record": "off (FLYWHEEL_MLFLOW_TRACKING_URI=off)"}
    assert not (tmp_path / "mlflow").exists()


def test_the_embedded_store_keeps_params_series_and_links(tmp_path):
    from mlflow import MlflowClient

    tracker = Tracker(data_dir=str(tmp_path))
    with tracker.start("daily_rl", "day", {"partition": "2025-11-04"}) as run:
        run.params({"gspo": {"lora": {"r": 8}}, "skip": None})
        run.series({"loss": [1.0, float("nan"), 0.5], "text": ["a"]})
        run.metrics({"day/steps": 3, "label": "x"})
    links = run.links()
    assert links["mlflow_record"] == "recorded" and links["mlflow_ui"].startswith(
        "mlflow ui --backend-store-uri sqlite:"
    )
    assert links["mlflow_run_url"] == f"http://127.0.0.1:5000/#/experiments/{run.experiment_id}/runs/{run.run_id}"
    client = MlflowClient(tracking_uri=tracker.store_uri())
    got = client.get_run(run.run_id)
    assert got.data.params == {"gspo.lora.r": "8"} and got.data.metrics["day/steps"] == 3
    assert [(m.step, m.value) for m in client.get_metric_history(run.run_id, "loss")] == [(1, 1.0), (3, 0.5)]
    assert got.info.status == "FINISHED" and got.info.artifact_uri.startswith((tmp_path / "mlflow").as_uri())
    assert flat({"a": {"b": 1}, "c": 2}) == {"a.b": 1, "c": 2}
