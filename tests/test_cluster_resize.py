"""A worker pod's host memory request follows its models in place (the pod resize subresource), never by rolling
the pod: the pure patches for each case, then the official kubernetes client against the API server double,
with and without in-place resize served."""
from __future__ import annotations

import pytest
import yaml

from contract.quantity import parse_bytes
from contract.wire import HOST_MEMORY_ANNOTATION, WORKER_LABEL
from controller.kube.cluster import Cluster
from controller.kube.resize import UNSUPPORTED, WorkerResizer, pod_resizes
from tests.cluster_loop_support import World, model_doc
from tests.gitserver import git_server  # noqa: F401  (fixture)
from tests.kubedouble import kube  # noqa: F401  (fixture)

NS, WORKER = "gpushare-system", "worker-gpu-node-1-gpu0-default"


def _pod(name: str = "w-1", memory: str | None = "4096Mi", *, worker: str = WORKER, deleting: bool = False,
         sidecar: bool = False) -> dict:
    resources = {"requests": {"cpu": "2", **({"memory": memory} if memory else {})}}
    containers = [{"name": "worker", "image": "worker:1", "resources": resources}]
    if sidecar:
        containers.insert(0, {"name": "proxy", "image": "proxy:1"})
    meta = {"name": name, "namespace": NS, "labels": {"app.kubernetes.io/name": "gpushare-worker", WORKER_LABEL: worker}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": containers}}


@pytest.mark.parametrize("case,pod,wanted,patched", [
    ("below-the-need-is-raised", _pod(), "8192Mi", "8192Mi"),
    ("above-the-need-is-lowered", _pod(memory="9Gi"), "8192Mi", "8192Mi"),
    ("same-bytes-other-unit-is-left-alone", _pod(memory="8Gi"), "8192Mi", None),
    ("no-request-yet-gets-one", _pod(memory=None), "4096Mi", "4096Mi"),
    ("a-pod-being-deleted-is-left-alone", _pod(deleting=True), "8192Mi", None),
    ("a-worker-without-the-annotation-is-left-alone", _pod(worker="other"), "8192Mi", None),
    ("the-worker-container-is-found-beside-another", _pod(sidecar=True), "8192Mi", "8192Mi"),
])
def test_the_patch_brings_the_worker_container_to_the_need(case, pod, wanted, patched):
    changes = pod_resizes([pod], {(NS, WORKER): wanted})
    if patched is None:
        assert changes == [], case
        return
    [change] = changes
    index = [c["name"] for c in pod["spec"]["containers"]].index("worker")
    assert change.patch[0] == {"op": "test", "path": f"/spec/containers/{index}/name", "value": "worker"}, case
    assert change.patch[-1] == {"op": "add", "path": f"/spec/containers/{index}/resources/requests/memory",
                                "value": patched}, case


def _seed(kube, memory: str, need: str):  # noqa: F811
    kube.seed("deployments", {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {
        "name": WORKER, "namespace": NS, "labels": {"app.kubernetes.io/name": "gpushare-worker"},
        "annotations": {HOST_MEMORY_ANNOTATION: need}}, "spec": {
            "selector": {"matchLabels": {WORKER_LABEL: WORKER}},
            "template": {"metadata": {"labels": {WORKER_LABEL: WORKER}}, "spec": {"containers": []}}}})
    kube.seed("pods", _pod(memory=memory))


def test_the_running_pod_is_resized_in_place_once(kube):  # noqa: F811
    _seed(kube, "4096Mi", "278091Mi")
    resizer = WorkerResizer(Cluster(kube.api_client))
    before = kube.versions("v1", "pods", NS, "w-1")
    assert resizer.resize() == []
    pod = kube.get("v1", "pods", NS, "w-1")
    assert pod["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "2", "memory": "278091Mi"}
    assert pod["spec"]["containers"][0]["image"] == "worker:1" and pod["metadata"]["uid"]
    assert kube.versions("v1", "pods", NS, "w-1") == before + 1
    assert resizer.resize() == []  # at the need: nothing to patch
    assert kube.versions("v1", "pods", NS, "w-1") == before + 1


def test_without_in_place_resize_the_pod_keeps_its_request_and_the_warning_is_said_once(kube):  # noqa: F811
    kube.mock.serves_pod_resize = False
    _seed(kube, "4096Mi", "278091Mi")
    resizer = WorkerResizer(Cluster(kube.api_client))
    [(reason, message)] = resizer.resize()
    assert reason == UNSUPPORTED and "workerBaseMemoryBytes" in message and "278091Mi" in message
    assert resizer.resize() == []
    pod = kube.get("v1", "pods", NS, "w-1")
    assert pod["spec"]["containers"][0]["resources"]["requests"]["memory"] == "4096Mi"


def test_an_api_error_is_a_warning_never_a_failed_pass(kube):  # noqa: F811
    _seed(kube, "4096Mi", "8Gi")
    kube.fail(500, 1, "list")
    [(reason, _)] = WorkerResizer(Cluster(kube.api_client)).resize()
    assert reason == "ApiUnavailable"


@pytest.mark.integration
def test_a_cluster_pass_resizes_the_running_worker_pod_to_what_its_models_pin(kube, git_server, tmp_path):  # noqa: F811
    """End to end: the pass renders an elastic model (its streamed layers pinned in host RAM), Argo CD applies the
    Deployment, its pod runs with the template's fixed request, and the next pass resizes that pod in place."""
    world = World(kube, git_server, tmp_path)
    world.setup([model_doc(budget="1Gi")])
    controller = world.reconciler()
    assert controller.reconcile_once().ok  # the profiler Job
    world.publish_profile()
    assert controller.reconcile_once().ok  # the worker
    [deployment] = world.rendered("Deployment")
    assert yaml.safe_load(world.files()["decisions/llm/chat.yaml"])["status"]["assigned"]["mode"] == "elastic"
    need = deployment["metadata"]["annotations"][HOST_MEMORY_ANNOTATION]
    template = deployment["spec"]["template"]
    base = template["spec"]["containers"][0]["resources"]["requests"]["memory"]
    assert parse_bytes(need) > parse_bytes(base)
    world.worker_rolls_out()
    namespace = deployment["metadata"]["namespace"]
    kube.seed("pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "worker-pod-1", "namespace": namespace, "labels": template["metadata"]["labels"]},
        "spec": template["spec"]})
    report = controller.reconcile_once()
    assert report.ok and not report.warnings, report.warnings
    pod = kube.get("v1", "pods", namespace, "worker-pod-1")
    assert pod["spec"]["containers"][0]["resources"]["requests"]["memory"] == need
    assert pod["spec"]["containers"][0]["image"] == template["spec"]["containers"][0]["image"]
