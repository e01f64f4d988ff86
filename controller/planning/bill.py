"""The bill of a plan: the GPUs it keeps and what they cost, per product, per pool and per namespace.

Owns `bill` (the GPUs a set of decisions keeps: every GPU of a fixed node, every GPU of each pool node a
model is placed on and of each pool's minNodes, since a node is billed whole; costPerMonth = GPUs ×
pricePerGpuHour × 730), `change_line` (PLAN.md's "before → after" of two bills) and `namespace_costs` (each
GPU's cost per hour split across the namespaces of its models by the GPU bytes each occupies, a swap group's
area in proportion to its members' needs; what no model occupies is idle, `__idle__`, as Kubecost and
OpenCost name it). Pure. Called by the reconcile pass (PLAN.md), `gpushare plan -o json` (its `capacity`),
`gpushare consolidate` and the controller's /metrics.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from controller.planning.capacity import HOURS_PER_MONTH, kept_pool_nodes
from controller.types import Decision, GpuSlot, Pool

IDLE = "__idle__"  # the namespace of the GPU bytes no model occupies (Kubecost's and OpenCost's name)


@dataclass(frozen=True)
class ProductBill:
    product: str
    gpus_used: int  # GPUs the plan keeps (billed)
    gpus_idle: int  # of them, those no model is placed on
    price: float | None  # per GPU-hour; None: gpus.yaml gives none
    cost_per_month: float | None


@dataclass(frozen=True)
class PoolBill:
    name: str
    product: str
    nodes: int  # nodes the plan needs (its minNodes included)
    gpus: int
    min_nodes: int
    max_nodes: int
    existing_nodes: int | None  # cluster mode: the pool's nodes now; None offline
    cost_per_month: float | None


@dataclass(frozen=True)
class Bill:
    products: tuple[ProductBill, ...]
    pools: tuple[PoolBill, ...]

    @property
    def gpus(self) -> int:
        return sum(p.gpus_used for p in self.products)

    @property
    def pool_gpus(self) -> int:
        return sum(p.gpus for p in self.pools)

    @property
    def cost_per_month(self) -> float | None:
        """The whole plan's, None when a product it keeps GPUs of has no price."""
        costs = [p.cost_per_month for p in self.products if p.gpus_used]
        return None if any(c is None for c in costs) else round(sum(costs), 2)


def bill(decisions: Sequence[Decision], fixed: Sequence[GpuSlot], pools: Sequence[Pool],
         prices: Mapping[str, float], pool_nodes: Mapping[str, int] | None = None) -> Bill:
    """What `decisions` keep and cost: the fixed nodes' GPUs (`fixed`) and the pool nodes they use."""
    nodes = kept_pool_nodes(decisions, pools)
    occupied = {d.slot for d in decisions if d.mode != "refused" and d.slot}
    kept: list[str] = [s.id for s in fixed] + [s.id for p in pools for k in sorted(nodes[p.name]) for s in p.slots(k)]
    product_of = {s.id: s.product for s in fixed} | {s.id: p.product for p in pools for k in nodes[p.name]
                                                        for s in p.slots(k)}
    gpus: dict[str, int] = defaultdict(int)
    idle: dict[str, int] = defaultdict(int)
    for slot_id in kept:
        gpus[product_of[slot_id]] += 1
        idle[product_of[slot_id]] += slot_id not in occupied
    products = tuple(ProductBill(product, gpus[product], idle[product], prices.get(product),
                                 _monthly(gpus[product], prices.get(product))) for product in sorted(gpus))
    pool_bills = tuple(PoolBill(p.name, p.product, len(nodes[p.name]), len(nodes[p.name]) * p.gpus_per_node,
                                p.min_nodes, p.max_nodes, None if pool_nodes is None else pool_nodes.get(p.name, 0),
                                _monthly(len(nodes[p.name]) * p.gpus_per_node, prices.get(p.product)))
                       for p in sorted(pools, key=lambda p: p.name))
    return Bill(products, pool_bills)


def capacity_doc(now: Bill, consolidated: Bill | None = None) -> dict:
    """`gpushare plan -o json`'s `capacity` (docs/plan-json.md): per product the GPUs used, per pool its nodes
    needed, costPerMonth; consolidatedCostPerMonth only where consolidation would give GPUs back."""
    doc = {
        "products": [{"product": p.product, "gpusUsed": p.gpus_used, "gpusIdle": p.gpus_idle,
                      "pricePerGpuHour": p.price, "costPerMonth": p.cost_per_month} for p in now.products],
        "pools": [{"name": p.name, "product": p.product, "nodes": p.nodes, "gpus": p.gpus, "minNodes": p.min_nodes,
                   "maxNodes": p.max_nodes, "existingNodes": p.existing_nodes, "costPerMonth": p.cost_per_month}
                  for p in now.pools],
        "gpusUsed": now.gpus,
        "costPerMonth": now.cost_per_month,
    }
    if consolidated is not None and consolidated.gpus < now.gpus:
        doc["consolidatedGpusUsed"] = consolidated.gpus
        doc["consolidatedCostPerMonth"] = consolidated.cost_per_month
    return doc


def _monthly(gpus: int, price: float | None) -> float | None:
    return None if price is None else round(gpus * price * HOURS_PER_MONTH, 2)


def money(value: float | None) -> str:
    return "unpriced" if value is None else f"{value:,.2f}"


def change_line(before: Bill, after: Bill) -> str:
    """`6 → 4 GPUs (NVIDIA-L4 6 → 4; pool l4 5 → 3 nodes) · 3,504.00 → 2,336.00 per month`; the figures that
    did not change once."""
    parts = [f"{p.product} {_arrow(_gpus(before, p.product), p.gpus_used)}"
             for p in after.products if _gpus(before, p.product) != p.gpus_used]
    parts += [f"{p.product} {_gpus(before, p.product)} → 0" for p in before.products
              if p.gpus_used and all(a.product != p.product for a in after.products)]
    nodes = {p.name: p.nodes for p in before.pools}
    parts += [f"pool {p.name} {_arrow(nodes.get(p.name, 0), p.nodes)} node{'s' * (p.nodes != 1)}"
              for p in after.pools if nodes.get(p.name, 0) != p.nodes]
    detail = f" ({'; '.join(parts)})" if parts else ""
    if before.cost_per_month is None and after.cost_per_month is None:
        return f"{_arrow(before.gpus, after.gpus)} {_gpu_word(after.gpus)}{detail} · cost not known (gpus.yaml has no pricePerGpuHour " \
               "for every product)"
    cost = _arrow(money(before.cost_per_month), money(after.cost_per_month))
    return f"{_arrow(before.gpus, after.gpus)} {_gpu_word(after.gpus)}{detail} · {cost} per month"


def _gpu_word(count: int) -> str:
    return "GPU" if count == 1 else "GPUs"


def _gpus(b: Bill, product: str) -> int:
    return next((p.gpus_used for p in b.products if p.product == product), 0)


def _arrow(old, new) -> str:
    return f"{old}" if old == new else f"{old} → {new}"


def namespace_costs(decisions: Sequence[Decision], slots: Sequence[GpuSlot], prices: Mapping[str, float]
                    ) -> dict[tuple[str, str], tuple[float, float]]:
    """(product, namespace) -> (GPUs, cost per hour): each kept GPU split by the bytes each namespace's models
    occupy of its usable memory (resident and elastic footprints; a swap group's area in proportion to its
    members' needs), the rest `__idle__`; cost only where the product has a price (else 0)."""
    on_slot: dict[str, list[Decision]] = defaultdict(list)
    for d in decisions:
        if d.mode != "refused" and d.slot:
            on_slot[d.slot].append(d)
    out: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for slot in slots:
        usable = slot.usable_bytes or 1
        price = prices.get(slot.product, 0.0)
        shares: dict[str, float] = defaultdict(float)
        mine = on_slot.get(slot.id, [])
        swap = [d for d in mine if d.mode == "swap"]
        area = max((d.footprint_bytes for d in swap), default=0)
        needs = sum(d.need_bytes for d in swap) or 1
        for d in mine:
            shares[d.namespace] += area * d.need_bytes / needs if d.mode == "swap" else d.footprint_bytes
        shares[IDLE] += max(0.0, usable - sum(shares.values()))
        for namespace, nbytes in shares.items():
            fraction = min(1.0, nbytes / usable)
            entry = out[(slot.product, namespace)]
            entry[0] += fraction
            entry[1] += fraction * price
    return {key: (round(g, 6), round(c, 6)) for key, (g, c) in sorted(out.items())}
