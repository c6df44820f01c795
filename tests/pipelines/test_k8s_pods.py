"""The k8s step runner's pods against the Kubernetes API's own schemas, offline.

No API server installs here from a registry (kind and k3s pull node images and binaries from GitHub and
dl.k8s.io; PyPI, Debian and npm carry no kube-apiserver), so the pods `PipesK8sClient` would submit are
checked against the OpenAPI schemas the API server validates with (kubernetes-validate: the published
schemas of each release, strict: an unknown field is an error, as `kubectl apply --validate=strict`).
The validator is shown to refuse a misspelt field and a wrong type, so a pass means something.
"""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest
from kubernetes.client import ApiClient

from resources.steps import GPU_RESOURCE, SHM_VOLUME, StepRunnerResource, check_fields
from tests.pipelines.test_pipes_steps import pod_model

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
    k8s_env_secret="flywheel-s3",
    launcher="torchrun",
    processes=2,
)
EXTRAS = {"warehouse": {"data_dir": "/home/me/data", "warehouse_url": "s3://lake/flywheel"}}
ENVIRON = {"FLYWHEEL_WAREHOUSE_URL": "s3://lake/flywheel", "FLYWHEEL_SEED": "3"}


def manifest(runner: StepRunnerResource) -> dict:
    """The pod as the API receives it (camelCase JSON; create_namespaced_pod's path says v1 Pod)."""
    pod = pod_model(runner, EXTRAS, ENVIRON)
    return {"apiVersion": "v1", "kind": "Pod", **ApiClient().sanitize_for_serialization(pod)}


@pytest.mark.parametrize(
    "settings",
    [
        GPU_RUNNER,
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
