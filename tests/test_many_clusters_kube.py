"""One cluster's controller in cluster mode (`reconcile --kube --cluster NAME`): the official client over HTTP
against two API server doubles (the workload cluster, and the hub where Argo CD's Applications live) and a real
git remote holding two clusters.

The eu-1 controller reads eu-1's GPU nodes, plans the models placed on eu-1, writes eu-1's paths only (its
measured profiles under profiles/measured/eu-1/), reads the Application the ApplicationSet names for it
(argocd/gpushare-eu-1, on the hub) and never us-1's, and marks its ElasticModel Ready from it.
"""
from __future__ import annotations

import pytest
import yaml

from controller.cli.cluster_loop import ClusterReconciler
from controller.cli.common import controller_copy
from controller.inputs.layout import Layout
from controller.kube.cluster import Cluster
from controller.kube.leader import LeaderElection
from tests.cluster_loop_support import ESTIMATED, PRODUCT, QWEN, World, model_doc
from tests.gitserver import git_server  # noqa: F401  (the fixture)
from tests.kubedouble import kube, serve  # noqa: F401  (the fixture)
from contract.verdicts import Verdict

pytestmark = pytest.mark.integration

REPO = "fleet.git"
EU = Layout("eu-1")


def _inventory(region: str) -> bytes:
    return yaml.safe_dump({"apiVersion": "gpushare.dev/v1alpha1", "kind": "GPUInventory",
                           "labels": {"region": region}, "nodes": []}).encode()


@pytest.fixture
def world(kube, git_server, tmp_path):  # noqa: F811
    world = World(kube, git_server, tmp_path)
    chat, us_only = model_doc("chat"), model_doc("us-only", placement={"clusters": ["us-1"]})
    git_server.create_repo(REPO, {
        "clusters/eu-1/gpus.yaml": _inventory("eu"), "clusters/us-1/gpus.yaml": _inventory("us"),
        "models/llm/chat.yaml": yaml.safe_dump(chat).encode(), "models/llm/us-only.yaml": yaml.safe_dump(us_only).encode(),
        f"profiles/{PRODUCT}/qwen--qwen2.5-0.5b-instruct.yaml": ESTIMATED.encode()})
    kube.seed("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-1", "labels": {
        "nvidia.com/gpu.product": PRODUCT, "nvidia.com/gpu.memory": "23034", "nvidia.com/gpu.count": "1"}}})
    kube.seed("elasticmodels", chat)
    kube.seed("elasticmodels", us_only)  # left in this cluster from before its placement said us-1
    return world


def _application(name: str, path: str, revision: str | None, url: str) -> dict:
    status = {"sync": {"status": "OutOfSync"}, "health": {"status": "Progressing"}}
    if revision:
        status = {"sync": {"status": "Synced", "revision": revision}, "health": {"status": "Healthy"},
                  "operationState": {"phase": "Succeeded", "message": ""}}
    return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": name, "namespace": "argocd"},
            "spec": {"source": {"repoURL": url, "path": path, "targetRevision": "main"}}, "status": status}


def test_one_clusters_controller_plans_writes_and_reads_only_its_own(world, tmp_path):
    with serve() as hub:
        hub.seed("applications", _application("gpushare-eu-1", "rendered/eu-1", None, world.url))
        hub.seed("applications", _application("gpushare-us-1", "rendered/us-1", "0" * 40, world.url))
        election = LeaderElection(world.kube.api_client, namespace="gpushare-system", identity="eu-a",
                                  clock=world.clock)
        controller = ClusterReconciler(Cluster(world.kube.api_client, sleep=world.waits.append),
                                       controller_copy(world.url, "main", tmp_path / "eu", layout=EU), election,
                                       layout=EU, argocd=Cluster(hub.api_client), clock=world.clock,
                                       sleep=world.waits.append, jitter=lambda low, high: high, renew_every_s=3600.0)
        assert controller.applications == (("argocd", "gpushare-eu-1"),)
        first = controller.reconcile_once()
        assert first.ok and first.published.changed
        files = world.files()
        touched = {p for p in files if p.startswith(("rendered/", "decisions/", "profiles/measured/"))}
        assert touched and all(p.startswith(EU.cluster_generated) for p in touched)
        assert "rendered/eu-1/llm/elasticmodel-chat.yaml" in files
        assert not any("us-only" in p for p in files if p.startswith(("rendered/", "decisions/")))

        world.publish_profile()
        second = controller.reconcile_once()
        assert second.ok and second.published.changed
        measured = f"profiles/measured/eu-1/{PRODUCT}/qwen--qwen2.5-0.5b-instruct.yaml"
        assert yaml.safe_load(world.files()[measured])["source"] == "measured"
        assert second.published.message.startswith("gpushare(eu-1): ")

        world.worker_rolls_out()
        world.worker_reports(Verdict("chat", "llm", "resident", "applied", "Fits", "loaded", 1 << 30, 20 << 30, 0))
        hub.seed("applications", _application("gpushare-eu-1", "rendered/eu-1", world.head(), world.url))
        third = controller.reconcile_once()
        assert third.ok
        conditions = world.conditions()
        assert conditions["Ready"]["status"] == "True", conditions
        assert "gpushare-eu-1" in conditions["Synced"]["message"]
        assert "gpushare-us-1" not in str(conditions)
        assert world.kube.get("argoproj.io/v1alpha1", "applications", "argocd", "gpushare-eu-1") is None, (
            "the Applications are read on the hub, not in the workload cluster")
        assert world.status()["assigned"]["model"] == QWEN
        degraded = world.conditions("us-only")["Degraded"]
        assert (degraded["status"], degraded["reason"]) == ("True", "NotInGit"), "an object git does not place here"
        assert "places no model of that name on eu-1" in degraded["message"]
