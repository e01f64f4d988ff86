"""Giving GPUs back (controller.planning.consolidate) and the bill it is judged by (controller.planning.bill).

Table cases: the disruption bound, held models (inside a right-sizing upsize window, breaching an SLO), fixed
nodes and minNodes never given back, no model made to stream or swap; a proposal is a fixed point of the next
plan; the bill per product, pool and namespace (Kubecost-style idle), its PLAN.md line; the cluster loop's
/metrics; pool workers rendered (a composition that requests no GPU is refused) and cluster mode's pool nodes.
"""
from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from controller.cli.metrics import ControllerMetrics
from controller.inputs.reader import read_repo
from controller.passes.measured import ClusterFacts
from controller.passes.reconcile import plan_bill, run_pass
from controller.planning.bill import IDLE, bill, capacity_doc, change_line, namespace_costs
from controller.planning.consolidate import consolidate, held_models
from controller.planning.plan import plan
from controller.policy import Rightsizing
from controller.types import GpuSlot
from tests.conftest import REPO_ROOT
from tests.factories import PRODUCT, toy_slot
from tests.test_plan_pools import inputs, models, nodes_used, pool

CAPACITY = REPO_ROOT / "examples" / "capacity"


def fragmented(n: int = 6, *, fixed=(), least: int = 0, budget: int = 5000):
    """n models of 2,100 bytes, one per node of a pool of 4,500-byte single-GPU nodes (as if each came alone)."""
    data = inputs(models(n, budget=budget), fixed, [pool(memory=4500, gpus=1, least=least, most=n + 2)])
    first = plan(data, method="greedy")
    spread = {d.key: replace(d, slot=f"pool-small-{i}/gpu0", pool="small") for i, d in enumerate(first.decisions)}
    return data, plan(data, spread, method="greedy")


def test_a_fragmented_pool_gives_nodes_back_and_the_next_plan_keeps_the_proposal():
    data, current = fragmented()
    assert len(nodes_used(current)) == 6
    proposal = consolidate(data, current, max_moves=10)
    assert proposal.changed and len(nodes_used(proposal.plan)) == 3 and proposal.freed_gpus == 3
    assert len(proposal.moves) == 3 and all(m.after.mode == "resident" for m in proposal.moves)
    assert plan(data, {d.key: d for d in proposal.plan.decisions}, method="greedy") == proposal.plan


@pytest.mark.parametrize("bound", [1, 2, 3])
def test_a_proposal_moves_no_more_models_than_the_bound(bound):
    data, current = fragmented()
    proposal = consolidate(data, current, max_moves=bound)
    assert len(proposal.moves) == bound and len(proposal.freed_nodes) == bound
    assert any("exceed the bound" in why for _, why in proposal.kept)


def test_a_held_model_never_moves_and_its_node_stays():
    data, current = fragmented(2)
    target = next(d for d in current.decisions if d.slot.startswith("pool-small-0/"))
    proposal = consolidate(data, current, held={target.key: "it is inside its right-sizing upsize window"})
    after = {d.key: d for d in proposal.plan.decisions}
    assert after[target.key].slot == target.slot
    assert ("pool-small-0", f"llm/{target.name} is held: it is inside its right-sizing upsize window") in proposal.kept


def test_fixed_nodes_are_never_emptied_and_min_nodes_never_given_back():
    fixed = [toy_slot("fixed-a", 4500)]
    data, current = fragmented(4, fixed=fixed, least=2)
    proposal = consolidate(data, current, max_moves=10)
    assert all(not n.startswith("fixed") for n in proposal.freed_nodes)
    assert not {"pool-small-0", "pool-small-1"} & set(proposal.freed_nodes)
    assert all(d.slot != "fixed-a/gpu0" for m in proposal.moves for d in (m.before,))  # fixed models never moved


def test_a_model_that_would_have_to_stream_keeps_its_node():
    # two 2,100-byte models on 3,500-byte GPUs: one would stream beside the other, so nothing is given back
    data = inputs(models(2), [], [pool(memory=3500, gpus=1, most=4)])
    current = plan(data, method="greedy")
    assert len(nodes_used(current)) == 2
    proposal = consolidate(data, current)
    assert not proposal.changed and any("would run elastic" in why for _, why in proposal.kept)


def test_held_models_are_those_missing_their_slo_or_inside_their_upsize_window():
    data, current = fragmented(3)
    keys = sorted(d.key for d in current.decisions)
    decisions = {d.key: replace(d, slo_met=None) for d in current.decisions}  # no SLO ...
    decisions[keys[0]] = replace(decisions[keys[0]], slo_met=False)  # ... but for one that misses it
    now = 1_800_000_000.0
    recent = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - 30))
    old = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - 3600))
    on = Rightsizing(policy="Auto", upsize_after_s=60)
    fleet = {m.key: m for m in data.models}
    fleet[keys[1]] = replace(fleet[keys[1]], rightsizing=on, rightsizing_recommendation={"direction": "up", "at": recent})
    fleet[keys[2]] = replace(fleet[keys[2]], rightsizing=on, rightsizing_recommendation={"direction": "up", "at": old})
    held = held_models(fleet, decisions, now)
    assert held == {keys[0]: "it is predicted to miss its SLO",
                    keys[1]: "it is inside its right-sizing upsize window (upsizeAfter 60 s)"}
    needs = replace(fleet[keys[2]], rightsizing_conditions=({"type": "NeedsCapacity", "status": "True"},))
    assert held_models({**fleet, keys[2]: needs}, decisions, now)[keys[2]] == "right-sizing says it needs capacity"


def test_the_bill_counts_a_node_whole_and_splits_each_gpu_by_namespace_with_idle():
    p = pool(memory=4000, gpus=2, most=3)
    fleet = [replace(m, namespace=ns) for m, ns in zip(models(3), ("team-a", "team-a", "team-b"))]
    data = inputs(fleet, [toy_slot("fixed-a", 2500)], [p], prices=((PRODUCT, 2.0),))
    result = plan(data, method="greedy")
    assert len(nodes_used(result)) == 1  # the fixed GPU holds one model; the others open one two-GPU node
    now = bill(result.decisions, data.slots, data.pools, dict(data.prices))
    (product,) = now.products
    assert (product.gpus_used, product.gpus_idle, product.cost_per_month) == (3, 0, 3 * 2.0 * 730)
    assert now.pools[0].nodes == 1 and now.pools[0].gpus == 2 and now.cost_per_month == 4380.0
    slots = (*data.slots, *result.pool_slots)
    shares = namespace_costs(result.decisions, slots, dict(data.prices))
    assert round(sum(g for g, _ in shares.values()), 6) == 3.0  # every kept GPU, split, adds up
    assert round(sum(c for _, c in shares.values()), 6) == 6.0  # 3 GPUs at 2.0 per hour
    usable = {s.id: s.usable_bytes for s in slots}
    share = {ns: sum(d.footprint_bytes / usable[d.slot] for d in result.decisions if d.namespace == ns)
             for ns in ("team-a", "team-b")}
    assert shares[(PRODUCT, "team-a")][0] == pytest.approx(share["team-a"])
    assert shares[(PRODUCT, "team-b")][1] == pytest.approx(share["team-b"] * 2.0)
    assert shares[(PRODUCT, IDLE)][0] == pytest.approx(3 - share["team-a"] - share["team-b"])


def test_the_bill_line_says_before_and_after_and_what_is_unpriced():
    p = pool(memory=4000, gpus=1)
    one, two = (bill(plan(inputs(models(n), [], [p])).decisions, [], [p], {PRODUCT: 1.0}) for n in (1, 2))
    assert change_line(one, two) == f"1 → 2 GPUs ({PRODUCT} 1 → 2; pool small 1 → 2 nodes) · 730.00 → 1,460.00 per month"
    unpriced = bill((), [toy_slot()], [], {})
    assert change_line(unpriced, unpriced) == ("1 GPU · cost not known (gpus.yaml has no pricePerGpuHour for every "
                                               "product)")


def test_the_controllers_metrics_export_the_bill_by_product_and_namespace():
    metrics = ControllerMetrics()
    metrics.fleet({"NVIDIA-L4": 3}, {("NVIDIA-L4", "team-a"): (1.25, 1.0), ("NVIDIA-L4", IDLE): (1.75, 1.4)},
                  {"l4": 3})
    text = metrics.exposition().decode()
    assert 'gpushare_fleet_gpus{product="NVIDIA-L4"} 3.0' in text
    assert 'gpushare_fleet_gpus_used{namespace="team-a",product="NVIDIA-L4"} 1.25' in text
    assert 'gpushare_fleet_cost_per_hour{namespace="__idle__",product="NVIDIA-L4"} 1.4' in text
    assert 'gpushare_pool_nodes{pool="l4"} 3.0' in text
    metrics.fleet({}, {}, {})  # a product the plan no longer has leaves no stale series
    assert 'product="NVIDIA-L4"' not in metrics.exposition().decode()


def test_a_kai_model_on_a_pool_is_refused_at_render_for_requesting_no_gpu(tmp_path):
    repo = tmp_path / "repo"
    for p in CAPACITY.rglob("*"):
        if p.is_file():
            (repo / p.relative_to(CAPACITY)).parent.mkdir(parents=True, exist_ok=True)
            (repo / p.relative_to(CAPACITY)).write_bytes(p.read_bytes())
    chat = repo / "models" / "team-a" / "chat.yaml"
    doc = yaml.safe_load(chat.read_text())
    doc["spec"]["compositionRef"] = {"name": "kai"}
    doc["metadata"]["name"] = "kai-chat"
    (repo / "models" / "team-a" / "kai.yaml").write_text(yaml.safe_dump(doc))
    output = run_pass(read_repo(repo))
    [error] = [e for e in output.rendered.errors if e.ref == "team-a/kai-chat"]
    assert error.reason == "PoolWorkerWithoutGpu" and "nvidia.com/gpu" in error.message


def test_cluster_mode_plans_a_pools_labelled_nodes_as_the_pool_and_uses_an_idle_one_first():
    tree = read_repo(CAPACITY)
    l4 = tree.pools[0]
    nodes = [GpuSlot(node=f"ip-10-0-0-{i}", index=0, product="NVIDIA-L4", memory_bytes=l4.memory_bytes)
             for i in range(2)]
    labels = {s.node: {"karpenter.sh/nodepool": "l4"} for s in nodes}
    output = run_pass(tree, ClusterFacts(slots=tuple(nodes), profiles=(), node_labels=labels))
    assert output.inputs.slots == ()  # no fixed node: both are the pool's
    assert output.inputs.pool_nodes == (("l4", 2),)
    used = {d.slot.split("/")[0] for d in output.plan.decisions}
    assert {"pool-l4-0", "pool-l4-1"} <= used  # the nodes that exist are filled before a node is added
    plan_md = output.files["rendered/PLAN.md"].decode()
    assert f"| l4 | NVIDIA-L4 | {len(used)} (min 0, max 8) | {len(used)} | " in plan_md
    assert [p["existingNodes"] for p in capacity_doc(plan_bill(output.inputs, output.plan.decisions))["pools"]] == [2]


def test_a_profiler_job_for_a_product_only_a_pool_has_selects_the_pool(tmp_path):
    repo = tmp_path / "repo"
    (repo / "models").mkdir(parents=True)
    (repo / "gpus.yaml").write_text((CAPACITY / "gpus.yaml").read_text())
    (repo / "models" / "m.yaml").write_text(yaml.safe_dump({
        "apiVersion": "gpushare.dev/v1alpha1", "kind": "ElasticModel", "metadata": {"name": "m", "namespace": "x"},
        "spec": {"model": "Qwen/Qwen2.5-0.5B-Instruct", "memoryBudget": "4Gi", "gpu": {"product": "NVIDIA-L4"}}}))
    output = run_pass(read_repo(repo))
    [job] = [yaml.safe_load(t) for p, t in output.rendered.files.items() if Path(p).name.startswith("job-")]
    assert job["spec"]["template"]["spec"]["nodeSelector"] == {"karpenter.sh/nodepool": "l4"}
