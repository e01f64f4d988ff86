"""In-place resize of a running worker pod's host memory request, so a change to one model never rolls a worker.

A worker's pod template requests a fixed host memory (the composition's workerBaseMemoryBytes); what its
models need beside it (the pinned host copies of its swap and elastic models) is rendered on the worker
Deployment as the `gpushare.dev/host-memory` annotation, outside the pod template, and Argo CD syncs it
without rolling the pod. After each cluster pass the controller brings each running worker pod's request to
its Deployment's annotation through the pod `resize` subresource (in-place pod resize, KEP-1287; memory
requests resize without a container restart). A cluster that does not serve the subresource answers 404:
the pod keeps its fixed request and the warning `InPlaceResizeUnsupported` is reported once per pod
(docs/guide.md, "Restarts and in-place changes", says what that means).

`pod_resizes` is pure (the live pods and the wanted requests in, the patches out); `WorkerResizer` is the
shell, through the Cluster adapter. Called by controller.cli.cluster_loop after each pass.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from contract.quantity import parse_bytes
from contract.wire import HOST_MEMORY_ANNOTATION, WORKER_LABEL
from controller.kube.cluster import Cluster
from controller.observe.facts import ClusterError

log = logging.getLogger(__name__)
CONTAINER = "worker"  # templates/worker-deployment.yaml.j2: the worker's container
UNSUPPORTED = "InPlaceResizeUnsupported"


@dataclass(frozen=True)
class PodResize:
    namespace: str
    pod: str
    current: str | None
    wanted: str
    patch: tuple[dict, ...]  # a JSON patch of the pod's resize subresource


def pod_resizes(pods: Sequence[dict], wanted: Mapping[tuple[str, str], str]) -> list[PodResize]:
    """The patches that bring each live worker pod's memory request to `wanted[(namespace, worker)]`; a pod
    being deleted, of a worker with no wanted value, or already at it needs none."""
    out = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        want = wanted.get((meta.get("namespace"), (meta.get("labels") or {}).get(WORKER_LABEL)))
        if want is None or meta.get("deletionTimestamp"):
            continue
        containers = (pod.get("spec") or {}).get("containers") or []
        index = next((i for i, c in enumerate(containers) if c.get("name") == CONTAINER), None)
        if index is None:
            continue
        current = ((containers[index].get("resources") or {}).get("requests") or {}).get("memory")
        if current is not None and _bytes(current) == _bytes(want):
            continue
        where = f"/spec/containers/{index}"
        patch = [{"op": "test", "path": f"{where}/name", "value": CONTAINER}]
        if not (containers[index].get("resources") or {}).get("requests"):
            patch.append({"op": "add", "path": f"{where}/resources", "value": {"requests": {}}})
        patch.append({"op": "add", "path": f"{where}/resources/requests/memory", "value": want})
        out.append(PodResize(meta["namespace"], meta["name"], current, want, tuple(patch)))
    return out


def _bytes(quantity: str) -> int | None:
    try:
        return parse_bytes(quantity)
    except ValueError:
        return None


@dataclass
class WorkerResizer:
    """Resizes the live worker pods after each pass; remembers the pods it already warned about."""

    cluster: Cluster
    warned: set[tuple[str, str]] = field(default_factory=set)

    def resize(self) -> list[tuple[str, str]]:
        """Resize every worker pod that needs it; the warnings (reason, message) to report. Never raises."""
        try:
            return self._resize()
        except ClusterError as exc:
            return [(exc.reason, f"resizing worker pods in place: {exc.message}")]

    def _resize(self) -> list[tuple[str, str]]:
        pods = self.cluster.worker_pods()
        workers = {(p["metadata"]["namespace"], (p["metadata"].get("labels") or {}).get(WORKER_LABEL))
                   for p in pods}
        wanted = {}
        for namespace, name in sorted(w for w in workers if w[1]):
            deployment = self.cluster.deployment(namespace, name)
            value = ((deployment or {}).get("metadata", {}).get("annotations") or {}).get(HOST_MEMORY_ANNOTATION)
            if value is not None:
                wanted[(namespace, name)] = value
        warnings = []
        for change in pod_resizes(pods, wanted):
            key = (change.namespace, change.pod)
            if self.cluster.resize_pod(change.namespace, change.pod, list(change.patch)):
                log.info("worker pod %s/%s: host memory request %s -> %s, in place", *key, change.current,
                         change.wanted)
                self.warned.discard(key)
            elif key not in self.warned:
                self.warned.add(key)
                warnings.append((UNSUPPORTED, f"worker pod {change.namespace}/{change.pod} requests "
                                 f"{change.current} of host memory but its models need {change.wanted}; the API "
                                 "server does not serve the pod resize subresource (in-place pod resize, "
                                 "Kubernetes 1.33 and later), so the scheduler does not count the pinned copies "
                                 "of its swap and elastic models: raise workerBaseMemoryBytes to cover them, or "
                                 "enable InPlacePodVerticalScaling"))
        return warnings
