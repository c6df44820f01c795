"""The heavy steps as their own processes, and what every step process shares (Pipes, launchers, payloads).

Each step is launched by an asset through Dagster Pipes (`resources/steps.py` picks where: a local
subprocess, the asset's own process, or a Kubernetes pod). A step reads what the asset sent as Pipes
extras (the resources' settings and the run config, as JSON), writes its outputs where the method
always writes them (the warehouse, the checkpoint and adapter folders) and reports back through
Pipes: log lines, each asset's materialization metadata and the asset checks. Plain Python and
`dagster_pipes` only: the pod or machine running a step needs the project, not Dagster.

Steps and the modules `python -m` runs (a step's body lives in its area, which this package, below
the areas, never imports): `daily_update` (judge, GSPO training, gate, checkpoint, rollout generation,
verify), `preference_adapter` (weighted-DPO training of the LoRA adapter), `probe` (reports its
launcher's ranks; checks a launcher without loading a model).
"""

STEP_MODULES = {
    "daily_update": "outcome_flywheel.daily_rl.day_step",
    "preference_adapter": "outcome_flywheel.preferences.adapter_step",
    "probe": "outcome_flywheel.steps.probe",
    "note_scorer": "outcome_flywheel.daily_rl.note_scorer.step",
    "distillation": "outcome_flywheel.daily_rl.distillation.step",
}


# The steps that use several processes when a launcher starts several (FLYWHEEL_STEP_PROCESSES > 1): the
# training steps run data-parallel (`entry.run_data_parallel`: rank 0 runs the step, the other ranks join its
# trainers) and `probe` reports its ranks. Every other step (`note_scorer`) would run its whole body in every
# process, so it runs as one process, launched plainly (`launch.StepLaunch.for_step`).
DATA_PARALLEL_STEPS = ("daily_update", "preference_adapter", "distillation")
MULTI_PROCESS_STEPS = (*DATA_PARALLEL_STEPS, "probe")


def step_module(step: str) -> str:
    """The module `python -m` runs for `step`; a clear error for an unknown step."""
    if step not in STEP_MODULES:
        raise ValueError(f"unknown step {step!r}; steps: {', '.join(STEP_MODULES)}")
    return STEP_MODULES[step]
