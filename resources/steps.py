"""The step runner: where the heavy steps (GSPO training and rollout generation in `daily_update`,
weighted DPO in `preference_adapter`) run. A resource choice, not a code change (docs/pipes.md):

- `subprocess` (default): `python -m <the step's module>` (its `Step`) on this machine, in its own
  process, through Dagster Pipes; a crash or a kill (out of memory) fails the step with its exit
  status and the tail of its stderr.
- `in_process`: the same step code over the same Pipes protocol inside the run's process (debugging;
  fast tests of other things). No process boundary: a crash takes the run's process with it.
- `k8s`: a pod per step through `dagster_k8s.PipesK8sClient` (image, namespace, GPU request, the
  data volume), messages read from the pod's logs.

The launcher (`python`, `accelerate`, `torchrun`) wraps the step's command in every mode but `in_process`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from contextlib import contextmanager
from typing import Any, Iterator, Mapping, Optional

import dagster as dg
from pydantic import Field

from outcome_flywheel.settings import DEFAULTS, PROJECT_ROOT, RULES, SettingsError
from outcome_flywheel.steps import Step
from outcome_flywheel.steps.entry import ERROR_KEY, run_in_process
from outcome_flywheel.steps.launch import StepLaunch, exit_status, launch_root_cause, passthrough_env
from resources.settings import layered_config_schema

RUNNERS = ("subprocess", "in_process", "k8s")
GPU_RESOURCE = "nvidia.com/gpu"
DATA_VOLUME = "flywheel-data"
# Several processes in a pod talk through /dev/shm (NCCL's intra-node transport, gloo, torch's tensor
# sharing); a container's own is 64 MiB, which NCCL outgrows: mount a memory-backed one instead.
SHM_VOLUME = "dshm"
# variable -> (field, default: the settings module's, else empty); an empty variable counts as unset
VARIABLES = {
    name: (field, DEFAULTS.get(name, ""))
    for name, field in (
        ("FLYWHEEL_STEP_RUNNER", "runner"),
        ("FLYWHEEL_STEP_LAUNCHER", "launcher"),
        ("FLYWHEEL_STEP_PROCESSES", "processes"),
        ("FLYWHEEL_K8S_IMAGE", "k8s_image"),
        ("FLYWHEEL_K8S_NAMESPACE", "k8s_namespace"),
        ("FLYWHEEL_K8S_GPUS", "k8s_gpus"),
        ("FLYWHEEL_K8S_CPU", "k8s_cpu"),
        ("FLYWHEEL_K8S_MEMORY", "k8s_memory"),
        ("FLYWHEEL_K8S_DATA_PVC", "k8s_data_pvc"),
        ("FLYWHEEL_K8S_DATA_MOUNT", "k8s_data_mount"),
        ("FLYWHEEL_K8S_ENV_SECRET", "k8s_env_secret"),
    )
}
INTEGERS = ("FLYWHEEL_STEP_PROCESSES", "FLYWHEEL_K8S_GPUS")
# A step's stderr is its log (its tail is in a failure): no progress bars there, unless the run's environment asks.
STEP_ENV_DEFAULTS = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TOKENIZERS_PARALLELISM": "false"}


class StepRunnerResource(dg.ConfigurableResource):
    """Where heavy steps run (FLYWHEEL_STEP_RUNNER): a local subprocess (default), the run's own process, or a
    Kubernetes pod; and how they start (FLYWHEEL_STEP_LAUNCHER: python, accelerate, torchrun)."""

    runner: str = Field(
        default="subprocess",
        description="subprocess (default: this machine, its own process) | in_process "
        "(the run's process: debugging) | k8s (a pod through PipesK8sClient).",
    )
    launcher: str = Field(
        default="python", description="python (one process) | accelerate (`accelerate launch`) | torchrun."
    )
    processes: int = Field(
        default=1, description="Processes the launcher starts (accelerate, torchrun); rank 0 reports to Dagster."
    )
    k8s_image: str = Field(
        default="", description="k8s: the image holding the project and its environment (required for k8s)."
    )
    k8s_namespace: str = Field(
        default="", description="k8s: the namespace of the step pods; empty = the current one, else `default`."
    )
    k8s_gpus: int = Field(default=1, description=f"k8s: GPUs requested per pod (`{GPU_RESOURCE}` limit); 0 = none.")
    k8s_cpu: str = Field(default="", description="k8s: CPU request and limit of the pod (e.g. `8`); empty = none.")
    k8s_memory: str = Field(
        default="", description="k8s: memory request and limit of the pod (e.g. `32Gi`); empty = none."
    )
    k8s_data_pvc: str = Field(
        default="",
        description="k8s: a PersistentVolumeClaim with the data dir (models, checkpoints, "
        "adapters), mounted at k8s_data_mount; the pod's FLYWHEEL_DATA_DIR.",
    )
    k8s_data_mount: str = Field(default="/data", description="k8s: where the data volume is mounted in the pod.")
    k8s_env_secret: str = Field(
        default="",
        description="k8s: a Secret whose keys become the pod's environment (AWS_* credentials); "
        "when set, AWS_* variables are not copied into the pod spec.",
    )
    k8s_python: str = Field(default="python", description="k8s: the interpreter in the image that runs the step.")
    stderr_tail_lines: int = Field(default=40, description="Lines of a failed step's stderr shown in the failure.")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "StepRunnerResource":
        """From the FLYWHEEL_STEP_* / FLYWHEEL_K8S_* variables (a set one shows as an EnvVar); bad values
        stop the load with one error naming each variable."""
        environ = os.environ if environ is None else environ
        problems = check_environment(environ)
        if problems:
            raise SettingsError("step runner: " + "; ".join(problems))
        fields: dict[str, Any] = {}
        for name, (field, default) in VARIABLES.items():
            if environ.get(name, "") == "":
                fields[field] = int(default) if name in INTEGERS else default
            else:
                fields[field] = dg.EnvVar.int(name) if name in INTEGERS else dg.EnvVar(name)
        return cls(**fields)

    @property
    def _config_schema(self):  # the environment first, then run config on top, field by field
        return layered_config_schema(super()._config_schema)

    # -- what runs -----------------------------------------------------------------------------

    def launch(self, python: str | None = None) -> StepLaunch:
        return StepLaunch(launcher=self.launcher, processes=self.processes, python=python or sys.executable)

    def command(self, step: Step) -> list[str]:
        """The step's argv where it runs: this interpreter locally, `k8s_python` in a pod."""
        return self.launch(self.k8s_python if self.runner == "k8s" else None).command(step)

    def run_step(
        self, context: dg.AssetExecutionContext, step: Step, extras: Mapping[str, Any]
    ) -> dg.PipesClientCompletedInvocation:
        """Run `step` (the `Step` its module declares) with `extras`, wherever this resource says; its reports
        are the invocation's results. Raises `dg.Failure` with the step's error (and its stderr tail) when it fails."""
        problems = check_fields(self)
        if problems:
            raise dg.Failure(description="step runner: " + "; ".join(problems))
        context.log.info(f"step {step.name}: runner {self.runner}, launcher {self.launcher} x{self.processes}")
        note = self.one_process_note(step)
        if note and self.runner != "in_process":
            context.log.info(f"step {step.name}: {note}")
        if self.runner == "in_process":
            return _run_in_process(context, step, extras)
        if self.runner == "k8s":
            from dagster_k8s import PipesK8sClient

            return PipesK8sClient().run(context=context, extras=k8s_extras(extras, self), **self.k8s_arguments(step))
        client = StepSubprocessClient(step=step.name, tail_lines=self.stderr_tail_lines, launch_note=note)
        return client.run(context=context, extras=dict(extras), command=self.command(step), cwd=str(PROJECT_ROOT))

    def one_process_note(self, step: Step) -> str | None:
        """What a person reads when `step` cannot use the processes asked for and runs as one (launched
        plainly); None when it runs as asked."""
        if self.launch().for_step(step).processes == self.processes:
            return None
        return (
            f"runs as one process, launched plainly (python): it cannot use several (its whole body would run "
            f"in each); launcher {self.launcher} x{self.processes} is for the training steps and the probe"
        )

    # -- Kubernetes ----------------------------------------------------------------------------

    def k8s_arguments(self, step: Step, environ: Mapping[str, str] | None = None) -> dict:
        """What `PipesK8sClient.run` is given besides the context and extras: image, command, namespace,
        env (the FLYWHEEL_*/AWS_*/HF_* variables; the data dir moved to the mount) and the pod spec."""
        env = {**STEP_ENV_DEFAULTS, **passthrough_env(os.environ if environ is None else environ)}
        if self.k8s_env_secret:
            env = {k: v for k, v in env.items() if not k.startswith("AWS_")}  # from the Secret instead
        env.pop("FLYWHEEL_STEP_RUNNER", None)  # the pod runs the step; it launches nothing
        if self.k8s_data_pvc:
            env["FLYWHEEL_DATA_DIR"] = self.k8s_data_mount
        container: dict[str, Any] = {"name": "step"}
        limits = {GPU_RESOURCE: str(self.k8s_gpus)} if self.k8s_gpus else {}
        requests = {}
        for key, value in (("cpu", self.k8s_cpu), ("memory", self.k8s_memory)):
            if value:
                requests[key] = limits[key] = value
        if limits or requests:
            container["resources"] = {k: v for k, v in (("limits", limits), ("requests", requests)) if v}
        if self.k8s_env_secret:
            container["env_from"] = [{"secret_ref": {"name": self.k8s_env_secret}}]
        spec: dict[str, Any] = {"containers": [container]}
        if self.k8s_data_pvc:
            container["volume_mounts"] = [{"name": DATA_VOLUME, "mount_path": self.k8s_data_mount}]
            spec["volumes"] = [{"name": DATA_VOLUME, "persistent_volume_claim": {"claim_name": self.k8s_data_pvc}}]
        if self.processes > 1 and self.launcher != "python":
            container.setdefault("volume_mounts", []).append({"name": SHM_VOLUME, "mount_path": "/dev/shm"})
            spec.setdefault("volumes", []).append({"name": SHM_VOLUME, "empty_dir": {"medium": "Memory"}})
        if self.k8s_gpus:  # GPU nodes are commonly tainted so that only GPU pods land there
            spec["tolerations"] = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
        return {
            "image": self.k8s_image,
            "command": self.command(step),
            "namespace": self.k8s_namespace or None,
            "env": env,
            "base_pod_meta": {"labels": {"app.kubernetes.io/part-of": "outcome-flywheel", "flywheel/step": step.name}},
            "base_pod_spec": spec,
        }

    def k8s_pod(
        self,
        context: dg.AssetExecutionContext,
        step: str,
        extras: Mapping[str, Any],
        environ: Mapping[str, str] | None = None,
    ):
        """The pod (`kubernetes.client.V1Pod`) `run_step` would create for `step`, built the way
        `PipesK8sClient.run` builds it (Pipes bootstrap env included), without a cluster."""
        from dagster_k8s.pipes import PipesK8sPodLogsMessageReader, build_pod_body, get_pod_name

        args = self.k8s_arguments(step, environ)
        with dg.open_pipes_session(
            context=context,
            extras=k8s_extras(extras, self),
            context_injector=dg.PipesEnvContextInjector(),
            message_reader=PipesK8sPodLogsMessageReader(),
        ) as session:
            return build_pod_body(
                pod_name=get_pod_name(context.run_id, context.op.name),
                image=args["image"],
                command=args["command"],
                env_vars={**session.get_bootstrap_env_vars(), **args["env"]},
                base_pod_meta=args["base_pod_meta"],
                base_pod_spec=args["base_pod_spec"],
            )


def k8s_extras(extras: Mapping[str, Any], runner: StepRunnerResource) -> dict:
    """The extras as the pod sees them: paths inside this checkout made relative (the image holds the
    project elsewhere), each `data_dir` moved to the data volume's mount when there is one."""
    root = str(PROJECT_ROOT) + os.sep

    def move(value, key=""):
        if isinstance(value, dict):
            return {k: move(v, k) for k, v in value.items()}
        if key == "data_dir" and runner.k8s_data_pvc:
            return runner.k8s_data_mount
        if isinstance(value, str) and value.startswith(root):
            return value[len(root) :]
        return value

    return move(dict(extras))


def check_environment(environ: Mapping[str, str], run_time: bool = False) -> list[str]:
    """Problems with the step runner's variables, one per bad variable (each by its rule in
    outcome_flywheel.settings), then the ones that must agree. `run_time`: also the launcher and
    process count (at load each variable alone must load, so that pair is checked when a step starts)."""
    values = {name: str(environ.get(name, "")) for name in VARIABLES}
    problems = []
    for name, value in values.items():
        problem = RULES[name].problem(value) if value and name in RULES else None
        if problem:
            problems.append(f"{name}={value!r}: {problem}; allowed: {RULES[name].allowed}")
    if problems:
        return problems
    if values["FLYWHEEL_STEP_RUNNER"] == "k8s" and not values["FLYWHEEL_K8S_IMAGE"]:
        problems.append("FLYWHEEL_K8S_IMAGE is unset: the k8s step runner needs the image that holds the project")
    if (
        run_time
        and values["FLYWHEEL_STEP_LAUNCHER"] in ("", "python")
        and values["FLYWHEEL_STEP_PROCESSES"] not in ("", "1")
    ):
        problems.append(
            f"FLYWHEEL_STEP_PROCESSES={values['FLYWHEEL_STEP_PROCESSES']}: the python launcher starts one process; "
            "set FLYWHEEL_STEP_LAUNCHER=accelerate or torchrun"
        )
    if (
        run_time
        and values["FLYWHEEL_STEP_RUNNER"] == "k8s"
        and values["FLYWHEEL_K8S_GPUS"] not in ("", "0")
        and values["FLYWHEEL_STEP_PROCESSES"] not in ("", "1")
        and values["FLYWHEEL_K8S_GPUS"] != values["FLYWHEEL_STEP_PROCESSES"]
    ):
        problems.append(
            f"FLYWHEEL_STEP_PROCESSES={values['FLYWHEEL_STEP_PROCESSES']} with FLYWHEEL_K8S_GPUS="
            f"{values['FLYWHEEL_K8S_GPUS']}: a pod's ranks take one GPU each (its LOCAL_RANK's card); "
            "request as many GPUs as processes"
        )
    return problems


def check_fields(runner: StepRunnerResource) -> list[str]:
    """The same rules on the resolved fields (run config may set them), when a step starts."""
    return check_environment(
        {name: str(getattr(runner, field)) for name, (field, _) in VARIABLES.items()}, run_time=True
    )


class WholeLineFileMessageReader(dg.PipesFileMessageReader):
    """Dagster's file message reader, handling a message only once its line is whole. Dagster's
    tails the file with `readline`, which returns what is there at its end, so a message read
    while the step is still writing it failed a step that had succeeded (JSONDecodeError:
    Unterminated string; seen on day 41 of a 44-day world run, the step's checks then lost)."""

    def _reader_thread(self, handler, is_resource_complete) -> None:
        pending = ""
        try:
            with open(self._path, encoding="utf-8") as stream:
                while True:
                    chunk = stream.readline()
                    if chunk:
                        pending += chunk
                        if pending.endswith("\n"):  # a whole line: one message
                            message, pending = pending, ""
                            handler.handle_message(json.loads(message))
                    elif is_resource_complete.is_set():
                        break  # the step has ended: nothing more comes
                    else:
                        time.sleep(0.01)
            if pending.strip():  # a last line the step ended without a newline
                handler.handle_message(json.loads(pending))
        except Exception:
            handler.report_pipes_framework_exception(f"{self.__class__.__name__} reader thread", sys.exc_info())
            raise


class WholeLineTempFileMessageReader(dg.PipesTempFileMessageReader):
    """`PipesTempFileMessageReader` over `WholeLineFileMessageReader`."""

    @contextmanager
    def read_messages(self, handler) -> Iterator[dict]:
        with tempfile.TemporaryDirectory() as folder:
            reader = WholeLineFileMessageReader(
                os.path.join(folder, "messages"), include_stdio_in_messages=self._include_stdio_in_messages
            )
            with reader.read_messages(handler) as params:
                yield params


class StepSubprocessClient(dg.PipesClient):
    """`PipesSubprocessClient` with the failure a person needs: the step's error, its exit status
    (a kill named as such) and the tail of its stderr, which is also forwarded as it is written."""

    def __init__(self, step: str, tail_lines: int = 40, launch_note: str | None = None):
        self.step, self.tail_lines, self.launch_note = step, tail_lines, launch_note

    def run(
        self,
        *,
        context,
        extras=None,
        command: list[str],
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
    ) -> dg.PipesClientCompletedInvocation:
        tail: deque[str] = deque(maxlen=self.tail_lines)
        # a launcher's summary of a failed launch (launch_root_cause) can outgrow the tail shown
        summary: deque[str] = deque(maxlen=max(self.tail_lines, SUMMARY_LINES))
        with dg.open_pipes_session(
            context=context,
            extras=extras,
            context_injector=dg.PipesTempFileContextInjector(),
            message_reader=WholeLineTempFileMessageReader(),
        ) as session:
            # The whole environment: the step sees the same FLYWHEEL_* settings (the warehouse URL),
            # AWS_* credentials and model caches as the run.
            step_env = {**STEP_ENV_DEFAULTS, **os.environ, **(env or {}), **session.get_bootstrap_env_vars()}
            process = subprocess.Popen(
                command, cwd=cwd, env=step_env, stderr=subprocess.PIPE, text=True, errors="replace"
            )
            try:
                for line in process.stderr:
                    sys.stderr.write(line)
                    tail.append(line)
                    summary.append(line)
                process.wait()
            except BaseException:  # the run was interrupted or cancelled: stop the step too
                process.send_signal(signal.SIGINT)
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    process.kill()
                raise
        if process.returncode != 0:
            messages = session.get_custom_messages()
            raise step_failure(self.step, exit_status(process.returncode), messages, "".join(tail), "".join(summary))
        metadata: dict[str, Any] = {"step_pid": process.pid}
        if self.launch_note:
            metadata["step_launch"] = self.launch_note
        return dg.PipesClientCompletedInvocation(session, metadata=metadata)


def _run_in_process(context, step: Step, extras: Mapping[str, Any]) -> dg.PipesClientCompletedInvocation:
    error = None
    with dg.open_pipes_session(
        context=context,
        extras=dict(extras),
        context_injector=dg.PipesTempFileContextInjector(),
        message_reader=WholeLineTempFileMessageReader(),
    ) as session:
        try:
            run_in_process(step, session.get_bootstrap_env_vars())
        except Exception as err:  # reported like a subprocess's failure, the traceback kept as the cause
            error = err
    if error is not None:
        raise step_failure(step.name, "failed in the run's process", session.get_custom_messages(), "") from error
    return dg.PipesClientCompletedInvocation(session)


SUMMARY_LINES = 400  # of a step's stderr, read for a launcher's summary (exit_status, launch_root_cause: launch.py)


def step_failure(step: str, how: str, messages, stderr_tail: str, launcher_output: str = "") -> dg.Failure:
    """The step's failure: how it ended and why. Under a launcher of several processes the first rank
    lost leads, with the exception it recorded (rank 0's own error then is most often the broken
    collective that followed: "Connection reset by peer")."""
    errors = [m[ERROR_KEY] for m in messages if isinstance(m, dict) and ERROR_KEY in m]
    cause = launch_root_cause(launcher_output or stderr_tail)
    description = f"step {step} {how}" + (f": {cause}" if cause else "")
    if errors:
        description += f"{'; rank 0 reported' if cause else ''}: {errors[-1]}"
    if stderr_tail:
        description += f"\n\nlast lines of its stderr:\n{stderr_tail}"
    metadata = {"step": step, "how": how}
    if stderr_tail:
        metadata["stderr_tail"] = dg.MetadataValue.text(stderr_tail)
    return dg.Failure(description=description, metadata=metadata)
