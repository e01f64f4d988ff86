"""A cluster-mode world for tests: the API server double, a git remote, and controller replicas wired to both.

Owns `World` (one fleet repository on a `git daemon`, GPU nodes and the Argo CD Application
seeded in the double, a driven clock, recorded waits) and the actors' moves the tests make:
push an ElasticModel to git and to the cluster, publish a profile ConfigMap as the profiler
Job would, make Argo CD sync the head, roll a worker Deployment out, report a worker verdict.
Used by tests/test_cluster_loop*.py.
"""
from __future__ import annotations

import copy as copying
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from controller.kube.cluster import Cluster
from controller.cli.cluster_loop import ClusterReconciler
from controller.cli.common import controller_copy
from controller.kube.leader import LeaderElection
from controller.rendering.names import profile_configmap_name
from profiler_job.args import ConfigMapTarget
from profiler_job.publish import configmap_body
from tests.conftest import REPO_ROOT
from tests.gitserver import GitServer, git
from tests.kubedouble import RunningDouble
from contract.verdicts import Verdict, render_document
from contract.wire import VERDICTS_DATA_KEY as DATA_KEY, VERDICTS_LABEL as LABEL, WORKER_CONFIG_DATA_KEY

EM = "gpushare.dev/v1alpha1"
QWEN = "Qwen/Qwen2.5-0.5B-Instruct"
PRODUCT = "NVIDIA-L4"
NODE = "gpu-1"
SLOT = f"{NODE}/gpu0"
ESTIMATED = (REPO_ROOT / "examples/fleet/profiles" / PRODUCT / "qwen--qwen2.5-0.5b-instruct.yaml").read_text()
APP = ("argocd", "gpushare-rendered")
REPO = "fleet.git"


class Clock:
    def __init__(self, now: float = 1_800_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def model_doc(name: str = "chat", namespace: str = "llm", *, budget: str = "4Gi", **spec) -> dict:
    return {"apiVersion": EM, "kind": "ElasticModel", "metadata": {"name": name, "namespace": namespace},
            "spec": {"model": QWEN, "memoryBudget": budget, "gpu": {"product": PRODUCT},
                     "slo": {"contextTokens": 2048, "concurrency": 1}, **spec}}


def measured_profile() -> dict:
    """The profile a profiler Job on an L4 would publish (the shipped estimate's numbers, measured)."""
    doc = yaml.safe_load(ESTIMATED)
    doc.update(source="measured", method="gpushare-profiler (test double) on NVIDIA L4")
    return doc


@dataclass
class World:
    kube: RunningDouble
    server: GitServer
    tmp: Path
    clock: Clock = field(default_factory=Clock)
    waits: list[float] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.server.url(REPO)

    def setup(self, models: list[dict], *, estimated_profile: bool = False) -> None:
        """The fleet repo with `models` (and the shipped estimate when asked), one L4 node, the Application,
        and each ElasticModel synced into the cluster."""
        files = {f"models/{m['metadata']['namespace']}/{m['metadata']['name']}.yaml": yaml.safe_dump(m).encode()
                 for m in models}
        if estimated_profile:
            files[f"profiles/{PRODUCT}/qwen--qwen2.5-0.5b-instruct.yaml"] = ESTIMATED.encode()
        self.server.create_repo(REPO, files)
        self.kube.seed("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": {
            "nvidia.com/gpu.product": PRODUCT, "nvidia.com/gpu.memory": "23034", "nvidia.com/gpu.count": "1"}}})
        self.kube.seed("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cpu-1"}})
        self.kube.seed("applications", {
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": APP[1], "namespace": APP[0]},
            "spec": {"source": {"repoURL": self.url, "path": "rendered", "targetRevision": "main"}},
            "status": {"sync": {"status": "OutOfSync"}, "health": {"status": "Progressing"}}})
        for m in models:
            self.kube.seed("elasticmodels", m)

    def reconciler(self, identity: str = "pod-a", **kwargs) -> ClusterReconciler:
        election = LeaderElection(self.kube.api_client, namespace="gpushare-system", identity=identity,
                                  clock=self.clock)
        kwargs.setdefault("jitter", lambda low, high: high)
        kwargs.setdefault("renew_every_s", 3600.0)
        return ClusterReconciler(Cluster(self.kube.api_client, sleep=self.waits.append),
                                 controller_copy(self.url, "main", self.tmp / f"checkout-{identity}"), election,
                                 applications=[APP], clock=self.clock, sleep=self.waits.append, **kwargs)

    # ------------------------------------------------------------ git

    def commits(self) -> int:
        return int(git("rev-list", "--count", "main", cwd=self.server.path(REPO)))

    def head(self) -> str:
        return self.server.head(REPO)

    def files(self) -> dict[str, bytes]:
        return self.server.files(REPO)

    def rendered(self, kind: str) -> list[dict]:
        """The objects of `kind` on the remote's rendered/ tree."""
        docs = [yaml.safe_load(text) for path, text in self.files().items() if path.startswith("rendered/")
                and path.endswith(".yaml")]
        return [d for d in docs if isinstance(d, dict) and d.get("kind") == kind]

    # ------------------------------------------------------------ other actors

    def status(self, name: str = "chat", namespace: str = "llm") -> dict:
        return self.kube.get(EM, "elasticmodels", namespace, name).get("status") or {}

    def conditions(self, name: str = "chat", namespace: str = "llm") -> dict[str, dict]:
        return {c["type"]: c for c in self.status(name, namespace).get("conditions", [])}

    def publish_profile(self, namespace: str = "llm") -> dict:
        """The ConfigMap the profiler Job writes (profiler_job.publish's labels and key)."""
        name = profile_configmap_name(QWEN, "main", PRODUCT)
        return self.kube.seed("configmaps", configmap_body(ConfigMapTarget(namespace, name), measured_profile()))

    def argo_syncs(self, revision: str | None = None, *, phase: str = "Succeeded", message: str = "") -> None:
        """Argo CD reports `revision` (default: the branch head) Synced, or a failed operation."""
        sync = {"status": "Synced" if phase == "Succeeded" else "OutOfSync", "revision": revision or self.head()}
        self.kube.seed("applications", {
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": APP[1], "namespace": APP[0]},
            "spec": {"source": {"repoURL": self.url, "path": "rendered", "targetRevision": "main"}},
            "status": {"sync": sync, "health": {"status": "Healthy" if phase == "Succeeded" else "Degraded"},
                       "operationState": {"phase": phase, "message": message}}})

    def worker_rolls_out(self) -> str:
        """Every rendered worker Deployment exists and is Available (as the kubelet would report); a name."""
        names = []
        for deployment in self.rendered("Deployment"):
            live = copying.deepcopy(deployment)
            live["status"] = {"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1, "availableReplicas": 1,
                              "conditions": [{"type": "Available", "status": "True"}]}
            self.kube.seed("deployments", live)
            names.append(live["metadata"]["name"])
        return names[0]

    def verdicts_configmap(self) -> tuple[str, str]:
        """(namespace, name) where the one rendered worker publishes its verdicts (its worker.yaml says)."""
        sources = set()
        for path, text in self.files().items():
            if path.startswith("rendered/") and path.endswith(".yaml"):
                doc = yaml.safe_load(text)
                config = (doc.get("data") or {}).get(WORKER_CONFIG_DATA_KEY) if doc.get("kind") == "ConfigMap" else None
                if config:
                    where = yaml.safe_load(config)["verdicts"]["configMap"]
                    sources.add((where["namespace"], where["name"]))
        [source] = sources
        return source

    def worker_reports(self, *verdicts: Verdict, slot: str = SLOT, namespace: str | None = None,
                       data: str | None = None) -> None:
        """The worker's verdict ConfigMap with `verdicts` for `slot`; in another `namespace` (a forgery)
        when given; `data` replaces the document (a broken one)."""
        home, name = self.verdicts_configmap()
        self.kube.seed("configmaps", {
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace or home, "labels": {LABEL: "true"}},
            "data": {DATA_KEY: data if data is not None else render_document(slot, list(verdicts))}})

    def profiler_fails(self, message: str) -> str:
        """The rendered profiler Job exists and Failed; its pod's termination message is `message`."""
        job = copying.deepcopy(self.rendered("Job")[0])
        meta = job["metadata"]
        job["status"] = {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}
        self.kube.seed("jobs", job)
        self.kube.seed("pods", {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{meta['name']}-x1", "namespace": meta["namespace"],
                         "labels": {"job-name": meta["name"]}},
            "spec": {"containers": [{"name": "profiler", "image": "profiler"}]},
            "status": {"containerStatuses": [{"name": "profiler", "image": "profiler", "imageID": "", "ready": False,
                                              "restartCount": 0, "state": {"terminated": {
                                                  "exitCode": 1, "message": message}}}]}})
        return meta["name"]
