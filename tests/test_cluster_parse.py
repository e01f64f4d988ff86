"""controller.kube.cluster's pure parsers: node labels, ConfigMaps, Application, Deployment and Job status."""
from __future__ import annotations

import pytest
import yaml

from controller.observe.facts import (
    ClusterError, app_state, gpu_slots, job_state, profile_document, worker_verdicts, workload_state,
)
from controller.types import GpuSlot
from contract.verdicts import Verdict, parse_document, render_document

MiB = 1 << 20


def node(name: str, **labels: str) -> dict:
    return {"metadata": {"name": name, "labels": labels}}


GFD = {"nvidia.com/gpu.product": "NVIDIA-H200", "nvidia.com/gpu.memory": "143771"}

SLOT_CASES = [
    ("one-gpu-count-defaults-to-1", [node("a", **GFD)],
     [GpuSlot("a", 0, "NVIDIA-H200", 143771 * MiB)], []),
    ("count-gives-one-slot-per-gpu", [node("a", **GFD, **{"nvidia.com/gpu.count": "2"})],
     [GpuSlot("a", 0, "NVIDIA-H200", 143771 * MiB), GpuSlot("a", 1, "NVIDIA-H200", 143771 * MiB)], []),
    ("unlabelled-node-is-not-a-gpu-node", [node("cpu-only"), node("b", **GFD)],
     [GpuSlot("b", 0, "NVIDIA-H200", 143771 * MiB)], []),
    ("sorted-by-node-name", [node("z", **GFD), node("a", **GFD)],
     [GpuSlot("a", 0, "NVIDIA-H200", 143771 * MiB), GpuSlot("z", 0, "NVIDIA-H200", 143771 * MiB)], []),
    ("memory-missing-is-reported", [node("a", **{"nvidia.com/gpu.product": "Tesla-T4"})], [],
     ["nvidia.com/gpu.memory"]),
    ("memory-not-a-number", [node("a", **{**GFD, "nvidia.com/gpu.memory": "80GB"})], [], ["nvidia.com/gpu.memory"]),
    ("count-zero", [node("a", **GFD, **{"nvidia.com/gpu.count": "0"})], [], ["nvidia.com/gpu.count"]),
    ("host-ram-from-allocatable-memory", [{**node("a", **GFD), "status": {"allocatable": {"memory": "131901736Ki"},
                                                                          "capacity": {"memory": "132Gi"}}}],
     [GpuSlot("a", 0, "NVIDIA-H200", 143771 * MiB, host_memory_bytes=131901736 * 1024)], []),
    ("host-ram-from-capacity-without-allocatable", [{**node("a", **GFD), "status": {"capacity": {"memory": "2Ti"}}}],
     [GpuSlot("a", 0, "NVIDIA-H200", 143771 * MiB, host_memory_bytes=2 * 2**40)], []),
    ("host-ram-unreadable-is-not-planned", [{**node("a", **GFD), "status": {"allocatable": {"memory": "x"}}}],
     [GpuSlot("a", 0, "NVIDIA-H200", 143771 * MiB)], []),
    ("memory-beyond-int64-bytes", [node("a", **{**GFD, "nvidia.com/gpu.memory": "9" * 30})], [],
     ["nvidia.com/gpu.memory"]),
    ("memory-in-non-ascii-digits", [node("a", **{**GFD, "nvidia.com/gpu.memory": "１４３７７１"})], [],
     ["nvidia.com/gpu.memory"]),
]


@pytest.mark.parametrize("nodes,slots,bad_labels", [c[1:] for c in SLOT_CASES], ids=[c[0] for c in SLOT_CASES])
def test_gpu_slots_from_feature_discovery_labels(nodes, slots, bad_labels):
    got, errors = gpu_slots(nodes)
    assert list(got) == slots
    assert [e.path for e in errors] == [f"metadata.labels[{label}]" for label in bad_labels]
    for error in errors:
        assert error.reason == "InvalidGpuLabels" and "GPU Feature Discovery" in error.fix


def test_slot_ids_match_offline_inventory_naming():
    (slot,), _ = gpu_slots([node("gpu-node-1", **GFD)])
    assert slot.id == "gpu-node-1/gpu0"
    assert slot.reserved_bytes == 1 << 30  # the same default as gpus.yaml


def test_profile_document_reads_the_data_key():
    cm = {"metadata": {"name": "p1", "namespace": "llm"}, "data": {"profile.yaml": "kind: Profile\n"}}
    doc = profile_document(cm)
    assert (doc.namespace, doc.name, doc.text, doc.ref) == ("llm", "p1", "kind: Profile\n", "ConfigMap/llm/p1")


def test_profile_configmap_without_data_key_says_what_to_do():
    with pytest.raises(ClusterError) as caught:
        profile_document({"metadata": {"name": "p1", "namespace": "llm"}, "data": {"other": "x"}})
    assert caught.value.reason == "InvalidProfileConfigMap"
    assert "profile.yaml" in caught.value.message and "llm/p1" in caught.value.message


def test_worker_verdicts_read_what_the_worker_writes():
    document = render_document("node-a/gpu0", [
        Verdict("chat", "llm", "resident", "applied", "Fits", "ok", 10, 20, 0),
        Verdict("big", "llm", "swap", "refused", "InsufficientMemory", "CUDA has 2Gi", 30, 20, 10),
    ])
    cm = {"metadata": {"name": "verdicts-node-a-gpu0", "namespace": "gpushare"}, "data": {"verdicts.yaml": document}}
    verdicts = worker_verdicts(cm)
    assert list(verdicts) == [("llm", "chat", "node-a/gpu0"), ("llm", "big", "node-a/gpu0")]
    assert verdicts[("llm", "chat", "node-a/gpu0")].verdict == "applied"
    refused = verdicts[("llm", "big", "node-a/gpu0")]
    assert (refused.mode, refused.verdict, refused.slot, refused.reason) == (
        "swap", "refused", "node-a/gpu0", "InsufficientMemory")
    assert (refused.need_bytes, refused.available_bytes, refused.missing_bytes) == (30, 20, 10)
    assert refused.device_uuid is None  # a CPU worker reports no GPU


@pytest.mark.parametrize("uuid, readable", [
    pytest.param("GPU-8d1e0c1a-3f4b-4c2d-9e77-0a1b2c3d4e5f", True, id="gpu-uuid"),
    pytest.param("MIG-4b9e2f3a-1c2d-4e5f-8a9b-0c1d2e3f4a5b", True, id="mig-uuid"),
    pytest.param("0,1", False, id="an-index-list-is-no-uuid"),
    pytest.param("GPU-x; rm -rf /", False, id="shell-text-refused"),
])
def test_the_worker_reports_the_gpu_it_was_given(uuid, readable):
    """What the controller hands a profiler beside this worker as NVIDIA_VISIBLE_DEVICES: only a well-formed UUID."""
    entry = {"name": "chat", "namespace": "llm", "mode": "resident", "verdict": "applied", "reason": "Fits",
             "message": "ok", "needBytes": 1, "availableBytes": 2, "missingBytes": 0}
    text = yaml.safe_dump({"apiVersion": "gpushare.dev/v1alpha1", "kind": "WorkerVerdicts", "slot": "node-a/gpu1",
                           "deviceUuid": uuid, "models": [entry]})
    cm = {"metadata": {"name": "v", "namespace": "gpushare"}, "data": {"verdicts.yaml": text}}
    if readable:
        assert worker_verdicts(cm)[("llm", "chat", "node-a/gpu1")].device_uuid == uuid
        assert parse_document(render_document("node-a/gpu1", [Verdict("chat", "llm", "resident", "applied", "Fits",
                                                                     "ok", 1, 2, 0)], uuid)).device_uuid == uuid
    else:
        with pytest.raises(ClusterError):
            worker_verdicts(cm)


@pytest.mark.parametrize("data", [{}, {"verdicts.yaml": "{slot: n/gpu0, models: 3}"}, {"verdicts.yaml": "[unclosed"},
                                  {"verdicts.yaml": "{slot: n/gpu0, models: [{name: a}]}"},
                                  {"verdicts.yaml": "models: []"}],
                         ids=["no-key", "models-not-a-list", "not-yaml", "entry-without-fields", "no-slot"])
def test_unreadable_verdicts_are_reported(data):
    with pytest.raises(ClusterError) as caught:
        worker_verdicts({"metadata": {"name": "v", "namespace": "gpushare"}, "data": data})
    assert caught.value.reason == "InvalidVerdicts" and "gpushare/v" in caught.value.message


def application(sync=None, operation=None, health=None) -> dict:
    status = {k: v for k, v in {"sync": sync, "operationState": operation, "health": health}.items() if v}
    return {"metadata": {"name": "rendered"}, "status": status}


APP_CASES = [
    ("synced-descendant", application({"status": "Synced", "revision": "abc"}, health={"status": "Healthy"}),
     {"abc"}, ("Synced", "abc", True, "Healthy", None)),
    ("synced-older-revision", application({"status": "Synced", "revision": "old"}), {"abc"},
     ("Synced", "old", False, None, None)),
    ("never-synced", application(), {"abc"}, (None, None, False, None, None)),
    ("operation-failed", application({"status": "OutOfSync", "revision": "abc"},
                                     {"phase": "Failed", "message": "ComparisonError"}), {"abc"},
     ("OutOfSync", "abc", True, None, "Failed")),
]


@pytest.mark.parametrize("app,descendants,expected", [c[1:] for c in APP_CASES], ids=[c[0] for c in APP_CASES])
def test_app_state(app, descendants, expected):
    state = app_state(app, lambda revision: revision in descendants)
    assert (state.sync_status, state.revision, state.contains_commit, state.health, state.operation_phase) == expected
    assert state.name == "rendered"


def deployment(generation=2, observed=2, replicas=1, updated=1, available=1, available_cond="True",
               message="") -> dict:
    return {"metadata": {"name": "worker", "generation": generation}, "spec": {"replicas": replicas},
            "status": {"observedGeneration": observed, "updatedReplicas": updated, "availableReplicas": available,
                       "conditions": [{"type": "Available", "status": available_cond, "message": message}]}}


WORKLOAD_CASES = [
    ("rolled-out-and-available", deployment(), True, ""),
    ("new-generation-not-observed", deployment(observed=1), False, "1/1 replicas available"),
    ("pod-not-updated", deployment(updated=0), False, "0/1 updated"),
    ("not-available", deployment(available=0, available_cond="False",
                                 message="Deployment does not have minimum availability."),
     False, "minimum availability"),
]


@pytest.mark.parametrize("obj,available,words", [c[1:] for c in WORKLOAD_CASES],
                         ids=[c[0] for c in WORKLOAD_CASES])
def test_workload_state(obj, available, words):
    state = workload_state(obj)
    assert state.available is available
    assert words in state.message


def job(*conditions: tuple[str, str], message: str = "") -> dict:
    return {"metadata": {"name": "profile-chat"},
            "status": {"conditions": [{"type": t, "status": s, "reason": "BackoffLimitExceeded",
                                       "message": message} for t, s in conditions]}}


def pod(exit_code: int, message: str, finished: str = "2026-01-01T00:00:00Z") -> dict:
    return {"status": {"containerStatuses": [{"state": {"terminated": {
        "exitCode": exit_code, "message": message, "finishedAt": finished}}}]}}


JOB_CASES = [
    ("running", job(), [], ("Running", "")),
    ("complete", job(("Complete", "True")), [], ("Complete", "")),
    ("failed-with-termination-message", job(("Failed", "True"), message="Job has reached the backoff limit"),
     [pod(1, "model org/x not found\n")], ("Failed", "model org/x not found")),
    ("newest-termination-message-wins", job(("Failed", "True")),
     [pod(1, "first try", "2026-01-01T00:00:00Z"), pod(1, "second try", "2026-01-01T00:01:00Z")],
     ("Failed", "second try")),
    ("failed-without-pods-uses-job-condition", job(("Failed", "True"), message="Job has reached the backoff limit"),
     [], ("Failed", "BackoffLimitExceeded: Job has reached the backoff limit")),
    ("condition-false-is-not-failed", job(("Failed", "False")), [], ("Running", "")),
]


@pytest.mark.parametrize("obj,pods,expected", [c[1:] for c in JOB_CASES], ids=[c[0] for c in JOB_CASES])
def test_job_state(obj, pods, expected):
    state = job_state(obj, pods)
    assert (state.phase, state.message) == expected
