"""The Dagster code location: `defs` merges the core assets with each area's definitions."""

from outcome_flywheel.settings import validate_environment

# First, before anything reads a variable: resources hold EnvVars that resolve only when a run
# starts and the partitions read theirs at import, so a bad value must stop the load here, named.
validate_environment()

import importlib  # noqa: E402

import dagster as dg  # noqa: E402

from assets.base_model import base_model  # noqa: E402
from pipelines.resources import core_resources  # noqa: E402

# Each area exposes its own `defs` (assets, checks, jobs, schedules, sensors, and the
# resources only it uses) in `pipelines/<area>.py`.
AREAS = ("pipelines.daily_rl", "pipelines.preferences", "pipelines.feedback")


def _area_defs() -> list[dg.Definitions]:
    areas = []
    for module in AREAS:
        try:
            areas.append(importlib.import_module(module).defs)
        except ModuleNotFoundError as err:
            if err.name != module:
                raise
    return areas


base_model_job = dg.define_asset_job(
    "base_model_job",
    selection=dg.AssetSelection.assets(base_model),
    description="Resolve FLYWHEEL_BASE_MODEL: build tiny-local (or fetch a hub model) and check that it loads and writes text. "
    "Run it first: both loops start from it.",
)


def _core_defs() -> dg.Definitions:
    # A function, not a module attribute: `dagster dev` refuses a module with two Definitions objects.
    return dg.Definitions(
        assets=dg.with_source_code_references([base_model]), jobs=[base_model_job], resources=core_resources()
    )


defs = dg.Definitions.merge(_core_defs(), *_area_defs())
