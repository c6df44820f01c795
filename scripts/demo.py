"""`make demo`: both loops from nothing on the embedded defaults, recorded in the project-local
Dagster instance ($DAGSTER_HOME, `.dagster/` via the Makefile), then a short summary.

Every step is a run of a named job of the code location (`base_model_job`, `daily_rl_job`,
`flywheel_decisions`, `flywheel_training`; `pipelines.launch.run_job`: the public `dg.execute_job`),
executed in this process, so `make ui` lists them on the job pages (docs/service.md says what the
UI cannot do with such runs).

    DAGSTER_HOME=$PWD/.dagster python -m scripts.demo [--days 3]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import time

import dagster as dg

from outcome_flywheel.daily_rl.note_scorer.model import tier_summary as note_scorer_summary
from outcome_flywheel.daily_rl.report.summary import distillation_summary, prompt_evolver_summary
from outcome_flywheel.models.serve.serving import tier_summary as serving_summary
from outcome_flywheel.settings import env, resolve_path
from pipelines.launch import IN_PROCESS, run_job
from scripts import QUIET_CONSOLE

# each tier's one-line summary of its state, by name
TIERS = (
    ("note_scorer", note_scorer_summary),
    ("prompt_evolver", prompt_evolver_summary),
    ("distillation", distillation_summary),
    ("serving", serving_summary),
)


def _area_demo(module: str):
    try:
        return importlib.import_module(module).run
    except ModuleNotFoundError as err:
        if err.name != module:
            raise
        return None


def _quiet_libraries() -> None:
    """Progress bars and deprecation chatter of transformers / PEFT say nothing about the demo."""
    import warnings

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    warnings.filterwarnings("ignore", category=FutureWarning)
    # The same for the step processes the assets launch (docs/pipes.md): they inherit the environment.
    os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    # Dagster's notes that an API used by the definitions (single-run backfills, code references) is beta.
    warnings.filterwarnings("ignore", category=dg.BetaWarning)
    warnings.filterwarnings("ignore", category=dg.PreviewWarning)


def main() -> None:
    parser = argparse.ArgumentParser(description="Run both loops on the embedded defaults.")
    parser.add_argument("--days", type=int, default=3, help="days of the bundled feed archive to run the daily loop on")
    args = parser.parse_args()
    _quiet_libraries()
    if not os.environ.get("DAGSTER_HOME"):
        raise SystemExit("set DAGSTER_HOME (the Makefile sets it to .dagster/): `make demo`")
    instance = dg.DagsterInstance.get()
    summary: dict = {
        "dagster_home": os.environ["DAGSTER_HOME"],
        "data_dir": str(resolve_path(env("FLYWHEEL_DATA_DIR"))),
    }

    started = time.perf_counter()
    result = run_job("base_model_job", instance, run_config={**QUIET_CONSOLE, **IN_PROCESS})
    meta = result.asset_materializations_for_node("base_model")[0].metadata
    summary["base_model"] = {
        "model": env("FLYWHEEL_BASE_MODEL"),
        "parameters": meta["parameters"].value,
        "seconds": round(time.perf_counter() - started, 1),
    }
    print(f"base_model: {summary['base_model']}", flush=True)

    for name, module, kwargs in (
        ("daily_rl", "scripts.demo_daily_rl", {"days": args.days}),
        ("flywheel", "scripts.demo_flywheel", {}),
    ):
        run = _area_demo(module)
        if run is None:
            summary[name] = "not built yet"
            continue
        started = time.perf_counter()
        summary[name] = run(instance, **kwargs)
        print(f"{name} finished in {time.perf_counter() - started:.0f} s", flush=True)

    # The learners beside the daily update (docs/tiers.md) and the served policy (docs/serving.md), one line each.
    summary["tiers"] = {name: tier_summary(summary["data_dir"]) for name, tier_summary in TIERS}

    print("\n== summary ==")
    print(json.dumps(summary, indent=2, default=str))
    print(
        "\nLook at it:\n"
        "  make ui    # Dagster UI on this instance: http://127.0.0.1:3000 (runs, asset metadata, figures)\n"
        "  make serve # review pages and REST API on this data: http://127.0.0.1:8765 (docs/service.md)\n"
        f"  .venv/bin/python -c \"import duckdb; print(duckdb.connect('{summary['data_dir']}/warehouse.duckdb', "
        "read_only=True).sql('SHOW TABLES'))\""
    )


if __name__ == "__main__":
    main()
