"""gpus.yaml `pools:`: parsed into Pools, every contradiction a clear error at its path; cluster mode's pool nodes.

Through controller.inputs.load.parse_gpu_inventory (the pure parser of one document), `gpushare validate` on a
repository (the pass a reconcile runs) and controller.inputs.pools.split_pool_nodes (a Node carrying a pool's
label is that pool's node).
"""
from __future__ import annotations

import pytest
import yaml

from contract.gpu_catalog import CATALOG
from controller.cli.commands import main
from controller.inputs.load import parse_gpu_inventory
from controller.inputs.pools import split_pool_nodes
from controller.types import GpuSlot

L4 = {"name": "l4", "product": "NVIDIA-L4", "gpusPerNode": 1, "maxNodes": 3,
      "selector": {"karpenter.sh/nodepool": "l4"}}
NODE = {"name": "gpu-node-1", "product": "NVIDIA-H200", "memory": "143771Mi"}


def inventory(*pools, nodes=(NODE,)) -> dict:
    return {"apiVersion": "gpushare.dev/v1alpha1", "kind": "GPUInventory", "nodes": list(nodes), "pools": list(pools)}


CASES = [
    ("catalog-memory-and-defaults", inventory(L4), ["l4"], []),
    ("memory-given-for-an-unknown-product",
     inventory({**L4, "product": "NVIDIA-X1", "memory": "40Gi"}), ["l4"], []),
    ("unknown-product-without-memory", inventory({**L4, "product": "NVIDIA-X1"}), [],
     [("pools[0].memory", "PoolMemoryUnknown")]),
    ("max-nodes-below-min-nodes", inventory({**L4, "minNodes": 4}), [], [("pools[0].maxNodes", "InvalidPoolSize")]),
    ("negative-max-nodes", inventory({**L4, "maxNodes": -1}), [], [("pools[0].maxNodes", "InvalidSpec")]),
    ("negative-min-nodes", inventory({**L4, "minNodes": -2}), [], [("pools[0].minNodes", "InvalidSpec")]),
    ("zero-gpus-per-node", inventory({**L4, "gpusPerNode": 0}), [], [("pools[0].gpusPerNode", "InvalidSpec")]),
    ("two-pools-one-selector", inventory(L4, {**L4, "name": "l4-spot"}), [],
     [("pools[0].selector", "DuplicatePoolSelector"), ("pools[1].selector", "DuplicatePoolSelector")]),
    ("two-pools-one-name", inventory(L4, {**L4, "selector": {"karpenter.sh/nodepool": "other"}}), [],
     [("pools[0].name", "DuplicatePool"), ("pools[1].name", "DuplicatePool")]),
    ("a-fixed-node-named-like-a-pool-node", inventory(L4, nodes=(NODE, {**NODE, "name": "pool-l4-0"})), [],
     [("pools[0].name", "PoolNodeNameTaken")]),
    ("selector-key-not-a-label", inventory({**L4, "selector": {"not a/label/key": "l4"}}), [],
     [("pools[0].selector", "InvalidSelector")]),
    ("selector-value-not-a-label", inventory({**L4, "selector": {"karpenter.sh/nodepool": "l4 spot"}}), [],
     [("pools[0].selector", "InvalidSelector")]),
    ("two-labels-in-the-selector", inventory({**L4, "selector": {"a": "1", "b": "2"}}), [],
     [("pools[0].selector", "InvalidSpec")]),
    ("reserved-above-memory", inventory({**L4, "memory": "1Gi", "reserved": "2Gi"}), [],
     [("pools[0].reserved", "InvalidQuantity")]),
    ("host-memory-not-a-quantity", inventory({**L4, "hostMemory": "plenty"}), [],
     [("pools[0].hostMemory", "InvalidQuantity")]),
    ("missing-selector", inventory({k: v for k, v in L4.items() if k != "selector"}), [],
     [("pools[0].selector", "MissingField")]),
    ("unknown-field", inventory({**L4, "maxNode": 3}), [], [("pools[0].maxNode", "UnknownField")]),
    ("a-bad-pool-leaves-the-good-one", inventory({**L4, "minNodes": 9}, {**L4, "name": "big", "selector": {
        "karpenter.sh/nodepool": "big"}}), ["big"], [("pools[0].maxNodes", "InvalidPoolSize")]),
]


@pytest.mark.parametrize("doc,pools,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_pools(doc, pools, expected):
    inventory_, errors = parse_gpu_inventory(doc, "gpus.yaml")
    assert [p.name for p in inventory_.pools] == pools
    assert [(e.path, e.reason) for e in errors] == expected
    assert [s.id for s in inventory_.slots] == [f"{n['name']}/gpu0" for n in doc["nodes"]]  # nodes unaffected
    assert all(e.message and e.fix for e in errors)


def test_a_pool_takes_the_catalogs_memory_unless_it_gives_its_own():
    (pool,), = [parse_gpu_inventory(inventory(L4), "gpus.yaml")[0].pools]
    assert (pool.memory_bytes, pool.reserved_bytes, pool.min_nodes, pool.max_nodes, pool.selector, pool.gpus_per_node) \
        == (CATALOG["NVIDIA-L4"].memory_bytes, 1 << 30, 0, 3, ("karpenter.sh/nodepool", "l4"), 1)
    (own,), = [parse_gpu_inventory(inventory({**L4, "memory": "20Gi", "hostMemory": "64Gi"}), "gpus.yaml")[0].pools]
    assert (own.memory_bytes, own.host_memory_bytes) == (20 << 30, 64 << 30)
    assert [s.id for s in own.slots(2)] == ["pool-l4-2/gpu0"]


def test_validate_reports_a_pool_error_with_its_path_and_exits_1(tmp_path, capsys):
    (tmp_path / "models").mkdir()
    (tmp_path / "gpus.yaml").write_text(yaml.safe_dump(inventory({**L4, "minNodes": 5})))
    assert main(["validate", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "gpus.yaml" in out and "pools[0].maxNodes" in out and "InvalidPoolSize" in out
    assert "raise pools[0].maxNodes to at least 5" in out


def slot(node: str, product: str = "NVIDIA-L4", memory: int = CATALOG["NVIDIA-L4"].memory_bytes, index: int = 0):
    return GpuSlot(node=node, index=index, product=product, memory_bytes=memory)


def test_a_node_carrying_a_pools_label_is_that_pools_node_not_a_fixed_one():
    (pool,) = parse_gpu_inventory(inventory({**L4, "gpusPerNode": 1}), "gpus.yaml")[0].pools
    labels = {"ip-10-0-0-1": {"karpenter.sh/nodepool": "l4"}, "ip-10-0-0-2": {"karpenter.sh/nodepool": "l4"},
              "static-1": {"kubernetes.io/os": "linux"}}
    fixed, pools, counts, errors = split_pool_nodes([slot("ip-10-0-0-1"), slot("ip-10-0-0-2"), slot("static-1")],
                                                    labels, [pool])
    assert [s.node for s in fixed] == ["static-1"]
    assert pools == (pool,) and counts == (("l4", 2),) and errors == []


def test_a_pool_node_whose_labels_disagree_with_its_pool_is_reported():
    (pool,) = parse_gpu_inventory(inventory(L4), "gpus.yaml")[0].pools
    fixed, _, counts, errors = split_pool_nodes([slot("ip-1", product="Tesla-T4")],
                                                {"ip-1": {"karpenter.sh/nodepool": "l4"}}, [pool])
    assert fixed == () and counts == (("l4", 1),)
    assert [(e.file, e.reason) for e in errors] == [("Node/ip-1", "PoolNodeMismatch")]
    assert "Tesla-T4" in errors[0].message


def test_a_cluster_node_named_like_a_pool_node_keeps_that_pool_out():
    (pool,) = parse_gpu_inventory(inventory(L4), "gpus.yaml")[0].pools
    fixed, pools, counts, errors = split_pool_nodes([slot("pool-l4-1")], {}, [pool])
    assert [s.node for s in fixed] == ["pool-l4-1"] and pools == () and counts == ()
    assert [e.reason for e in errors] == ["PoolNodeNameTaken"]


def test_the_karpenter_example_matches_the_example_fleets_pool():
    """deploy/karpenter/nodepool-l4.yaml is the NodePool of examples/capacity's pool: Karpenter labels its nodes
    karpenter.sh/nodepool=<its name> (the pool's selector), its GPU limit is maxNodes x gpusPerNode, and it only
    removes empty nodes (gpushare packs and proposes giving nodes back itself)."""
    from tests.conftest import REPO_ROOT

    docs = list(yaml.safe_load_all((REPO_ROOT / "deploy" / "karpenter" / "nodepool-l4.yaml").read_text()))
    (nodepool,) = [d for d in docs if d["kind"] == "NodePool"]
    (pool,) = parse_gpu_inventory(yaml.safe_load((REPO_ROOT / "examples" / "capacity" / "gpus.yaml").read_text()),
                                  "gpus.yaml")[0].pools
    assert pool.selector == ("karpenter.sh/nodepool", nodepool["metadata"]["name"])
    assert nodepool["spec"]["limits"]["nvidia.com/gpu"] == pool.max_nodes * pool.gpus_per_node
    assert nodepool["spec"]["disruption"]["consolidationPolicy"] == "WhenEmpty"
    (node_class,) = [d for d in docs if d["kind"] == "EC2NodeClass"]
    assert nodepool["spec"]["template"]["spec"]["nodeClassRef"]["name"] == node_class["metadata"]["name"]
