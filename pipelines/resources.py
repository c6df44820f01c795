"""Resources shared by every area, configured from the environment (see README)."""

from resources.market_data import MarketDataResource
from resources.models import ModelBackendResource
from resources.steps import StepRunnerResource
from resources.storage import WarehouseResource
from resources.tracking import TrackingResource


def core_resources() -> dict:
    """The warehouse, the models, the market data (the flywheel's T+5 outcomes and the daily
    loop's call outcomes read the same prices), where the training steps run (docs/pipes.md) and where
    every training is recorded (MLflow, `tracking`)."""
    return {
        "warehouse": WarehouseResource.from_env(),
        "model_backend": ModelBackendResource.from_env(),
        "market_data": MarketDataResource.from_env(),
        "step_runner": StepRunnerResource.from_env(),
        "tracking": TrackingResource.from_env(),
    }
