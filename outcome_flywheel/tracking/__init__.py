"""Experiment tracking and the model registry on MLflow (`MlflowClient`, no server needed by default).

`tracker.Tracker` says where the record goes (FLYWHEEL_MLFLOW_TRACKING_URI; empty = a SQLite store and an
artifact folder under the data dir) and opens runs (`TrackedRun`) whose every call is guarded: a store
that cannot be reached or fails makes the run log a warning and stop recording, never the training fail.
`registry` mirrors what the gate decided onto registered models (aliases `champion`, `challenger`).
"""

from outcome_flywheel.tracking.tracker import TrackedRun, Tracker

__all__ = ["TrackedRun", "Tracker"]
