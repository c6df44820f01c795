"""Where the record goes (`Tracker`) and one recorded training or evaluation (`TrackedRun`).

The default store is embedded: `sqlite:///$FLYWHEEL_DATA_DIR/mlflow/mlflow.db` with artifacts under
`$FLYWHEEL_DATA_DIR/mlflow/artifacts`, read by `mlflow ui --backend-store-uri sqlite:///...` (no server while
training). FLYWHEEL_MLFLOW_TRACKING_URI points elsewhere (an `mlflow server`'s http(s)://host:port, another
database URI), or `off`.

Tracking never breaks training: every call of a `TrackedRun` is guarded. The first failure (a dead server, a
refused request, a locked database) is logged as a warning, kept in `error` (the asset's metadata says it) and
ends the run's recording; the training goes on. MLflow's HTTP client retries a failed request 7 times with
exponential backoff and waits 120 s for an answer by default: inside the tracker's calls it retries none and
waits `timeout_s` (10 s) (MLFLOW_HTTP_REQUEST_* set for the call, restored after).

A training that fails is a FAILED run with its error (tags `error`, `error_type`, `error_traceback`), and the
exception goes on to fail the step: `with tracker.start(...) as run:` around the training, or, where the run is
recorded once the training has ended, `with tracker.failures(...):` around it (`record_failure`).
"""

from __future__ import annotations

import logging
import math
import os
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

from outcome_flywheel.settings import resolve_path

OFF = "off"
EXPERIMENT_PREFIX = "outcome-flywheel"
_MAX_PARAMS, _MAX_METRICS, _MAX_PARAM_CHARS = 100, 1000, 6000  # MLflow's limits per log_batch and param value
_MAX_TAG_CHARS = 7000  # MLflow keeps 8000 characters of a tag's value
_logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Tracker:
    """Where runs and registered models are recorded (MLflow), and how long a call may take."""

    data_dir: str = field(
        default="./data",
        metadata={"help": "Root of all project data (FLYWHEEL_DATA_DIR): the embedded store lives in its mlflow/."},
    )
    tracking_uri: str = field(
        default="",
        metadata={
            "help": "MLflow tracking URI (FLYWHEEL_MLFLOW_TRACKING_URI): empty = sqlite:///<data_dir>/mlflow/mlflow.db "
            "with artifacts in <data_dir>/mlflow/artifacts (no server); http(s)://host:port for an `mlflow server`; "
            "`off` records nothing."
        },
    )
    timeout_s: int = field(
        default=10, metadata={"help": "Seconds one call to a tracking server may take; a failed call is not retried."}
    )
    ui_url: str = field(
        default="http://127.0.0.1:5000",
        metadata={"help": "Where run links point for a store without a web server (the address of `mlflow ui`)."},
    )

    @property
    def enabled(self) -> bool:
        return self.tracking_uri.strip().lower() != OFF

    @property
    def embedded(self) -> bool:
        return not self.tracking_uri

    def folder(self) -> Path:
        return resolve_path(self.data_dir) / "mlflow"

    def store_uri(self) -> str:
        return self.tracking_uri or f"sqlite:///{self.folder() / 'mlflow.db'}"

    def web_url(self) -> str:
        """The MLflow UI the links point at: the server itself, else `ui_url` (`mlflow ui` on the store)."""
        uri = self.store_uri()
        return uri.rstrip("/") if uri.startswith(("http://", "https://")) else self.ui_url.rstrip("/")

    def ui_command(self) -> str:
        return f"mlflow ui --backend-store-uri {self.store_uri()}"

    def start(
        self, loop: str, run_name: str, tags: Mapping[str, Any] | None = None, log: Callable[[str], None] | None = None
    ) -> "TrackedRun":
        """A run in experiment `outcome-flywheel/<loop>` (made when missing); never raises."""
        run = TrackedRun(self, f"{EXPERIMENT_PREFIX}/{loop}", log)
        run.open(run_name, tags or {})
        return run

    def record_failure(
        self,
        loop: str,
        run_name: str,
        tags: Mapping[str, Any] | None,
        error: BaseException,
        log: Callable[[str], None] | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """A training that raised `error` before its run was recorded: a FAILED run with `params` and the error's
        tags; returns its links. Never raises (the caller re-raises `error`)."""
        run = self.start(loop, run_name, tags, log)
        run.params(params or {})
        run.finish(failed=True, error=error)
        return run.links()

    @contextmanager
    def failures(
        self,
        loop: str,
        run_name: str,
        tags: Mapping[str, Any] | None = None,
        log: Callable[[str], None] | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> Iterator[None]:
        """Around a training whose run is recorded once it has ended: an exception inside is recorded as a FAILED
        run (`record_failure`), then propagates unchanged."""
        try:
            yield
        except BaseException as err:
            self.record_failure(loop, run_name, tags, err, log, params)
            raise


def _bounded_env(timeout_s: int) -> dict[str, str]:
    return {
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "0",
        "MLFLOW_HTTP_REQUEST_TIMEOUT": str(max(1, int(timeout_s))),
    }


@contextmanager
def bounded(timeout_s: int) -> Iterator[None]:
    """MLflow's HTTP retries off and its timeout `timeout_s` for the duration of a call (restored after)."""
    limits = _bounded_env(timeout_s)
    saved = {name: os.environ.get(name) for name in limits}
    os.environ.update(limits)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def flat(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as dotted keys (`gspo.lora.r`)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flat(value, f"{name}."))
        else:
            out[name] = value
    return out


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def error_tags(error: BaseException) -> dict[str, str]:
    """What a failed run keeps of the exception that ended it: its first line, its type and the traceback's tail."""
    first = (str(error).strip().splitlines() or [""])[0]
    trace = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return {
        "error": f"{type(error).__name__}: {first}"[:_MAX_TAG_CHARS],
        "error_type": type(error).__name__,
        "error_traceback": trace[-_MAX_TAG_CHARS:],
    }


class TrackedRun:
    """One MLflow run whose every call is guarded (`call`): the first failure stops the recording, the
    caller goes on. `seconds` adds up the time spent in MLflow calls (the tracking's cost)."""

    def __init__(self, tracker: Tracker, experiment: str, log: Callable[[str], None] | None = None):
        self.tracker, self.experiment = tracker, experiment
        self.log = log or _logger.warning
        self.client: Any = None
        self.run_id: str | None = None
        self.experiment_id: str | None = None
        self.error: str | None = None
        self.seconds = 0.0

    @property
    def recording(self) -> bool:
        return self.tracker.enabled and self.error is None and self.run_id is not None

    def call(self, what: str, fn: Callable[[], Any]) -> Any:
        """`fn()` with MLflow's HTTP limits; None, a warning and the recording ended when it raises."""
        if not self.tracker.enabled or self.error is not None:
            return None
        started = time.perf_counter()
        try:
            with bounded(self.tracker.timeout_s):
                return fn()
        except Exception as err:  # noqa: BLE001 - any failure of the record must leave the training alone
            first = (str(err).strip().splitlines() or [""])[0][:400]
            self.error = f"{what}: {type(err).__name__}: {first}"
            self.log(f"MLflow tracking at {self.tracker.store_uri()} failed, training goes on unrecorded: {self.error}")
            return None
        finally:
            self.seconds += time.perf_counter() - started

    def fail(self, error: str) -> None:
        """Stop recording, with `error` as the reason (a failure outside an MLflow call)."""
        if self.error is None:
            self.error = error
            self.log(f"MLflow tracking stopped, training goes on unrecorded: {error}")
        if self.run_id is not None and self.client is not None:
            try:
                with bounded(self.tracker.timeout_s):
                    self.client.set_terminated(self.run_id, "FAILED")
            except Exception:  # noqa: BLE001
                pass

    def open(self, run_name: str, tags: Mapping[str, Any]) -> None:
        def _open() -> None:
            from mlflow import MlflowClient

            if self.tracker.embedded:
                (self.tracker.folder() / "artifacts").mkdir(parents=True, exist_ok=True)
            uri = self.tracker.store_uri()
            self.client = MlflowClient(tracking_uri=uri, registry_uri=uri)
            self.experiment_id = self._experiment()
            run = self.client.create_run(
                self.experiment_id, run_name=run_name, tags={k: str(v) for k, v in tags.items() if v is not None}
            )
            self.run_id = run.info.run_id

        self.call("start the run", _open)

    def _experiment(self) -> str:
        found = self.client.get_experiment_by_name(self.experiment)
        if found is not None:
            if found.lifecycle_stage == "deleted":
                self.client.restore_experiment(found.experiment_id)
            return found.experiment_id
        location = None
        if self.tracker.embedded:  # artifacts beside the database, one folder per experiment
            location = (self.tracker.folder() / "artifacts" / self.experiment.replace("/", "-")).as_uri()
        try:
            return self.client.create_experiment(self.experiment, artifact_location=location)
        except Exception:  # another process made it meanwhile
            found = self.client.get_experiment_by_name(self.experiment)
            if found is None:
                raise
            return found.experiment_id

    # -- what a run records -------------------------------------------------------------------------
    def params(self, values: Mapping[str, Any]) -> None:
        from_values = {k: str(v)[:_MAX_PARAM_CHARS] for k, v in flat(values).items() if v is not None}

        def _log() -> None:
            from mlflow.entities import Param

            items = [Param(k[:250], v) for k, v in sorted(from_values.items())]
            for i in range(0, len(items), _MAX_PARAMS):
                self.client.log_batch(self.run_id, params=items[i : i + _MAX_PARAMS])

        if self.recording and from_values:
            self.call("log params", _log)

    def metrics(self, values: Mapping[str, Any], step: int = 0) -> None:
        """Each finite number of `values` at `step` (None, NaN and text are left out)."""
        self.series({k: [v] for k, v in values.items()}, start=step)

    def series(self, values: Mapping[str, Iterable[Any]], start: int = 1) -> None:
        """Per-step histories: `values[name][i]` at step `start + i` (an optimiser step's loss, KL, ...)."""
        now = int(time.time() * 1000)
        points = [
            (name, start + i, number)
            for name, history in values.items()
            for i, value in enumerate(history)
            if (number := _number(value)) is not None
        ]

        def _log() -> None:
            from mlflow.entities import Metric

            items = [Metric(name[:250], value, now, step) for name, step, value in points]
            for i in range(0, len(items), _MAX_METRICS):
                self.client.log_batch(self.run_id, metrics=items[i : i + _MAX_METRICS])

        if self.recording and points:
            self.call("log metrics", _log)

    def tags(self, values: Mapping[str, Any]) -> None:
        def _log() -> None:
            from mlflow.entities import RunTag

            self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in values.items() if v is not None])

        if self.recording and values:
            self.call("set tags", _log)

    def artifacts(self, paths: Iterable[str | os.PathLike], folder: str | None = None) -> None:
        """Files (not copied elsewhere first: MLflow copies them into the run's artifact store)."""
        files = [Path(p) for p in paths if Path(p).is_file()]

        def _log() -> None:
            for file in files:
                self.client.log_artifact(self.run_id, str(file), folder)

        if self.recording and files:
            self.call("log artifacts", _log)

    def finish(self, failed: bool = False, error: BaseException | None = None) -> None:
        """End the run: FINISHED, or FAILED (`failed`, or an `error`, whose tags it gets first)."""
        if error is not None:
            self.tags(error_tags(error))
        if self.run_id is not None and self.error is None:
            status = "FAILED" if failed or error is not None else "FINISHED"
            self.call("end the run", lambda: self.client.set_terminated(self.run_id, status))

    def __enter__(self) -> "TrackedRun":
        return self

    def __exit__(self, kind, value, tb) -> None:
        """An exception inside (the training failed): the run ends FAILED with it, and it propagates."""
        self.finish(failed=kind is not None, error=value)

    # -- links back ---------------------------------------------------------------------------------
    def url(self) -> str | None:
        if self.run_id is None:
            return None
        return f"{self.tracker.web_url()}/#/experiments/{self.experiment_id}/runs/{self.run_id}"

    def links(self) -> dict[str, Any]:
        """What the asset's metadata shows: the run's URL (for the embedded store, where `mlflow ui` on the
        store serves it: `mlflow_ui`), its ids, or why the record failed."""
        if not self.tracker.enabled:
            return {"mlflow_record": "off (FLYWHEEL_MLFLOW_TRACKING_URI=off)"}
        out: dict[str, Any] = {}
        if self.run_id is not None:
            out.update(
                mlflow_run_url=self.url() or "",
                mlflow_run_id=self.run_id,
                mlflow_experiment=self.experiment,
                mlflow_tracking_uri=self.tracker.store_uri(),
            )
            if not self.tracker.store_uri().startswith(("http://", "https://")):
                out["mlflow_ui"] = self.tracker.ui_command()
        out["mlflow_record"] = f"failed: {self.error}" if self.error else "recorded"
        out["mlflow_seconds"] = round(self.seconds, 3)  # spent in MLflow calls: the record's cost
        return out
