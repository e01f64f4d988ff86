"""Node pools: gpus.yaml's `pools:` -> Pool values, and which of the cluster's Nodes belong to a pool.

Owns the checks a pool must pass beyond its schema (`pool_from`: a GPU memory it can be planned with,
minNodes at most maxNodes, a selector that is a Kubernetes label; `check_pools`: a selector no other pool uses, a
name unique among the pools whose node names no fixed node takes) and `split_pool_nodes`, cluster mode's rule
that a Node carrying a pool's selector label is that pool's node, never a fixed one. Pure: the first two are
called by controller.inputs.load.parse_gpu_inventory after the schema check (it reads the quantities),
`split_pool_nodes` with the slots and labels the API server gave (controller.passes.reconcile.run_pass).
"""
from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

from contract.gpu_catalog import CATALOG
from controller.inputs.kube_rules import labels
from controller.types import POOL_NODE_PREFIX, GpuSlot, InputError, Pool

def check_pools(found: Sequence[tuple[str, Pool]], file: str, document: int | None,
                node_names: Iterable[str] = ()) -> tuple[tuple[Pool, ...], list[InputError]]:
    """The pools of `found` ((path, Pool) of each pool of a document that parsed) that may be planned, and one
    InputError per problem: two pools with one name or one selector are an error on each, and neither is
    planned; a pool whose node names (pool-<name>-<k>) a fixed node of `node_names` takes is not planned."""
    errors: list[InputError] = []
    kept = _unique(list(found), lambda p: p.name, "DuplicatePool", "name", file, document, errors,
                   "pool {value!r} is also defined at {others}; neither is planned",
                   "give each pool its own name")
    kept = _unique(kept, lambda p: p.selector, "DuplicatePoolSelector", "selector", file, document, errors,
                   "pool selector {value[0]}={value[1]!r} is also the selector of {others}: a node carrying it "
                   "would belong to both, so neither pool is planned",
                   "give each pool the label its own nodes carry (e.g. karpenter.sh/nodepool: <its NodePool>)")
    taken = _taken_node_names([p for _, p in kept], node_names)
    out = []
    for path, pool in kept:
        if pool.name in taken:
            errors.append(InputError(file, document, f"{path}.name", reason="PoolNodeNameTaken", message=(
                f"the planner names the nodes of pool {pool.name!r} {POOL_NODE_PREFIX}{pool.name}-<k>, and node "
                f"{taken[pool.name]!r} already has such a name; the pool is not planned"),
                fix="rename the pool (or the node) so that no node is named like a pool's node"))
            continue
        out.append(pool)
    return tuple(sorted(out, key=lambda p: p.name)), errors


def pool_from(item: dict, path: str, memory: int | None, reserved: int | None, host: int | None
                 ) -> tuple[Pool | None, tuple | None]:
    """One schema-valid pool item, its quantities already read (None: not a quantity), as a Pool, or (path,
    message, fix, reason) of what is wrong with it."""
    product = item["product"]
    if "memory" not in item:
        spec = CATALOG.get(product)
        if spec is None:
            return None, (f"{path}.memory", f"pool {item['name']!r} has no memory, and the GPU catalog has no "
                          f"figure for product {product!r} (known: {', '.join(sorted(CATALOG))})",
                          f"set {path}.memory to one GPU's memory (nvidia.com/gpu.memory is in MiB, so write e.g. "
                          "23034Mi)", "PoolMemoryUnknown")
        memory = spec.memory_bytes
    if reserved is not None and memory is not None and reserved >= memory:
        return None, (f"{path}.reserved", f"reserved ({reserved} bytes) leaves nothing of memory ({memory} bytes)",
                      "lower reserved, or check memory (nvidia.com/gpu.memory is in MiB)", "InvalidQuantity")
    least, most = item.get("minNodes", 0), item["maxNodes"]
    if most < least:
        return None, (f"{path}.maxNodes", f"pool {item['name']!r} has maxNodes {most} below minNodes {least}",
                      f"raise {path}.maxNodes to at least {least}, or lower minNodes", "InvalidPoolSize")
    (key, value), = item["selector"].items()
    problems = labels({key: value}, f"{path}.selector")
    if problems:
        return None, (f"{path}.selector", f"{path}.selector {key}={value!r} is no Kubernetes label: "
                      f"{problems[0].message}",
                      "write the label the pool's nodes carry, e.g. karpenter.sh/nodepool: l4", "InvalidSelector")
    return Pool(name=item["name"], product=product, memory_bytes=memory, gpus_per_node=item["gpusPerNode"],
                host_memory_bytes=host, min_nodes=least, max_nodes=most, selector=(key, value),
                reserved_bytes=reserved), None


def _unique(found: list[tuple[str, Pool]], key, reason: str, field: str, file: str, document: int | None,
            errors: list[InputError], message: str, fix: str) -> list[tuple[str, Pool]]:
    groups: dict = defaultdict(list)
    for path, pool in found:
        groups[key(pool)].append(path)
    for value, paths in groups.items():
        if len(paths) > 1:
            errors.extend(InputError(file, document, f"{path}.{field}", reason=reason, fix=fix, message=message.format(
                value=value, others=", ".join(p for p in paths if p != path))) for path in paths)
    return [(path, pool) for path, pool in found if len(groups[key(pool)]) == 1]


def _taken_node_names(pools: Iterable[Pool], node_names: Iterable[str]) -> dict[str, str]:
    """pool name -> a fixed node named like one of its nodes (pool-<name>-<digits>)."""
    by_name = {p.name: re.compile(rf"^{re.escape(POOL_NODE_PREFIX + p.name)}-[0-9]+$") for p in pools}
    taken: dict[str, str] = {}
    for node in sorted(set(node_names)):
        for name, pattern in by_name.items():
            if pattern.match(node):
                taken.setdefault(name, node)
    return taken


def split_pool_nodes(slots: Sequence[GpuSlot], node_labels: Mapping[str, Mapping[str, str]],
                     pools: Sequence[Pool]) -> tuple[tuple[GpuSlot, ...], tuple[Pool, ...], tuple[tuple[str, int], ...],
                                                     list[InputError]]:
    """Cluster mode: (the fixed nodes' slots, the pools planned, how many nodes each has now, the problems). A Node
    whose labels carry a pool's selector is that pool's node: it is planned under the pool's names
    (pool-<name>-<k>, from the pool's own figures, so a plan does not change when a node arrives), never as a
    fixed node. A pool node whose GPU Feature Discovery labels disagree with its pool (another product, less
    memory, fewer GPUs) is reported: the pool's entry in gpus.yaml is what its workers are planned with. A pool
    whose node names a fixed Node takes is reported and not planned (two nodes of one name)."""
    by_selector = {p.selector: p for p in pools}
    counts = dict.fromkeys((p.name for p in pools), 0)
    fixed, errors = [], []
    on_node: dict[str, list[GpuSlot]] = defaultdict(list)
    for slot in slots:
        on_node[slot.node].append(slot)
    for node in sorted(on_node):
        mine = on_node[node]
        pool = next((by_selector[item] for item in sorted((node_labels.get(node) or {}).items())
                     if item in by_selector), None)
        if pool is None:
            fixed.extend(mine)
            continue
        counts[pool.name] += 1
        problem = _disagrees(pool, mine)
        if problem:
            errors.append(InputError(f"Node/{node}", None, "metadata.labels", reason="PoolNodeMismatch",
                                     object=f"Node/{node}", message=f"node {node} carries {pool.selector[0]}="
                                     f"{pool.selector[1]} (pool {pool.name}) but {problem}; its workers are planned "
                                     "with the pool's figures",
                                     fix=f"correct pool {pool.name!r} in gpus.yaml (product, memory, gpusPerNode) "
                                         "to what its nodes have"))
    taken = _taken_node_names(pools, (s.node for s in fixed))
    errors += [InputError(f"Node/{node}", None, "metadata.name", reason="PoolNodeNameTaken", object=f"Node/{node}",
                          message=f"the planner names the nodes of pool {name!r} {POOL_NODE_PREFIX}{name}-<k>, and "
                                  f"node {node} has such a name; the pool is not planned",
                          fix="rename the pool in gpus.yaml") for name, node in sorted(taken.items())]
    kept = tuple(p for p in pools if p.name not in taken)
    return tuple(fixed), kept, tuple(sorted((n, c) for n, c in counts.items() if n not in taken)), errors


def _disagrees(pool: Pool, slots: Sequence[GpuSlot]) -> str | None:
    first = slots[0]
    if first.product != pool.product:
        return f"its GPUs are {first.product}, not {pool.product}"
    if first.memory_bytes < pool.memory_bytes:
        return f"its GPUs have {first.memory_bytes} bytes, less than the pool's {pool.memory_bytes}"
    if len(slots) < pool.gpus_per_node:
        return f"it has {len(slots)} GPU(s), not {pool.gpus_per_node}"
    return None
