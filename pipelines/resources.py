"""Resources shared by every area, configured from the environment (see README)."""

from resources.models import ModelBackendResource
from resources.storage import Warehouse


def core_resources() -> dict:
    return {"warehouse": Warehouse.from_env(), "model_backend": ModelBackendResource.from_env()}
