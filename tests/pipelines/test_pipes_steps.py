"""Heavy steps as Dagster Pipes processes (resources/steps.py, docs/pipes.md): a real subprocess
reports logs, metadata and checks through Pipes; a training killed with SIGKILL fails the step with
its stderr and leaves `latest` where it was, and a re-run succeeds; each launcher's command line
(python, accelerate, torchrun) starts a step that reaches Dagster; the Kubernetes pod the k8s
runner would send (no cluster here: the pod spec is built and checked, never submitted)."""

import json
import os
import sys
from pathlib import Path

import dagster as dg
import pytest

from assets.daily_rl.daily_update import daily_update
from assets.daily_rl.headlines import headlines
from assets.preferences.adapter import HISTORY_TABLE, preference_adapter
from assets.preferences.dataset import dpo_dataset
from assets.preferences.decisions import operator_decisions
from assets.preferences.outcomes import decision_outcomes
from outcome_flywheel.daily_rl.day_step import STEP as DAILY_UPDATE
from outcome_flywheel.daily_rl.distillation.step import STEP as DISTILLATION
from outcome_flywheel.daily_rl.note_scorer.step import STEP as NOTE_SCORER
from outcome_flywheel.preferences.adapter_step import STEP as ADAPTER
from outcome_flywheel.settings import SettingsError
from outcome_flywheel.steps import Step
from outcome_flywheel.steps.codec import StepPayloadError, from_payload, to_payload
from outcome_flywheel.steps.entry import CRASH_VARIABLE
from outcome_flywheel.steps.launch import StepLaunch, passthrough_env
from outcome_flywheel.steps.probe import STEP as PROBE
from resources.steps import StepRunnerResource, check_fields, exit_status
from tests.daily_fixtures import daily_resources, linked_data_dir

DAYS = ["2025-11-03", "2025-11-04"]
SMALL = {"ops": {"daily_update": {"config": {"rollouts_per_headline": 2, "max_new_tokens": 24, "batch_size": 8}}}}
SUBPROCESS = StepRunnerResource(runner="subprocess")


def _logs(instance, result) -> str:
    return "\n".join(entry.user_message for entry in instance.all_logs(result.run_id))


def _failure(result) -> str:
    failure = [e for e in result.all_events if e.is_step_failure][0]
    return failure.step_failure_data.error.message + str(failure.step_failure_data.user_failure_data)


def _latest(root) -> str | None:
    link = root / "checkpoints" / "policy" / "latest"
    return link.resolve().name if link.is_symlink() else None


# -- daily_update in a real subprocess ---------------------------------------------------------


@pytest.fixture(scope="module")
def daily(tmp_path_factory, tiny_model_dir):
    """DAYS[0] through the subprocess runner; DAYS[1]'s training is then killed, then re-run."""
    root = linked_data_dir(tmp_path_factory.mktemp("pipes"), tiny_model_dir)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLYWHEEL_DATA_DIR", str(root))
        mp.setenv("OMP_NUM_THREADS", "1")  # the step process's torch threads on the shared CPU
        res = {**daily_resources(root, max_headlines=2), "step_runner": SUBPROCESS}
        instance = dg.DagsterInstance.ephemeral()
        runs = {
            "first": dg.materialize(
                [headlines, daily_update], partition_key=DAYS[0], resources=res, run_config=SMALL, instance=instance
            )
        }
        runs["latest_after_first"] = _latest(root)
        mp.setenv(CRASH_VARIABLE, "train")
        runs["killed"] = dg.materialize(
            [headlines, daily_update],
            partition_key=DAYS[1],
            resources=res,
            run_config=SMALL,
            instance=instance,
            raise_on_error=False,
        )
        runs["latest_after_kill"] = _latest(root)
        runs["day_published_after_kill"] = (root / "checkpoints" / "policy" / DAYS[1]).exists()
        mp.delenv(CRASH_VARIABLE)
        runs["rerun"] = dg.materialize(
            [daily_update], partition_key=DAYS[1], resources=res, run_config=SMALL, instance=instance
        )
        yield root, res, instance, runs


def test_a_subprocess_step_reports_logs_metadata_and_checks_through_pipes(daily):
    root, res, instance, runs = daily
    result = runs["first"]
    assert result.success
    logs = _logs(instance, result)
    # the step's own log line, written in another process and carried back by Pipes
    line = next(entry for entry in logs.splitlines() if entry.startswith(f"daily_update {DAYS[0]}: tiny-local"))
    assert int(line.rsplit("process ", 1)[1]) != os.getpid()
    assert "[pipes] external process successfully opened dagster pipes" in logs
    meta = {e.asset_key.to_user_string(): e.materialization.metadata for e in result.get_asset_materialization_events()}
    assert set(meta) >= {"headlines", "rollout_scores", "policy_checkpoint", "rollouts"}
    assert meta["rollouts"]["dagster/row_count"].value == 4 and meta["rollouts"]["rollouts_per_headline"].value == 2
    assert meta["policy_checkpoint"]["kind"].value == "base"
    assert meta["policy_checkpoint"]["path"].value == str(root / "checkpoints" / "policy" / DAYS[0])
    assert meta["rollouts"]["example"].value.startswith("```")  # markdown kept its type through Pipes
    checks = {
        (c.asset_key.to_user_string(), c.check_name): c
        for c in result.get_asset_check_evaluations()
        if c.asset_key.to_user_string() != "headlines"
    }
    assert len(checks) == 5 and all(c.passed for c in checks.values())
    assert checks[("rollouts", "generated_by_own_checkpoint")].metadata["version_matches"].value is True
    assert runs["latest_after_first"] == DAYS[0]


def test_a_killed_training_fails_the_step_with_its_stderr_and_latest_stays(daily):
    root, res, instance, runs = daily
    result = runs["killed"]
    assert not result.success
    message = _failure(result)
    assert "step daily_update was killed by SIGKILL" in message
    assert f"{CRASH_VARIABLE}=train: training started; SIGKILL" in message  # the stderr tail
    assert runs["latest_after_kill"] == DAYS[0]
    assert f"{CRASH_VARIABLE}=train: training started, killing" in _logs(instance, result)  # its last Pipes log line
    assert not runs["day_published_after_kill"]  # the day's checkpoint folder was never published
    assert not any(
        e.asset_key.to_user_string() == "policy_checkpoint" for e in result.get_asset_materialization_events()
    )


def test_the_re_run_after_a_kill_succeeds_and_moves_latest(daily):
    root, res, instance, runs = daily
    result = runs["rerun"]
    assert result.success
    assert _latest(root) == DAYS[1]
    meta = {e.asset_key.to_user_string(): e.materialization.metadata for e in result.get_asset_materialization_events()}
    assert meta["policy_checkpoint"]["trained"].value is True and meta["policy_checkpoint"]["steps"].value >= 1
    # the memory budget's plan, through Pipes: no budget on the CPU, so each minibatch whole
    assert meta["policy_checkpoint"]["micro_batches"].value == meta["policy_checkpoint"]["steps"].value
    assert meta["policy_checkpoint"]["layers_recomputed"].value is False
    assert meta["rollout_scores"]["dagster/row_count"].value == 4
    assert all(c.passed for c in result.get_asset_check_evaluations() if c.check_name != "update_accepted_by_gate")


def test_an_error_in_the_step_process_fails_the_step_with_its_message_and_traceback(daily):
    root, res, instance, runs = daily
    missing = {
        "ops": {
            "daily_update": {
                "config": {**SMALL["ops"]["daily_update"]["config"], "outcome_headlines_date": "2025-11-20"}
            }
        }
    }
    result = dg.materialize(
        [daily_update],
        partition_key=DAYS[1],
        resources=res,
        run_config=missing,
        instance=instance,
        raise_on_error=False,
    )
    assert not result.success
    message = _failure(result)
    assert "step daily_update exited with status 1: DailyUpdateError:" in message and "2025-11-20" in message
    assert "Traceback (most recent call last)" in message  # the stderr tail
    assert _latest(root) == DAYS[1]


# -- preference_adapter: the killed DPO training ----------------------------------------------


def preference_pool(tmp_path, warehouse, model_backend, data_dir, step_runner) -> dict:
    """The preference flywheel's resources over the bundled audit log's range, its `dpo_dataset` made:
    what `preference_adapter` trains from."""
    from tests.flywheel_fixtures import bundled_decisions, flywheel_resources, write_log
    from tests.preferences.test_flywheel_assets import FIRST, LAST, RANGE

    log = write_log(tmp_path / "audit.jsonl", bundled_decisions(FIRST, LAST))
    res = flywheel_resources(warehouse, model_backend, log, data_dir, step_runner)
    assert dg.materialize([operator_decisions, decision_outcomes], resources=res, tags=RANGE).success
    assert dg.materialize([dpo_dataset], resources=res).success
    return res


def test_a_killed_dpo_training_is_recorded_and_latest_stays(tmp_path, warehouse, model_backend, data_dir, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the step process's torch threads on the shared CPU
    res = preference_pool(tmp_path, warehouse, model_backend, data_dir, SUBPROCESS)
    pool = warehouse.read("dpo_dataset")
    backups = warehouse.store.folder / "backups_dpo_dataset"
    cfg = {"ops": {"preference_adapter": {"config": {"epochs": 1, "batch_size": 16}}}}
    monkeypatch.setenv(CRASH_VARIABLE, "train")
    killed = dg.materialize([preference_adapter], resources=res, run_config=cfg, raise_on_error=False)
    assert not killed.success and "step preference_adapter was killed by SIGKILL" in _failure(killed)
    adapters = warehouse.path("adapters", "preference")
    assert not (adapters / "latest").exists()
    assert not list(adapters.glob(".staging-*")) if adapters.exists() else True
    hist = warehouse.read_all(HISTORY_TABLE)
    assert hist["status"].tolist() == ["failed"] and "killed by SIGKILL" in hist["error"][0]
    # The step was killed inside its pool backup: the asset wrote the pool back from the copy and
    # removed it (it stayed for good before), folder and all.
    assert "dpo_dataset restored from backups_dpo_dataset run=" in hist["error"][0]
    assert warehouse.partitions("backups_dpo_dataset") == [] and not backups.exists()
    assert warehouse.read("dpo_dataset").equals(pool)
    monkeypatch.delenv(CRASH_VARIABLE)
    again = dg.materialize([preference_adapter], resources=res, run_config=cfg)
    assert again.success and (adapters / "latest").is_symlink()
    assert not backups.exists()  # a success leaves no copy and no empty run= folder
    hist = warehouse.read_all(HISTORY_TABLE).sort_values("started_at")
    assert hist["status"].tolist() == ["failed", "succeeded"] and hist["steps"].iloc[-1] >= 1
    check = again.get_asset_check_evaluations()[0]
    assert check.check_name == "loss_is_finite" and check.passed  # reported by the step through Pipes


# -- launchers ---------------------------------------------------------------------------------


def test_launcher_command_lines():
    module = "outcome_flywheel.daily_rl.day_step"
    assert StepLaunch(python="/py").command(DAILY_UPDATE) == ["/py", "-m", module]
    assert StepLaunch(launcher="accelerate", processes=4, python="/py").command(DAILY_UPDATE) == [
        "/py",
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_machines",
        "1",
        "--num_processes",
        "4",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "-m",
        module,
    ]
    assert StepLaunch(launcher="torchrun", processes=2, python="/py").command(ADAPTER) == [
        "/py",
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes",
        "1",
        "--nproc_per_node",
        "2",
        "-m",
        "outcome_flywheel.preferences.adapter_step",
    ]
    with pytest.raises(ValueError, match="one process"):
        StepLaunch(launcher="python", processes=2)
    with pytest.raises(ValueError, match="launcher 'mpirun'"):
        StepLaunch(launcher="mpirun")
    with pytest.raises(ValueError, match="processes 'many'"):
        Step("nope", "outcome_flywheel.steps.probe", processes="many")
    # locally the orchestrator's interpreter; in a pod the image's
    assert StepRunnerResource(launcher="torchrun").command(PROBE)[0] == sys.executable
    assert StepRunnerResource(runner="k8s", k8s_image="x").command(PROBE)[:3] == [
        "python",
        "-m",
        "outcome_flywheel.steps.probe",
    ]


@dg.asset
def probe_step(context: dg.AssetExecutionContext, step_runner: StepRunnerResource):
    invocation = step_runner.run_step(context, PROBE, {"hello": "pipes"})
    probes = [m["probe"] for m in invocation.get_custom_messages() if "probe" in m]
    yield dg.MaterializeResult(metadata={"probe": dg.MetadataValue.json(probes[-1])})


@pytest.mark.parametrize("launcher", ["python", "accelerate", "torchrun"])
def test_each_launcher_starts_a_step_that_reaches_dagster(launcher, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_PROBE_SEEN", "yes")  # the run's environment reaches the step
    result = dg.materialize([probe_step], resources={"step_runner": StepRunnerResource(launcher=launcher)})
    assert result.success
    probe = result.get_asset_materialization_events()[0].materialization.metadata["probe"].value
    assert probe["rank"] == 0 and probe["world_size"] == 1 and probe["extras"] == {"hello": "pipes"}
    assert probe["passed_env"] == {"FLYWHEEL_PROBE_SEEN": "yes"} and probe["pid"] != os.getpid()


def test_a_step_that_cannot_use_several_processes_runs_as_one_and_says_so():
    """FLYWHEEL_STEP_LAUNCHER=torchrun FLYWHEEL_STEP_PROCESSES=2 (docs/deploy.md): the training steps and
    the probe get 2 processes; `note_scorer`, whose whole body would run in each, one process started
    plainly, and the step's log says so (the daily run: tests/models/train/test_data_parallel.py)."""
    two = StepLaunch(launcher="torchrun", processes=2, python="/py")
    assert two.command(NOTE_SCORER) == ["/py", "-m", "outcome_flywheel.daily_rl.note_scorer.step"]
    for step in (DAILY_UPDATE, ADAPTER, DISTILLATION, PROBE):
        assert two.command(step)[2] == "torch.distributed.run", step.name
    assert StepLaunch(launcher="torchrun", python="/py").command(NOTE_SCORER)[2] == "torch.distributed.run"
    runner = StepRunnerResource(launcher="torchrun", processes=2)
    assert "runs as one process, launched plainly" in runner.one_process_note(NOTE_SCORER)
    assert runner.one_process_note(DAILY_UPDATE) is None and SUBPROCESS.one_process_note(NOTE_SCORER) is None
    pod = StepRunnerResource(runner="k8s", k8s_image="x", launcher="torchrun", processes=2)
    assert pod.command(NOTE_SCORER) == ["python", "-m", "outcome_flywheel.daily_rl.note_scorer.step"]


@dg.asset
def failing_rank_step(context: dg.AssetExecutionContext):
    from outcome_flywheel.settings import PROJECT_ROOT
    from resources.steps import StepSubprocessClient

    launch = StepLaunch(launcher="torchrun", processes=2, python=sys.executable)
    command = launch.module_command("tests.pipelines.failing_rank_step")
    yield from StepSubprocessClient("probe").run(context=context, command=command, cwd=str(PROJECT_ROOT)).get_results()


def test_a_failed_launch_leads_with_the_failed_ranks_own_exception(monkeypatch):
    """A real torchrun launch of 2 processes whose rank 1 raises: the step's failure names rank 1, its
    exit status and its exception (recorded for the launcher by `entry.main`), not only torchrun's summary."""
    from tests.pipelines.failing_rank_step import REASON

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    result = dg.materialize([failing_rank_step], raise_on_error=False)
    assert not result.success
    failure = _failure(result)
    headline = failure.split("\n")[0]
    expected = f"step probe exited with status 1: rank 1 exited with status 1 first: RuntimeError: {REASON}"
    assert expected in headline, failure[-3000:]


def test_a_trainer_step_refuses_several_processes(monkeypatch):
    """A step body opened for one process refuses several: N copies would each write the day's outputs
    (docs/pipes.md). The training steps run data-parallel instead, rank 0 alone running the step
    (`entry.main`, tests/models/train/test_data_parallel.py)."""
    from outcome_flywheel.steps.entry import StepError, open_step

    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(StepError, match="WORLD_SIZE=2"):
        with open_step(_FakeLoader()):
            pass


class _FakeLoader:
    def is_dagster_pipes_process(self) -> bool:
        return True


# -- settings ----------------------------------------------------------------------------------


def test_the_runner_comes_from_the_environment_and_bad_values_are_named():
    runner = StepRunnerResource.from_env({})
    assert (runner.runner, runner.launcher, runner.processes) == ("subprocess", "python", 1)
    with pytest.raises(SettingsError) as err:
        StepRunnerResource.from_env(
            {"FLYWHEEL_STEP_RUNNER": "ray", "FLYWHEEL_STEP_LAUNCHER": "mpirun", "FLYWHEEL_STEP_PROCESSES": "0"}
        )
    for text in ("FLYWHEEL_STEP_RUNNER='ray'", "FLYWHEEL_STEP_LAUNCHER='mpirun'", "FLYWHEEL_STEP_PROCESSES='0'"):
        assert text in str(err.value)
    with pytest.raises(SettingsError, match="FLYWHEEL_K8S_IMAGE is unset"):
        StepRunnerResource.from_env({"FLYWHEEL_STEP_RUNNER": "k8s"})
    # each variable alone loads; the pair is refused when a step starts
    StepRunnerResource.from_env({"FLYWHEEL_STEP_PROCESSES": "2"})  # loads: an EnvVar, resolved when a run starts
    assert "accelerate or torchrun" in check_fields(StepRunnerResource(processes=2))[0]
    assert check_fields(StepRunnerResource(launcher="torchrun", processes=2)) == []


def test_payloads_round_trip_and_refuse_what_cannot_travel():
    from outcome_flywheel.daily_rl.day_settings import DailyUpdateSettings
    from outcome_flywheel.models.train.gspo_config import GSPOConfig

    settings = DailyUpdateSettings(rollouts_per_headline=3, gspo=GSPOConfig(lora=None, tis_cap=None))
    assert from_payload(DailyUpdateSettings, json.loads(json.dumps(to_payload(settings)))) == settings
    assert from_payload(DailyUpdateSettings, to_payload(DailyUpdateSettings())).gspo.lora.target_modules[0] == "q_proj"
    with pytest.raises(StepPayloadError, match="not a settings dataclass"):
        to_payload(object())
    with pytest.raises(StepPayloadError, match="no field"):
        from_payload(DailyUpdateSettings, {"rollouts": 3})


# torchrun's summary of a launch where rank 1 was killed and rank 0's collective broke (recorded in its error
# file) before torchrun saw the kill; torchrun then stopped rank 0 with SIGTERM and named it first by time
TORCHRUN_SUMMARY = """============================================================
outcome_flywheel.daily_rl.day_step FAILED
------------------------------------------------------------
Failures:
[0]:
  time      : 2026-12-02_18:28:59
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 18905)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 18905
------------------------------------------------------------
Root Cause (first observed failure):
[1]:
  time      : 2026-12-02_18:28:58
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 18904)  (SIGTERM)
  error_file: /tmp/torchelastic/attempt_0/0/error.json
  traceback : Traceback (most recent call last):
    File "outcome_flywheel/models/torch/training.py", line 300, in reduce_gradients
      dist.all_reduce(has, op=dist.ReduceOp.MAX)
  RuntimeError: Connection closed by peer [127.0.0.1]:42124.
  
============================================================
"""


def test_a_rank_the_launcher_stopped_does_not_lead_the_root_cause():
    """The SIGTERM'd rank 0 is torchrun's own stop, so the killed rank 1 leads; with no other kind of failure in
    the summary (every rank SIGTERM'd, or the root cause not SIGTERM'd) torchrun's root cause stands."""
    from outcome_flywheel.steps.launch import launch_root_cause

    assert (
        launch_root_cause(TORCHRUN_SUMMARY)
        == "rank 1 was killed by SIGKILL (out of memory, or killed), exit status -9 first"
    )
    all_stopped = TORCHRUN_SUMMARY.replace("exitcode  : -9 (pid: 18905)  (SIGKILL)", "exitcode  : -15 (pid: 18905)")
    assert launch_root_cause(all_stopped).startswith(
        "rank 0 was killed by SIGTERM, exit status -15 first: RuntimeError"
    )
    failed = TORCHRUN_SUMMARY.replace("exitcode  : -15 (pid: 18904)  (SIGTERM)", "exitcode  : 1 (pid: 18904)")
    assert (
        launch_root_cause(failed)
        == "rank 0 exited with status 1 first: RuntimeError: Connection closed by peer [127.0.0.1]:42124."
    )


def test_exit_status_names_kills():
    assert exit_status(-9) == "was killed by SIGKILL (out of memory, or killed), exit status -9"
    assert exit_status(137).startswith("was killed by SIGKILL") and exit_status(1) == "exited with status 1"


def test_passthrough_env_keeps_settings_and_credentials_only():
    env = passthrough_env({"FLYWHEEL_DATA_DIR": "d", "AWS_REGION": "r", "HF_HOME": "h", "HOME": "x", "SECRET": "y"})
    assert env == {"AWS_REGION": "r", "FLYWHEEL_DATA_DIR": "d", "HF_HOME": "h"}


def test_a_message_read_while_it_is_written_is_handled_once_it_is_whole():
    """The step writes a message; the run's reader thread may read the file mid-line. Dagster's own
    file reader then fails on the half line (a succeeded step lost its checks); ours waits for the
    newline. Real thread and file: the line is written in two halves with a pause between."""
    import json
    import threading
    import time

    from resources.steps import WholeLineTempFileMessageReader

    class Handler:
        def __init__(self):
            self.messages, self.errors = [], []

        def handle_message(self, message):
            self.messages.append(message)

        def report_pipes_framework_exception(self, origin, exc_info):
            self.errors.append((origin, exc_info[1]))

    handler = Handler()
    message = {"__dagster_pipes_version": "0.1", "method": "log", "params": {"message": "x" * 3000, "level": "INFO"}}
    line = json.dumps(message) + "\n"
    with WholeLineTempFileMessageReader().read_messages(handler) as params:
        path = params["path"]
        with open(path, "a", encoding="utf-8") as f:
            f.write(line[:1737])
            f.flush()
            time.sleep(0.2)  # the reader polls every 10 ms: it reads the half line
            f.write(line[1737:])
            f.flush()
        deadline = time.time() + 10
        while not handler.messages and time.time() < deadline:
            time.sleep(0.01)
    assert handler.errors == [] and handler.messages == [message]
    assert not any(t.name.startswith("Thread") and t.is_alive() and "reader" in str(t) for t in threading.enumerate())


@pytest.mark.parametrize("step", [DAILY_UPDATE, ADAPTER, DISTILLATION, NOTE_SCORER, PROBE], ids=lambda s: s.name)
def test_each_step_module_declares_the_step_its_asset_names(step):
    """No registry: the asset names the `Step` its module declares, and that module runs it under `python -m`."""
    import importlib

    module = importlib.import_module(step.module)
    assert module.STEP == step and callable(module.run)
    assert "main(STEP, run" in (Path(module.__file__).read_text())
