"""The Dagster code location: `defs` merges the core assets with each area's definitions."""

import importlib

import dagster as dg

from assets.base_model import base_model
from pipelines.resources import core_resources

# Each area exposes its own `defs` (assets, checks, jobs, schedules, sensors, and the
# resources only it uses) in `pipelines/<area>.py`.
AREAS = ("pipelines.daily_rl", "pipelines.flywheel")


def _area_defs() -> list[dg.Definitions]:
    areas = []
    for module in AREAS:
        try:
            areas.append(importlib.import_module(module).defs)
        except ModuleNotFoundError as err:
            if err.name != module:
                raise
    return areas


defs = dg.Definitions.merge(dg.Definitions(assets=[base_model], resources=core_resources()), *_area_defs())
