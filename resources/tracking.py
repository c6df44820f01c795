"""The tracking resource: where every training's MLflow run and the registered models go (`Tracker`)."""

from outcome_flywheel.tracking import Tracker
from resources.settings import DataclassResource, env_or_default, mirrored


class TrackingResource(DataclassResource[Tracker]):
    """MLflow tracking and registry (FLYWHEEL_MLFLOW_TRACKING_URI; empty = a SQLite store and artifacts in
    `$FLYWHEEL_DATA_DIR/mlflow/`, no server); hands the assets a `Tracker`, which the training steps get too."""

    plain = Tracker
    variables = {"tracking_uri": "FLYWHEEL_MLFLOW_TRACKING_URI"}
    data_dir: str = mirrored(Tracker, "data_dir")
    tracking_uri: str = mirrored(Tracker, "tracking_uri")
    timeout_s: int = mirrored(Tracker, "timeout_s")
    ui_url: str = mirrored(Tracker, "ui_url")

    def check_variables(self) -> None:
        if self.tracking_uri:  # empty = the embedded store (the rule is for a set variable)
            super().check_variables()

    @classmethod
    def from_env(cls) -> "TrackingResource":
        return cls(
            data_dir=env_or_default("FLYWHEEL_DATA_DIR"),
            tracking_uri=env_or_default("FLYWHEEL_MLFLOW_TRACKING_URI", ""),
        )
