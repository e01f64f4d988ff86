"""The Kubernetes adapter of cluster mode: facts in, ElasticModel status out.

Owns every call the controller makes to the API server (through the official
`kubernetes` client, an ApiClient passed in) and the pure parsing of what comes back:
GPU slots from NVIDIA GPU Feature Discovery node labels, profile and worker-verdict
ConfigMaps, the Argo CD Application, the live Deployment and profiler Job, and the
merge-patch of the status subresource with a retry on 409 Conflict. The parsers take
plain JSON dicts (what the API serves), so they are tested without a server.
Called by the cluster reconcile loop; controller.leader owns the Lease.
"""
from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Callable

import urllib3
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from controller.quantity import QuantityError, parse_bytes
from controller.status import AppState, JobState, WorkerVerdict, WorkloadState
from controller.types import GpuSlot, InputError
from worker.verdicts import DATA_KEY as VERDICTS_DATA_KEY
from worker.verdicts import LABEL as VERDICTS_LABEL

log = logging.getLogger(__name__)

GROUP, VERSION, PLURAL = "gpushare.dev", "v1alpha1", "elasticmodels"
ARGO_GROUP, ARGO_VERSION, ARGO_PLURAL = "argoproj.io", "v1alpha1", "applications"
PRODUCT_LABEL = "nvidia.com/gpu.product"
MEMORY_LABEL = "nvidia.com/gpu.memory"  # MiB, as a string
COUNT_LABEL = "nvidia.com/gpu.count"
PROFILE_LABEL = "gpushare.dev/profile"
PROFILE_DATA_KEY = "profile.yaml"
MERGE_PATCH = "application/merge-patch+json"
MiB = 1 << 20


class ClusterError(Exception):
    """An API call or a cluster object the controller cannot use; `reason` is PascalCase,
    `status` the HTTP status when the API server answered."""

    def __init__(self, reason: str, message: str, status: int | None = None):
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message
        self.status = status


# ---------------------------------------------------------------- pure parsing


def gpu_slots(nodes: list[dict]) -> tuple[tuple[GpuSlot, ...], list[InputError]]:
    """One slot per GPU of each node labelled by GPU Feature Discovery; unlabelled nodes are not GPU nodes.

    A node with a product label but unusable memory or count labels is reported, never guessed.
    """
    slots: list[GpuSlot] = []
    errors: list[InputError] = []
    for node in sorted(nodes, key=lambda n: n["metadata"]["name"]):
        name = node["metadata"]["name"]
        labels = node["metadata"].get("labels") or {}
        product = labels.get(PRODUCT_LABEL)
        if not product:
            continue
        memory_mib, count = _positive_int(labels.get(MEMORY_LABEL)), _positive_int(labels.get(COUNT_LABEL, "1"))
        if memory_mib is None or count is None:
            label = MEMORY_LABEL if memory_mib is None else COUNT_LABEL
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
    if value is None or not value.strip().isdigit() or int(value) < 1:
        return None
    return int(value)


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
        doc = yaml.safe_load((configmap.get("data") or {}).get(VERDICTS_DATA_KEY) or "")
        slot, entries = str(doc["slot"]), doc["models"]
        return {(e["namespace"], e["name"], slot): WorkerVerdict(
            mode=e["mode"], verdict=e["verdict"], slot=slot, reason=e.get("reason", ""), message=e.get("message", ""),
            need_bytes=int(e.get("needBytes", 0)), available_bytes=int(e.get("availableBytes", 0)),
            missing_bytes=int(e.get("missingBytes", 0))) for e in entries}
    except (yaml.YAMLError, TypeError, KeyError, ValueError) as exc:
        raise ClusterError("InvalidVerdicts", f"{where} has no readable {VERDICTS_DATA_KEY} "
                           f"(a WorkerVerdicts document with a slot and a models list): {exc!r}") from exc


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
        return JobState(name=name, phase="Failed", message=message)
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


# ---------------------------------------------------------------- the calls


class Cluster:
    """The API calls of one controller; every object comes back as a plain JSON dict."""

    def __init__(self, api_client: client.ApiClient, *, conflict_retries: int = 5,
                 sleep: Callable[[float], None] = time.sleep, request_timeout_s: float = 30.0):
        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.apps = client.AppsV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.conflict_retries = conflict_retries
        self.sleep = sleep
        self.timeout = request_timeout_s

    def _plain(self, obj) -> dict:
        return self.api_client.sanitize_for_serialization(obj)

    def nodes(self) -> list[dict]:
        """Nodes that GPU Feature Discovery labelled with a GPU product."""
        result = _call("list GPU nodes", lambda: self.core.list_node(
            label_selector=PRODUCT_LABEL, _request_timeout=self.timeout))
        return [self._plain(n) for n in result.items]

    def profile_documents(self) -> tuple[list[ProfileDocument], list[ClusterError]]:
        """Profile ConfigMaps in every namespace; broken ones are reported apart. Which of them the pass
        accepts (only those the controller's profiler Jobs write) is decided by controller.cluster_pass."""
        result = _call("list profile ConfigMaps", lambda: self.core.list_config_map_for_all_namespaces(
            label_selector=f"{PROFILE_LABEL}=true", _request_timeout=self.timeout))
        documents, errors = [], []
        for configmap in result.items:
            try:
                documents.append(profile_document(self._plain(configmap)))
            except ClusterError as exc:
                errors.append(exc)
        return documents, errors

    def verdicts(self, sources: Iterable[tuple[str, str]]) -> tuple[dict[VerdictKey, WorkerVerdict],
                                                                     list[ClusterError]]:
        """The verdicts of the workers the pass rendered: only the ConfigMaps named in `sources`
        ((namespace, name) pairs from their worker.yaml), so no other namespace can speak for a worker."""
        wanted: dict[str, set[str]] = defaultdict(set)
        for namespace, name in sources:
            wanted[namespace].add(name)
        verdicts: dict[VerdictKey, WorkerVerdict] = {}
        errors = []
        for namespace in sorted(wanted):
            result = _call(f"list verdict ConfigMaps in {namespace}", lambda: self.core.list_namespaced_config_map(
                namespace, label_selector=f"{VERDICTS_LABEL}=true", _request_timeout=self.timeout))
            for configmap in result.items:
                plain = self._plain(configmap)
                if plain["metadata"]["name"] not in wanted[namespace]:
                    continue
                try:
                    verdicts.update(worker_verdicts(plain))
                except ClusterError as exc:
                    errors.append(exc)
        return verdicts, errors

    def elastic_models(self) -> list[dict]:
        """Every ElasticModel in the cluster, status included (previous conditions, observedGeneration)."""
        try:
            result = _call("list ElasticModels", lambda: self.custom.list_cluster_custom_object(
                GROUP, VERSION, PLURAL, _request_timeout=self.timeout))
        except ClusterError as exc:
            if exc.status == 404:
                raise ClusterError("CrdNotInstalled", "the API server does not serve elasticmodels.gpushare.dev; "
                                   "apply config/crd/elasticmodels.yaml (kubectl apply -k config/)") from exc
            raise
        return result["items"]

    def application(self, namespace: str, name: str) -> dict | None:
        return _get(f"get Application {namespace}/{name}", lambda: self.custom.get_namespaced_custom_object(
            ARGO_GROUP, ARGO_VERSION, namespace, ARGO_PLURAL, name, _request_timeout=self.timeout))

    def workload(self, namespace: str, name: str) -> WorkloadState | None:
        found = _get(f"get Deployment {namespace}/{name}", lambda: self.apps.read_namespaced_deployment(
            name, namespace, _request_timeout=self.timeout))
        return None if found is None else workload_state(self._plain(found))

    def profiler_job(self, namespace: str, name: str) -> JobState | None:
        found = _get(f"get Job {namespace}/{name}", lambda: self.batch.read_namespaced_job(
            name, namespace, _request_timeout=self.timeout))
        if found is None:
            return None
        job = self._plain(found)
        pods: list[dict] = []
        if any(c.get("type") == "Failed" and c.get("status") == "True"
               for c in (job.get("status") or {}).get("conditions") or []):
            listed = _call(f"list pods of Job {namespace}/{name}", lambda: self.core.list_namespaced_pod(
                namespace, label_selector=f"job-name={name}", _request_timeout=self.timeout))
            pods = [self._plain(p) for p in listed.items]
        return job_state(job, pods)

    def patch_status(self, namespace: str, name: str, body: dict) -> dict:
        """Merge-patch the status subresource; a 409 Conflict is retried with a short, growing pause."""
        for attempt in range(self.conflict_retries + 1):
            try:
                return self.custom.patch_namespaced_custom_object_status(
                    GROUP, VERSION, namespace, PLURAL, name, body,
                    _content_type=MERGE_PATCH, _request_timeout=self.timeout)
            except ApiException as exc:
                if exc.status == 404:
                    raise ClusterError("ObjectGone", f"ElasticModel {namespace}/{name} was deleted before its "
                                                     "status could be written", 404) from exc
                if exc.status != 409:
                    raise _api_error(f"patch status of ElasticModel {namespace}/{name}", exc) from exc
            except urllib3.exceptions.HTTPError as exc:
                raise _unreachable(f"patch status of ElasticModel {namespace}/{name}", exc) from exc
            if attempt < self.conflict_retries:
                log.info("status of %s/%s: 409 conflict, retry %d", namespace, name, attempt + 1)
                self.sleep(0.05 * 2 ** attempt)
        raise ClusterError("StatusConflict", f"status of ElasticModel {namespace}/{name} still conflicted after "
                                             f"{self.conflict_retries} retries; the next pass writes it again",
                           status=409)


def _call(what: str, fn):
    try:
        return fn()
    except ApiException as exc:
        raise _api_error(what, exc) from exc
    except urllib3.exceptions.HTTPError as exc:
        raise _unreachable(what, exc) from exc


def _get(what: str, fn):
    """The object, or None when the API answers 404 (not created yet, or its CRD is not installed)."""
    try:
        return _call(what, fn)
    except ClusterError as exc:
        if exc.status == 404:
            return None
        raise


def _unreachable(what: str, exc: Exception) -> ClusterError:
    return ClusterError("ApiUnavailable", f"{what}: the API server is unreachable ({type(exc).__name__}); "
                                          "retried with backoff")


def _api_error(what: str, exc: ApiException) -> ClusterError:
    status = exc.status
    if status in (401, 403):
        return ClusterError("Forbidden", f"{what}: HTTP {status}; check the controller's ClusterRole "
                                         "(config/rbac) and its ServiceAccount token", status)
    if status is None or status == 429 or status >= 500:
        return ClusterError("ApiUnavailable", f"{what}: HTTP {status} {exc.reason}; retried with backoff", status)
    return ClusterError("ApiRequestFailed", f"{what}: HTTP {status} {exc.reason}", status)
