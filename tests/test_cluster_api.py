"""controller.kube.cluster over HTTP: the official client against the API server double (tests/kubedouble.py)."""
from __future__ import annotations

import kmock
import pytest
from kubernetes import client

from controller.kube.cluster import Cluster
from controller.observe.facts import ClusterError, gpu_slots
from tests.kubedouble import kube  # noqa: F401  (the fixture)
from contract.verdicts import Verdict, render_document

pytestmark = pytest.mark.integration

EM = "gpushare.dev/v1alpha1"
LABELS = {"app": "x"}
TEMPLATE = {"metadata": {"labels": LABELS}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
ELASTICMODELS = kmock.resource("gpushare.dev", "v1alpha1", "elasticmodels")


def _cluster(kube, **kwargs) -> Cluster:
    kwargs.setdefault("sleep", lambda s: None)
    return Cluster(kube.api_client, **kwargs)


def _model(kube, name="chat", namespace="llm") -> dict:
    return kube.seed("elasticmodels", {"apiVersion": EM, "kind": "ElasticModel",
                                       "metadata": {"name": name, "namespace": namespace},
                                       "spec": {"model": "org/chat", "memoryBudget": "4Gi"}})


def test_gpu_nodes_become_slots(kube):
    kube.seed("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cpu-1"}})
    kube.seed("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-1", "labels": {
        "nvidia.com/gpu.product": "NVIDIA-L4", "nvidia.com/gpu.memory": "23034", "nvidia.com/gpu.count": "2"}}})
    nodes = _cluster(kube).nodes()
    assert [n["metadata"]["name"] for n in nodes] == ["gpu-1"]  # the label selector left the CPU node out
    slots, errors = gpu_slots(nodes)
    assert [(s.id, s.product, s.memory_bytes) for s in slots] == [
        ("gpu-1/gpu0", "NVIDIA-L4", 23034 << 20), ("gpu-1/gpu1", "NVIDIA-L4", 23034 << 20)]
    assert errors == []


def test_profile_configmaps_are_listed_across_namespaces(kube):
    for namespace, name, labels, data in [
        ("llm", "profile-a", {"gpushare.dev/profile": "true"}, {"profile.yaml": "a: 1\n"}),
        ("team-b", "profile-b", {"gpushare.dev/profile": "true"}, {"profile.yaml": "b: 2\n"}),
        ("llm", "unrelated", {}, {"profile.yaml": "not a profile"}),
        ("llm", "broken", {"gpushare.dev/profile": "true"}, {"wrong-key": "x"}),
    ]:
        kube.seed("configmaps", {"apiVersion": "v1", "kind": "ConfigMap",
                                 "metadata": {"name": name, "namespace": namespace, "labels": labels}, "data": data})
    documents, errors = _cluster(kube).profile_documents()
    assert [(d.ref, d.text) for d in documents] == [("ConfigMap/llm/profile-a", "a: 1\n"),
                                                   ("ConfigMap/team-b/profile-b", "b: 2\n")]
    assert [e.reason for e in errors] == ["InvalidProfileConfigMap"]


def test_worker_verdicts_are_read_only_from_the_configmaps_named(kube):
    def seed(namespace: str, name: str, mode: str) -> None:
        document = render_document("gpu-1/gpu0", [Verdict("chat", "llm", mode, "applied", "Fits", "ok", 1, 2, 0)])
        kube.seed("configmaps", {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
            "name": name, "namespace": namespace, "labels": {"gpushare.dev/verdicts": "true"}},
            "data": {"verdicts.yaml": document}})

    seed("gpushare", "verdicts-gpu-1-gpu0", "elastic")
    seed("llm", "verdicts-gpu-1-gpu0", "resident")  # same name, another namespace: forged
    seed("gpushare", "verdicts-other", "swap")  # the worker namespace, but no worker the pass rendered
    verdicts, errors = _cluster(kube).verdicts([("gpushare", "verdicts-gpu-1-gpu0"), ("gpushare", "gone")])
    assert list(verdicts) == [("llm", "chat", "gpu-1/gpu0")]
    found = verdicts[("llm", "chat", "gpu-1/gpu0")]
    assert (found.mode, found.verdict, found.slot) == ("elastic", "applied", "gpu-1/gpu0")
    assert errors == []


def test_application_deployment_and_job_are_read_or_none(kube):
    cluster = _cluster(kube)
    assert cluster.application("argocd", "gpushare-rendered") is None
    assert cluster.workload("llm", "worker") is None
    assert cluster.profiler_job("llm", "profile-chat") is None
    kube.seed("applications", {"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
                               "metadata": {"name": "gpushare-rendered", "namespace": "argocd"},
                               "status": {"sync": {"status": "Synced", "revision": "abc"}}})
    kube.seed("deployments", {"apiVersion": "apps/v1", "kind": "Deployment",
                              "metadata": {"name": "worker", "namespace": "llm"},
                              "spec": {"replicas": 1, "selector": {"matchLabels": LABELS}, "template": TEMPLATE},
                              "status": {"observedGeneration": 1, "updatedReplicas": 1, "availableReplicas": 1,
                                         "conditions": [{"type": "Available", "status": "True"}]}})
    kube.seed("jobs", {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "profile-chat", "namespace": "llm"},
                       "spec": {"template": TEMPLATE},
                       "status": {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}})
    kube.seed("pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "profile-chat-x1", "namespace": "llm", "labels": {"job-name": "profile-chat"}},
        "spec": TEMPLATE["spec"],
        "status": {"containerStatuses": [{"name": "profiler", "image": "busybox", "imageID": "", "ready": False,
                                          "restartCount": 0, "state": {"terminated": {
            "exitCode": 1, "message": "gated model: accept its licence on the hub"}}}]}})
    assert cluster.application("argocd", "gpushare-rendered")["status"]["sync"]["revision"] == "abc"
    assert cluster.workload("llm", "worker").available is True
    failed = cluster.profiler_job("llm", "profile-chat")
    assert (failed.phase, failed.message) == ("Failed", "gated model: accept its licence on the hub")


def test_status_merge_patch_reaches_only_the_status(kube):
    stored = _model(kube)
    body = {"status": {"observedGeneration": 1, "conditions": [{"type": "Ready", "status": "False"}],
                       "assigned": {"mode": "swap"}}, "spec": {"model": "hijacked"}}
    _cluster(kube).patch_status("llm", "chat", body)
    now = kube.get(EM, "elasticmodels", "llm", "chat")
    assert now["status"] == body["status"]
    assert now["spec"]["model"] == "org/chat"  # the status subresource ignores everything else
    assert now["metadata"]["generation"] == stored["metadata"]["generation"]
    patch = [r for r in kube.mock._requests if r.method == "PATCH"][-1]
    assert patch.url.path.endswith("/elasticmodels/chat/status")
    assert patch.headers["Content-Type"] == "application/merge-patch+json"
    # merge patch: null removes a stale decision
    _cluster(kube).patch_status("llm", "chat", {"status": {"assigned": None}})
    assert "assigned" not in kube.get(EM, "elasticmodels", "llm", "chat")["status"]


def test_a_409_is_retried_until_the_write_lands(kube):
    _model(kube)
    pauses: list[float] = []
    injected = kube.fail(409, 2, "patch", ELASTICMODELS)
    _cluster(kube, sleep=pauses.append).patch_status("llm", "chat", {"status": {"observedGeneration": 1}})
    assert injected.remaining == 0
    assert pauses == [0.05, 0.1]
    assert kube.get(EM, "elasticmodels", "llm", "chat")["status"] == {"observedGeneration": 1}


def test_conflict_retries_are_bounded(kube):
    _model(kube)
    pauses: list[float] = []
    injected = kube.fail(409, 5, "patch", ELASTICMODELS)
    with pytest.raises(ClusterError) as caught:
        _cluster(kube, conflict_retries=2, sleep=pauses.append).patch_status("llm", "chat", {"status": {}})
    assert (caught.value.reason, caught.value.status) == ("StatusConflict", 409)
    assert injected.remaining == 2  # one try and two retries
    assert pauses == [0.05, 0.1]  # no pause after the last try


ERROR_CASES = [
    ("conflict-outlasts-retries", 409, 10, "StatusConflict"),
    ("server-error", 500, 1, "ApiUnavailable"),
    ("forbidden", 403, 1, "Forbidden"),
]


@pytest.mark.parametrize("status,times,reason", [c[1:] for c in ERROR_CASES], ids=[c[0] for c in ERROR_CASES])
def test_status_write_errors_are_typed(kube, status, times, reason):
    _model(kube)
    kube.fail(status, times, "patch", ELASTICMODELS)
    with pytest.raises(ClusterError) as caught:
        _cluster(kube, conflict_retries=3).patch_status("llm", "chat", {"status": {"observedGeneration": 1}})
    assert caught.value.reason == reason
    assert "status" not in kube.get(EM, "elasticmodels", "llm", "chat")  # an injected error changes nothing


def test_status_of_a_deleted_model(kube):
    with pytest.raises(ClusterError) as caught:
        _cluster(kube).patch_status("llm", "gone", {"status": {}})
    assert caught.value.reason == "ObjectGone"


def test_elastic_models_listed_with_status_and_a_missing_crd_is_named(kube):
    _model(kube, "a", "llm")
    _model(kube, "b", "team-b")
    assert [m["metadata"]["name"] for m in _cluster(kube).elastic_models()] == ["a", "b"]
    kube.fail(404, 1, "get", ELASTICMODELS)
    with pytest.raises(ClusterError) as caught:
        _cluster(kube).elastic_models()
    assert caught.value.reason == "CrdNotInstalled" and "config/crd/elasticmodels.yaml" in caught.value.message


def test_an_unreachable_api_server_is_typed():
    configuration = client.Configuration(host="http://127.0.0.1:9")
    configuration.retries = 0
    with client.ApiClient(configuration) as api_client, pytest.raises(ClusterError) as caught:
        Cluster(api_client, request_timeout_s=2).nodes()
    assert caught.value.reason == "ApiUnavailable"


@pytest.mark.parametrize("served, expected", [
    pytest.param(["podmonitors", "servicemonitors", "prometheusrules"], True, id="operator-installed"),
    pytest.param(["servicemonitors"], False, id="group-without-podmonitors"),
    pytest.param(None, False, id="no-monitoring-group"),
])
def test_api_discovery_says_whether_podmonitors_are_served(kube, served, expected):
    """The worker PodMonitors are rendered only where the API server serves their CRD."""
    if served is not None:
        kube.mock["get", "/apis/monitoring.coreos.com/v1"] << {
            "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "monitoring.coreos.com/v1",
            "resources": [{"name": name, "singularName": name[:-1], "namespaced": True, "kind": name.title(),
                           "verbs": ["get", "list"]} for name in served]}
    assert _cluster(kube).serves("monitoring.coreos.com", "v1", "podmonitors") is expected
