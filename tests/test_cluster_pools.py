"""Cluster mode with a node pool: the official client against the API server double, a real git remote.

A model no GPU node has room for is placed on a pool node that does not exist yet and is AwaitingNode
(Progressing); when Karpenter's node arrives (a Node carrying the pool's label) the plan does not move and the
model turns Ready; /metrics carries the fleet's GPUs and cost; the leader's periodic consolidation proposal
lands on its review branch only when pool GPUs can be given back.
"""
from __future__ import annotations

import pytest
import yaml

from contract.verdicts import Verdict, render_document
from contract.wire import VERDICTS_DATA_KEY, VERDICTS_LABEL, WORKER_CONFIG_DATA_KEY
from controller.cli.consolidate import CONSOLIDATION_BRANCH, ConsolidationSchedule
from tests.cluster_loop_support import NODE, PRODUCT, REPO, World, model_doc
from tests.gitserver import git_server  # noqa: F401  (the fixture)
from tests.kubedouble import kube  # noqa: F401  (the fixture)

pytestmark = pytest.mark.integration

GPUS = f"""apiVersion: gpushare.dev/v1alpha1
kind: GPUInventory
pricePerGpuHour:
  {PRODUCT}: 0.8
nodes: []
pools:
  - name: l4
    product: {PRODUCT}
    gpusPerNode: 1
    maxNodes: 3
    selector:
      karpenter.sh/nodepool: l4
"""
# 131,072 tokens × 8 sequences of KV: 12 GiB, so one such model fills most of an L4 and two need two GPUs
BIG = {"slo": {"contextTokens": 131072, "concurrency": 8, "ttftMs": 2000}, "gpu": {"product": PRODUCT}}  # no swap


@pytest.fixture
def world(kube, git_server, tmp_path) -> World:  # noqa: F811
    return World(kube, git_server, tmp_path)


def test_a_model_waits_for_its_pool_node_then_is_ready_and_the_plan_never_moves(world):
    world.setup([model_doc("one", budget="20Gi", **BIG), model_doc("two", budget="20Gi", **BIG)],
                estimated_profile=True)
    world.server.push_files(REPO, {"gpus.yaml": GPUS.encode()}, "gpus: an L4 pool")
    schedule = ConsolidationSchedule(3600, 5, clock=world.clock)
    controller = world.reconciler(consolidation=schedule)
    first = controller.reconcile_once()
    assert first.ok and first.published.changed
    assigned = {n: yaml.safe_load(world.files()[f"decisions/llm/{n}.yaml"])["status"]["assigned"]
                for n in ("one", "two")}
    assert {n: a["gpu"]["slot"].split("/")[0] for n, a in assigned.items()} == {"one": NODE, "two": "pool-l4-0"}, assigned
    assert assigned["two"]["gpu"]["pool"] == "l4"
    pool_worker = [d for d in world.rendered("Deployment") if "pool-l4-0" in d["metadata"]["name"]]
    assert pool_worker[0]["spec"]["template"]["spec"]["nodeSelector"] == {"karpenter.sh/nodepool": "l4"}
    world.argo_syncs()
    assert controller.reconcile_once().ok
    ready = world.conditions("two")["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "AwaitingNode")
    assert world.conditions("two")["Degraded"]["status"] == "False"  # Progressing, not Degraded
    exposition = controller.metrics.exposition().decode()
    assert f'gpushare_fleet_gpus{{product="{PRODUCT}"}} 2.0' in exposition  # the fixed L4 and the new node's
    assert 'gpushare_pool_nodes{pool="l4"} 1.0' in exposition
    assert f'gpushare_fleet_cost_per_hour{{namespace="llm",product="{PRODUCT}"}}' in exposition
    assert CONSOLIDATION_BRANCH not in world.server.files(REPO)  # nothing to give back: no proposal branch
    assert world.server.head(REPO, CONSOLIDATION_BRANCH) is None

    # Karpenter's node arrives: GPU Feature Discovery labels it, and it carries the pool's label
    world.kube.seed("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "ip-10-0-3-7", "labels": {
        "nvidia.com/gpu.product": PRODUCT, "nvidia.com/gpu.memory": "23034", "nvidia.com/gpu.count": "1",
        "karpenter.sh/nodepool": "l4"}}})
    world.worker_rolls_out()
    world.argo_syncs()
    for config in world.rendered("ConfigMap"):  # each worker reports its verdicts where its worker.yaml says
        worker = yaml.safe_load((config.get("data") or {}).get(WORKER_CONFIG_DATA_KEY) or "null")
        if worker:
            where = worker["verdicts"]["configMap"]
            verdicts = [Verdict(m["name"], m["namespace"], "resident", "applied", "Fits", "loaded", 14 << 30,
                                20 << 30, 0) for m in worker["models"]]
            world.kube.seed("configmaps", {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
                "name": where["name"], "namespace": where["namespace"], "labels": {VERDICTS_LABEL: "true"}},
                "data": {VERDICTS_DATA_KEY: render_document(worker["slot"]["id"], verdicts)}})
    third = controller.reconcile_once()
    assert third.ok and not third.published.changed  # the node arriving moves nothing
    assert world.conditions("two")["Ready"]["status"] == "True"
    assert 'gpushare_pool_nodes{pool="l4"} 1.0' in controller.metrics.exposition().decode()
