"""The k8s step runner's pods: what `PipesK8sClient` would submit, built without a cluster, and checked
against the Kubernetes API's own schemas, offline.

`StepRunnerResource.k8s_pod` opens the same Pipes session as `PipesK8sClient.run` (the env context
injector, the pod-logs reader) and calls `dagster_k8s.pipes.build_pod_body` as it does. No API server
installs here from a registry (kind and k3s pull node images and binaries from GitHub and dl.k8s.io;
PyPI, Debian and npm carry no kube-apiserver), so the pods are checked against the OpenAPI schemas the
API server validates with (kubernetes-validate: the published schemas of each release, strict: an
unknown field is an error, as `kubectl apply --validate=strict`). The validator is shown to refuse a
misspelt field and a wrong type, so a pass means something.
"""

import copy

import dagster as dg
import kubernetes_validate
import pytest
from dagster_pipes import (
    DAGSTER_PIPES_CONTEXT_ENV_VAR,
    DAGSTER_PIPES_MESSAGES_ENV_VAR,
    PipesDefaultContextLoader,
    decode_param,
)
from kubernetes.client import ApiClient

from outcome_flywheel.daily_rl.day_step import STEP as DAILY_UPDATE
from outcome_flywheel.steps.launch import StepLaunch
from resources.steps import GPU_RESOURCE, SHM_VOLUME, StepRunnerResource, check_fields
from tests import PROJECT_ROOT

# The oldest Kubernetes release the spec is checked on (upstream-supported in 2026), and the newest the
# schemas carry.
RELEASES = ("1.30.0", kubernetes_validate.latest_version())

GPU_RUNNER = dict(
    runner="k8s",
    k8s_image="registry.example/flywheel:1.0",
    k8s_namespace="ml",
    k8s_gpus=2,
    k8s_cpu="8",
    k8s_memory="32Gi",
    k8s_data_pvc="flywheel-data",
    launcher="torchrun",
    processes=2,
)
EXTRAS = {"warehouse": {"data_dir": "/home/me/data", "warehouse_url": "s3://lake/flywheel"}}
ENVIRON = {"FLYWHEEL_WAREHOUSE_URL": "s3://lake/flywheel", "FLYWHEEL_SEED": "3"}


def _pod(runner: StepRunnerResource, extras: dict, environ: dict) -> dict:
    return pod_model(runner, extras, environ).to_dict()


def pod_model(runner: StepRunnerResource, extras: dict, environ: dict):
    """The `V1Pod` the runner would submit for a daily_update step of partition 2025-11-04."""
    pods = []

    @dg.asset(partitions_def=dg.StaticPartitionsDefinition(["2025-11-04"]))
    def gpu_step(context: dg.AssetExecutionContext):
        pods.append(runner.k8s_pod(context, DAILY_UPDATE, extras, environ))
        return dg.MaterializeResult()

    assert dg.materialize([gpu_step], partition_key="2025-11-04").success
    return pods[0]


def test_the_k8s_pod_carries_image_command_gpu_env_and_the_data_volume():
    runner = StepRunnerResource(**GPU_RUNNER)
    environ = {
        "FLYWHEEL_WAREHOUSE_URL": "s3://lake/flywheel",
        "FLYWHEEL_DATA_DIR": "/home/me/data",
        "AWS_ACCESS_KEY_ID": "k",
        "FLYWHEEL_STEP_RUNNER": "k8s",
        "HOME": "/home/me",
        "PATH": "/usr/bin",
    }
    extras = {
        "warehouse": {"data_dir": "/home/me/data", "warehouse_url": "s3://lake/flywheel"},
        "market_data": {
            "prices_file": str(PROJECT_ROOT / "sample_data" / "prices" / "daily_close.csv"),
            "data_dir": "/home/me/data",
        },
    }
    args = runner.k8s_arguments(DAILY_UPDATE, environ)
    assert args["image"] == "registry.example/flywheel:1.0" and args["namespace"] == "ml"
    pod = _pod(runner, extras, environ)
    (container,) = pod["spec"]["containers"]
    assert container["image"] == "registry.example/flywheel:1.0"
    # the launcher's command line (tests/pipelines/test_pipes_steps.py spells it out) with the image's python
    assert container["command"] == StepLaunch(launcher="torchrun", processes=2, python="python").command(DAILY_UPDATE)
    assert container["command"][:3] == ["python", "-m", "torch.distributed.run"]
    assert container["resources"]["limits"] == {GPU_RESOURCE: "2", "cpu": "8", "memory": "32Gi"}
    assert container["resources"]["requests"] == {"cpu": "8", "memory": "32Gi"}
    assert pod["spec"]["restart_policy"] == "Never"
    assert {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"} in [
        {k: v for k, v in t.items() if v is not None} for t in pod["spec"]["tolerations"]
    ]
    assert container["volume_mounts"][0]["mount_path"] == "/data"
    assert pod["spec"]["volumes"][0]["persistent_volume_claim"]["claim_name"] == "flywheel-data"
    assert pod["metadata"]["labels"]["flywheel/step"] == "daily_update"
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["FLYWHEEL_WAREHOUSE_URL"] == "s3://lake/flywheel" and env["AWS_ACCESS_KEY_ID"] == "k"
    assert (
        env["FLYWHEEL_DATA_DIR"] == "/data"
        and "FLYWHEEL_STEP_RUNNER" not in env
        and "HOME" not in env
        and "PATH" not in env
    )
    # the Pipes bootstrap: the context (with the extras) in the env, messages on the pod's stderr (read from its logs)
    assert decode_param(env[DAGSTER_PIPES_MESSAGES_ENV_VAR]) == {"stdio": "stderr"}
    context = decode_param(env[DAGSTER_PIPES_CONTEXT_ENV_VAR])[PipesDefaultContextLoader.DIRECT_KEY]
    assert context["partition_key"] == "2025-11-04"
    assert context["extras"]["warehouse"] == {"data_dir": "/data", "warehouse_url": "s3://lake/flywheel"}
    assert (
        context["extras"]["market_data"]["prices_file"] == "sample_data/prices/daily_close.csv"
    )  # the image's own copy


def test_k8s_credentials_from_a_secret_and_no_gpu():
    runner = StepRunnerResource(runner="k8s", k8s_image="img", k8s_gpus=0, k8s_env_secret="flywheel-s3")
    pod = _pod(runner, {}, {"AWS_SECRET_ACCESS_KEY": "s", "FLYWHEEL_SEED": "3"})
    (container,) = pod["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert "AWS_SECRET_ACCESS_KEY" not in env and env["FLYWHEEL_SEED"] == "3"
    assert container["env_from"][0]["secret_ref"]["name"] == "flywheel-s3"
    assert container.get("resources") is None and not pod["spec"].get("tolerations") and not pod["spec"].get("volumes")
    assert container["command"] == ["python", "-m", "outcome_flywheel.daily_rl.day_step"]


def manifest(runner: StepRunnerResource) -> dict:
    """The pod as the API receives it (camelCase JSON; create_namespaced_pod's path says v1 Pod)."""
    pod = pod_model(runner, EXTRAS, ENVIRON)
    return {"apiVersion": "v1", "kind": "Pod", **ApiClient().sanitize_for_serialization(pod)}


@pytest.mark.parametrize(
    "settings",
    [
        {**GPU_RUNNER, "k8s_env_secret": "flywheel-s3"},
        dict(runner="k8s", k8s_image="img", k8s_gpus=0),
        dict(runner="k8s", k8s_image="img", k8s_gpus=1, launcher="accelerate", processes=1),
        dict(runner="k8s", k8s_image="img", k8s_gpus=0, launcher="torchrun", processes=4, k8s_cpu="16"),
    ],
    ids=["torchrun-2-gpus-pvc-secret", "cpu", "accelerate-1-gpu", "torchrun-4-cpu"],
)
@pytest.mark.parametrize("release", RELEASES)
def test_the_step_pods_are_valid_kubernetes_pods(settings, release):
    pod = manifest(StepRunnerResource(**settings))
    kubernetes_validate.validate(pod, release, strict=True)
    # what was validated is the pod with everything the runner set
    (container,) = pod["spec"]["containers"]
    assert container["image"] == settings["k8s_image"] and pod["spec"]["restartPolicy"] == "Never"


def test_the_validator_refuses_a_misspelt_field_and_a_wrong_type():
    pod = manifest(StepRunnerResource(**GPU_RUNNER))
    misspelt = copy.deepcopy(pod)
    misspelt["spec"]["containers"][0]["volumeMount"] = misspelt["spec"]["containers"][0].pop("volumeMounts")
    wrong_type = copy.deepcopy(pod)
    wrong_type["spec"]["volumes"][-1]["emptyDir"]["medium"] = 5
    for bad, reason in ((misspelt, "'volumeMount' was unexpected"), (wrong_type, "is not of type")):
        with pytest.raises(kubernetes_validate.ValidationError, match=reason):
            kubernetes_validate.validate(bad, RELEASES[-1], strict=True)


def test_several_processes_get_a_memory_backed_dev_shm():
    """NCCL and gloo talk through /dev/shm between a pod's ranks; the container's own is 64 MiB."""
    pod = manifest(StepRunnerResource(**GPU_RUNNER))
    (container,) = pod["spec"]["containers"]
    assert {"mountPath": "/dev/shm", "name": SHM_VOLUME} in container["volumeMounts"]
    assert {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}} in pod["spec"]["volumes"]
    assert container["resources"]["limits"][GPU_RESOURCE] == "2"
    one = manifest(StepRunnerResource(runner="k8s", k8s_image="img"))
    assert "volumes" not in one["spec"] and "volumeMounts" not in one["spec"]["containers"][0]


def test_a_pod_requests_one_gpu_per_process():
    assert check_fields(StepRunnerResource(**GPU_RUNNER)) == []
    (problem,) = check_fields(StepRunnerResource(**{**GPU_RUNNER, "k8s_gpus": 1}))
    assert "FLYWHEEL_STEP_PROCESSES=2 with FLYWHEEL_K8S_GPUS=1" in problem and "one GPU each" in problem
    assert check_fields(StepRunnerResource(**{**GPU_RUNNER, "k8s_gpus": 0})) == []  # CPU ranks (gloo)
    assert check_fields(StepRunnerResource(**{**GPU_RUNNER, "runner": "subprocess", "k8s_gpus": 1})) == []
