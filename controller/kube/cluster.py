"""The Kubernetes adapter of cluster mode: facts in, ElasticModel status out.

Owns every call the controller makes to the API server (through the official
`kubernetes` client, an ApiClient passed in) and the merge-patch of the status
subresource with a retry on 409 Conflict. What comes back is parsed by the pure
functions of controller.observe.facts.
Called by the cluster reconcile loop; controller.kube.leader owns the Lease.
"""
from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Iterable
from typing import Callable

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from contract.wire import (ARGO_GROUP, ARGO_PLURAL, ARGO_VERSION, GPU_PRODUCT_LABEL, GROUP, JSON_PATCH, MERGE_PATCH,
                           PLURAL, PROFILE_LABEL, VERDICTS_LABEL, VERSION, WORKER_POD_LABEL)
from controller.observe.facts import (ClusterError, ProfileDocument, VerdictKey, job_state, profile_document,
                                      worker_verdicts, workload_state)
from controller.observe.status import JobState, WorkerVerdict, WorkloadState

log = logging.getLogger(__name__)



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
            label_selector=GPU_PRODUCT_LABEL, _request_timeout=self.timeout))
        return [self._plain(n) for n in result.items]

    def serves(self, group: str, version: str, plural: str) -> bool:
        """Whether the API server serves `plural` in `group`/`version` (API discovery; a missing group is a 404)."""
        found = _get(f"discover {group}/{version}", lambda: self.custom.get_api_resources(
            group, version, _request_timeout=self.timeout))
        return found is not None and any(r.name == plural for r in found.resources or ())

    def profile_documents(self) -> tuple[list[ProfileDocument], list[ClusterError]]:
        """Profile ConfigMaps in every namespace; broken ones are reported apart. Which of them the pass
        accepts (only those the controller's profiler Jobs write) is decided by controller.passes.cluster_pass."""
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
                raise ClusterError("CrdNotInstalled", f"the API server does not serve {PLURAL}.{GROUP}; "
                                   "apply config/crd/elasticmodels.yaml (kubectl apply -k config/)") from exc
            raise
        return result["items"]

    def application(self, namespace: str, name: str) -> dict | None:
        return _get(f"get Application {namespace}/{name}", lambda: self.custom.get_namespaced_custom_object(
            ARGO_GROUP, ARGO_VERSION, namespace, ARGO_PLURAL, name, _request_timeout=self.timeout))

    def workload(self, namespace: str, name: str) -> WorkloadState | None:
        found = self.deployment(namespace, name)
        return None if found is None else workload_state(found)

    def deployment(self, namespace: str, name: str) -> dict | None:
        found = _get(f"get Deployment {namespace}/{name}", lambda: self.apps.read_namespaced_deployment(
            name, namespace, _request_timeout=self.timeout))
        return None if found is None else self._plain(found)

    def worker_pods(self) -> list[dict]:
        """The worker pods of every namespace (by the label every worker pod template carries)."""
        result = _call("list worker pods", lambda: self.core.list_pod_for_all_namespaces(
            label_selector=f"{WORKER_POD_LABEL[0]}={WORKER_POD_LABEL[1]}", _request_timeout=self.timeout))
        return [self._plain(p) for p in result.items]

    def resize_pod(self, namespace: str, name: str, patch: list[dict]) -> bool:
        """JSON-patch the pod's `resize` subresource (in-place pod resize); False when the API server answers
        404 (a cluster that does not serve in-place resize, or a pod gone since it was listed)."""
        try:
            self.core.patch_namespaced_pod_resize(name, namespace, patch, _content_type=JSON_PATCH,
                                                  _request_timeout=self.timeout)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise _api_error(f"resize pod {namespace}/{name}", exc) from exc
        except urllib3.exceptions.HTTPError as exc:
            raise _unreachable(f"resize pod {namespace}/{name}", exc) from exc
        return True

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
