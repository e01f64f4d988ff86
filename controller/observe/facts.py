"""What the API server reports, parsed: GPU slots, profile and verdict ConfigMaps, Argo CD and workload state.

Owns the pure parsing of the JSON the Kubernetes API serves (plain dicts, so it
is tested without a server): GPU slots from NVIDIA GPU Feature Discovery node
labels, profile ConfigMaps, worker verdicts (contract.verdicts, the one reader),
the Argo CD Application, the live Deployment and profiler Job. The Kubernetes
adapter (controller.kube.cluster) fetches the objects and calls these; the pure
cluster pass and the status stage read their results.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from contract.hub import termination_reason
from contract.quantity import QuantityError, parse_bytes
from contract.verdicts import InvalidVerdicts, parse_document
from contract.wire import (GPU_COUNT_LABEL, GPU_MEMORY_LABEL, GPU_PRODUCT_LABEL, PROFILE_DATA_KEY, PROFILE_LABEL,
                           VERDICTS_DATA_KEY)
from controller.observe.status import AppState, JobState, WorkerVerdict, WorkloadState
from controller.types import GpuSlot, InputError

MiB = 1 << 20


class ClusterError(Exception):
    """An API call or a cluster object the controller cannot use; `reason` is PascalCase,
    `status` the HTTP status when the API server answered."""

    def __init__(self, reason: str, message: str, status: int | None = None):
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message
        self.status = status


def gpu_slots(nodes: list[dict]) -> tuple[tuple[GpuSlot, ...], list[InputError]]:
    """One slot per GPU of each node labelled by GPU Feature Discovery; unlabelled nodes are not GPU nodes.

    A node with a product label but unusable memory or count labels is reported, never guessed.
    """
    slots: list[GpuSlot] = []
    errors: list[InputError] = []
    for node in sorted(nodes, key=lambda n: n["metadata"]["name"]):
        name = node["metadata"]["name"]
        labels = node["metadata"].get("labels") or {}
        product = labels.get(GPU_PRODUCT_LABEL)
        if not product:
            continue
        memory_mib, count = _positive_int(labels.get(GPU_MEMORY_LABEL)), _positive_int(labels.get(GPU_COUNT_LABEL, "1"))
        if memory_mib is None or count is None:
            label = GPU_MEMORY_LABEL if memory_mib is None else GPU_COUNT_LABEL
            errors.append(InputError(
                file=f"Node/{name}", document=None, path=f"metadata.labels[{label}]", reason="InvalidGpuLabels",
                message=f"node {name} has {label}={labels.get(label)!r}, not a positive whole number",
                fix="check that NVIDIA GPU Feature Discovery runs on the node (it sets gpu.memory in MiB "
                    "and gpu.count)", object=f"Node/{name}"))
            continue
        host = _host_memory(node)
        slots.extend(GpuSlot(node=name, index=i, product=product, memory_bytes=memory_mib * MiB,
                             host_memory_bytes=host) for i in range(count))
    return tuple(slots), errors


def node_labels(nodes: list[dict]) -> dict[str, dict[str, str]]:
    """Each node's labels (name -> labels): cluster mode finds a pool's nodes by them
    (controller.inputs.pools.split_pool_nodes)."""
    return {node["metadata"]["name"]: {str(k): str(v) for k, v in (node["metadata"].get("labels") or {}).items()}
            for node in nodes}


def _host_memory(node: dict) -> int | None:
    """The node's host RAM for pods: status.allocatable.memory, else status.capacity.memory; None if neither
    is a quantity (host RAM is then not planned on that node)."""
    status = node.get("status") or {}
    for section in ("allocatable", "capacity"):
        value = (status.get(section) or {}).get("memory")
        if value is None:
            continue
        try:
            return parse_bytes(value) or None
        except QuantityError:
            return None
    return None


def _positive_int(value: str | None) -> int | None:
    """A label's positive integer, at most 2^43 (MiB of memory in int64 bytes); None otherwise."""
    if value is None or not value.strip().isascii() or not value.strip().isdigit():
        return None
    number = int(value)
    return number if 1 <= number <= 2**43 else None


@dataclass(frozen=True)
class ProfileDocument:
    """The profile YAML a ConfigMap carries, with where it came from (for errors and commits)."""

    namespace: str
    name: str
    text: str

    @property
    def ref(self) -> str:
        return f"ConfigMap/{self.namespace}/{self.name}"


def profile_document(configmap: dict) -> ProfileDocument:
    meta = configmap["metadata"]
    text = (configmap.get("data") or {}).get(PROFILE_DATA_KEY)
    if not text:
        raise ClusterError("InvalidProfileConfigMap",
                           f"ConfigMap {meta.get('namespace')}/{meta['name']} is labelled {PROFILE_LABEL}=true but "
                           f"has no data key {PROFILE_DATA_KEY}; rerun the profiler Job or remove the label")
    return ProfileDocument(namespace=meta.get("namespace", ""), name=meta["name"], text=text)


VerdictKey = tuple[str, str, str]  # (namespace, name) of the ElasticModel, the slot the worker serves


def worker_verdicts(configmap: dict) -> dict[VerdictKey, WorkerVerdict]:
    """(namespace, name, slot) → verdict, from one worker's WorkerVerdicts document."""
    meta = configmap["metadata"]
    where = f"ConfigMap {meta.get('namespace')}/{meta['name']}"
    try:
        doc = parse_document((configmap.get("data") or {}).get(VERDICTS_DATA_KEY) or "")
    except InvalidVerdicts as exc:
        raise ClusterError(InvalidVerdicts.reason, f"{where} has no readable {VERDICTS_DATA_KEY} ({exc}); the worker "
                           "rewrites it on its next admission: check the worker's logs") from exc
    return {(v.namespace, v.name, doc.slot): WorkerVerdict(
        mode=v.mode, verdict=v.verdict, slot=doc.slot, reason=v.reason, message=v.message, need_bytes=v.need_bytes,
        available_bytes=v.available_bytes, missing_bytes=v.missing_bytes, device_uuid=doc.device_uuid)
        for v in doc.verdicts}


def app_state(application: dict, contains_commit: Callable[[str], bool]) -> AppState:
    """An Argo CD Application's sync state; `contains_commit(revision)` is the caller's git ancestry check."""
    status = application.get("status") or {}
    sync = status.get("sync") or {}
    operation = status.get("operationState") or {}
    revision = sync.get("revision")
    return AppState(
        name=application["metadata"]["name"], sync_status=sync.get("status"), revision=revision,
        contains_commit=bool(revision) and contains_commit(revision),
        health=(status.get("health") or {}).get("status"),
        operation_phase=operation.get("phase"), operation_message=operation.get("message", ""))


def workload_state(deployment: dict) -> WorkloadState:
    """Available once the rollout of the current generation is complete and its replicas serve."""
    meta, spec, status = deployment["metadata"], deployment.get("spec") or {}, deployment.get("status") or {}
    wanted = spec.get("replicas", 1)
    conditions = {c["type"]: c for c in status.get("conditions") or []}
    rolled_out = status.get("observedGeneration", 0) >= meta.get("generation", 1)
    updated = status.get("updatedReplicas", 0) >= wanted
    available = conditions.get("Available", {}).get("status") == "True" and status.get("availableReplicas", 0) >= wanted
    if rolled_out and updated and available:
        return WorkloadState(name=meta["name"], available=True)
    progressing = conditions.get("Progressing", {})
    detail = progressing.get("message") or conditions.get("Available", {}).get("message") or ""
    message = (f"{status.get('availableReplicas', 0)}/{wanted} replicas available, "
               f"{status.get('updatedReplicas', 0)}/{wanted} updated" + (f"; {detail}" if detail else ""))
    return WorkloadState(name=meta["name"], available=False, message=message)


def job_state(job: dict, pods: list[dict]) -> JobState:
    """Complete or Failed from the Job's conditions; a failure's message from its pod's termination message."""
    name = job["metadata"]["name"]
    conditions = {c["type"]: c for c in (job.get("status") or {}).get("conditions") or [] if c.get("status") == "True"}
    if "Complete" in conditions:
        return JobState(name=name, phase="Complete")
    if "Failed" in conditions:
        reason = conditions["Failed"]
        message = _termination_message(pods) or f"{reason.get('reason', 'Failed')}: {reason.get('message', '')}"
        return JobState(name=name, phase="Failed", message=message, reason=termination_reason(message) or "")
    return JobState(name=name, phase="Running")


def _termination_message(pods: list[dict]) -> str:
    """The newest non-empty termination message of a failed container (what the profiler wrote)."""
    found: list[tuple[str, str]] = []
    for pod in pods:
        for container in (pod.get("status") or {}).get("containerStatuses") or []:
            for state in (container.get("state"), container.get("lastState")):
                terminated = (state or {}).get("terminated") or {}
                if terminated.get("exitCode", 0) != 0 and terminated.get("message"):
                    found.append((terminated.get("finishedAt") or "", terminated["message"].strip()))
    return max(found)[1] if found else ""
