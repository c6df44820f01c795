"""Resources shared by every area, configured from the environment (see README)."""

from resources.models import ModelBackendResource
from resources.storage import WarehouseResource


def core_resources() -> dict:
    return {"warehouse": WarehouseResource.from_env(), "model_backend": ModelBackendResource.from_env()}
