"""Opening capacity: the GPUs of pool nodes that do not exist yet, for models no existing GPU can take.

Owns which pool nodes a plan treats as existing (`pool_rooms`: each pool's minNodes, the nodes the last
plan placed models on, in cluster mode as many more as the cluster has), the stage after placement on
existing GPUs that opens new ones (`open_nodes`, the greedy regime: largest model first, the nodes opened
this pass filled before another is opened, a new node from the pool with the least cost per month that can
serve the model; on a new node a model that fits whole never streams), the candidate nodes the exact solver may open (`candidates`), the models refused because
every pool that could serve them is at its maxNodes (`limit_hits`), and the pool GPUs a plan keeps
(`kept_pool_slots`). Opening never moves a placed model: only models the placement on existing GPUs refused
are offered a new node. Pure and deterministic. Called by controller.planning.plan (plan_product) and
controller.planning.plan_exact (the cost units of its objective).
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from controller.planning.greedy import place
from controller.planning.slots import Ask, NodeState, SlotState
from controller.types import Decision, GpuSlot, Pool

HOURS_PER_MONTH = 730  # the billing month of cloud price lists (8,760 hours ÷ 12)
COST_STEPS = 1000      # the exact solver weighs a node's cost in steps of 1/1000 of the dearest node's


@dataclass
class PoolRoom:
    """One pool during a plan: the nodes it has (`open`, planned as existing capacity) and those that may be
    opened (`free`, ascending; the planner takes the lowest first)."""

    pool: Pool
    open: tuple[int, ...]
    free: list[int] = field(default_factory=list)
    price: float | None = None  # per GPU-hour (gpus.yaml pricePerGpuHour), None when not given

    @property
    def node_cost(self) -> float | None:
        """What one more node costs per month: every GPU of it is billed."""
        return None if self.price is None else self.pool.gpus_per_node * self.price * HOURS_PER_MONTH

    def rank(self) -> tuple:
        """The order pools are opened in: the least cost per month first (an unknown price after every known
        one), then the smaller node, then by name."""
        cost = self.node_cost
        return (cost is None, cost or 0.0, self.pool.gpus_per_node, self.pool.name)


def ordinal(pool: Pool, slot_id: str | None) -> int | None:
    """The node ordinal k of a slot `pool-<name>-<k>/gpuN` of `pool`; None for any other slot."""
    return pool.ordinal((slot_id or "").rsplit("/", 1)[0])


def pool_rooms(pools: Sequence[Pool], pool_nodes: Mapping[str, int], previous: Iterable[Decision],
               prices: Mapping[str, float], drain: frozenset[str] | None = None) -> dict[str, PoolRoom]:
    """Each pool's nodes this plan starts from: its first minNodes (kept whatever the plan), those the last
    plan placed a model on (so their models keep their place), and in cluster mode (`pool_nodes`: how many nodes
    the pool has now) the lowest other ordinals until as many as the cluster has (idle nodes cost nothing more
    while they are there). Ordinals at or above maxNodes are never planned. `drain` (consolidation's trial
    plans): these nodes are given back, and no node may be opened."""
    used = _placed_on(previous, pools)
    rooms = {}
    for pool in sorted(pools, key=lambda p: p.name):
        opened = set(range(pool.min_nodes)) | used[pool.name]
        spare = (k for k in range(pool.max_nodes) if k not in opened)
        for k in spare:
            if len(opened) >= pool_nodes.get(pool.name, 0):
                break
            opened.add(k)
        opened = {k for k in opened if k < pool.max_nodes and pool.node_name(k) not in (drain or ())}
        free = [] if drain is not None else [k for k in range(pool.max_nodes) if k not in opened]
        rooms[pool.name] = PoolRoom(pool, tuple(sorted(opened)), free, prices.get(pool.product))
    return rooms


def existing_slots(rooms: Mapping[str, PoolRoom]) -> list[GpuSlot]:
    """The GPUs of every pool node the plan starts from."""
    return [slot for room in rooms.values() for k in room.open for slot in room.pool.slots(k)]


def node_states(pool: Pool, k: int, first_position: int) -> list[SlotState]:
    """Empty states for the GPUs of pool node `k`, numbered from `first_position`."""
    node = NodeState(pool.node_name(k), pool.host_memory_bytes)
    return [SlotState(slot, first_position + i, node) for i, slot in enumerate(pool.slots(k))]


def _size(ask: Ask) -> int:
    return ask.need_bytes if ask.whole else ask.minimum.footprint


ORDERS = (  # the orders the opening stage tries, keeping the cheapest plan (models on one product first in each)
    lambda a, n: (n, -_size(a), a.key),  # the largest first (first-fit decreasing)
    lambda a, n: (n, a.whole, -_size(a), a.key),  # the models that must stream first, then the largest
)


def open_nodes(refused: list[Ask], choices: Mapping[tuple[str, str], list[Ask]], states: list[SlotState],
               rooms: Mapping[str, PoolRoom]) -> list[Ask]:
    """The greedy regime's opening stage, after placement on existing GPUs: each refused model goes to a GPU of a
    node opened this pass where it fits (any product it may run on, its preferred first), else to a new node of
    the pool that costs least per month among those that can serve it. It is run in each of ORDERS (the models
    that may run on one product only first: they decide which pools open) and the plan that refuses fewest, then
    costs least, then keeps fewest GPUs is kept; its new nodes' states are appended to `states`. On a new node a
    model that fits whole runs whole (resident, or in a swap group where its TTFT allows); only one its budget
    makes stream, or one no pool's GPU holds whole (streams_on_any), streams. Returns the models still refused."""
    best = None
    for i, order in enumerate(ORDERS):
        trial = {name: replace(room, free=list(room.free)) for name, room in rooms.items()}
        opened, still = _open_in(sorted(refused, key=lambda a: order(a, len(choices.get(a.key, [a])))), choices,
                                 trial, len(states))
        cost = sum((trial[s.slot.pool.name].node_cost or 0.0) / s.slot.pool.gpus_per_node for s in opened)
        rank = (len(still), cost, len(opened), i)
        if best is None or rank < best[0]:
            best = (rank, opened, still, trial)
    _, opened, still, trial = best
    for name, room in rooms.items():
        room.free = trial[name].free
    states.extend(opened)
    return still


def _open_in(order: list[Ask], choices: Mapping[tuple[str, str], list[Ask]], rooms: Mapping[str, PoolRoom],
             first_position: int) -> tuple[list[SlotState], list[Ask]]:
    """One run of the opening stage in `order`: (the new nodes' states, the models still refused)."""
    opened: list[SlotState] = []
    still = []
    for ask in order:
        options = choices.get(ask.key, [ask])
        if any(place(option, [s for s in opened if s.slot.product == option.profile.gpu_product], squeeze=False)
               for option in options):
            continue
        pairs = _pools_for(options, rooms)
        squeeze = streams_on_any(pairs)
        for room, option in pairs:
            if not room.free:
                continue
            fresh = node_states(room.pool, room.free[0], first_position + len(opened))
            if place(option, fresh, squeeze=squeeze):
                room.free.pop(0)
                opened.extend(fresh)
                break
        else:
            still.append(ask)
    return opened, still


def streams_on_any(pairs: Sequence[tuple[PoolRoom, Ask]]) -> bool:
    """Whether the model streams on whichever pool's GPU it gets: no pool it may run on has a GPU that holds it
    whole. Then a new node of the cheapest pool takes it streaming (as a fixed GPU too small for it would),
    rather than refusing it and leaving a re-plan to move placed models for it."""
    return not any(option.whole and option.need_bytes <= room.pool.slots(0)[0].usable_bytes
                   for room, option in pairs)


def refusals(refused: Sequence[Ask]) -> tuple[int, int]:
    """Refusals as the objective counts them: models the last plan placed first, then all."""
    return (sum(1 for a in refused if a.placed_before), len(refused))


def _pools_for(options: Sequence[Ask], rooms: Mapping[str, PoolRoom]) -> list[tuple[PoolRoom, Ask]]:
    """(pool, the model's ask on its product) for every pool of a product the model may run on, cheapest first."""
    pairs = [(room, option) for option in options for room in rooms.values()
             if room.pool.product == option.profile.gpu_product]
    return sorted(pairs, key=lambda pair: pair[0].rank())


def candidates(asks: Sequence[Ask], rooms: Mapping[str, PoolRoom]) -> list[tuple[PoolRoom, int]]:
    """The nodes the exact solver may open: per pool, its lowest free ordinals, as many as its GPUs could hold
    the models that may run on its product one per GPU (no plan needs more)."""
    models: dict[str, set] = {}
    for ask in asks:
        models.setdefault(ask.profile.gpu_product, set()).add(ask.key)
    out = []
    for room in rooms.values():
        n = len(models.get(room.pool.product, ()))
        out += [(room, k) for k in room.free[:math.ceil(n / room.pool.gpus_per_node)]]
    return out


def cost_units(rooms: Iterable[PoolRoom]) -> dict[str, int]:
    """Per pool: its node's cost as the exact solver counts it, in integers: COST_STEPS × cost ÷ the dearest
    known node's, plus one (a node is never free to open); a pool without a price costs more than any priced."""
    rooms = list(rooms)
    known = [r.node_cost for r in rooms if r.node_cost is not None]
    top = max(known, default=0.0)
    return {r.pool.name: COST_STEPS + 2 if r.node_cost is None else
            (round(COST_STEPS * r.node_cost / top) if top else 0) + 1 for r in rooms}


@dataclass(frozen=True)
class LimitHit:
    """A pool that could have served a refused model on a new node, but has no node left to open."""

    pool: Pool
    planned: int  # nodes of the pool this plan has


def limit_hits(refused: Sequence[Ask], choices: Mapping[tuple[str, str], list[Ask]], states: Sequence[SlotState],
               rooms: Mapping[str, PoolRoom]) -> dict[tuple[str, str], LimitHit]:
    """Per refused model: the cheapest pool whose fresh node would take it but that is at its maxNodes (its
    refusal names that pool, its limit and the bytes missing)."""
    planned: dict[str, set[str]] = {}
    for state in states:
        if state.slot.pool is not None:
            planned.setdefault(state.slot.pool.name, set()).add(state.slot.node)
    hits = {}
    for ask in refused:
        pairs = _pools_for(choices.get(ask.key, [ask]), rooms)
        squeeze = streams_on_any(pairs)
        for room, option in pairs:
            if room.free:
                continue
            if place(option, node_states(room.pool, room.pool.max_nodes, 0), squeeze=squeeze):
                hits[ask.key] = LimitHit(room.pool, len(planned.get(room.pool.name, ())))
                break
    return hits


def kept_pool_nodes(decisions: Iterable[Decision], pools: Iterable[Pool]) -> dict[str, set[int]]:
    """Per pool: the ordinals of the nodes these decisions keep: its minNodes, and each node a model is placed on.
    A node no model uses any more drops out, so its workers leave and the autoscaler removes it."""
    pools = list(pools)
    placed = _placed_on(decisions, pools)
    return {p.name: placed[p.name] | set(range(p.min_nodes)) for p in pools}


def _placed_on(decisions: Iterable[Decision], pools: Sequence[Pool]) -> dict[str, set[int]]:
    """Per pool: the ordinals of its nodes a placed decision is on."""
    used: dict[str, set[int]] = {p.name: set() for p in pools}
    by_name = {p.name: p for p in pools}
    for decision in decisions:
        pool = by_name.get(decision.pool or "")
        if pool is not None and decision.mode != "refused":
            k = ordinal(pool, decision.slot)
            if k is not None:
                used[pool.name].add(k)
    return used


def kept_pool_slots(decisions: Iterable[Decision], pools: Iterable[Pool]) -> tuple[GpuSlot, ...]:
    """The GPUs of every pool node the decisions keep (`kept_pool_nodes`), by pool and node."""
    pools = {p.name: p for p in pools}
    used = kept_pool_nodes(decisions, pools.values())
    return tuple(slot for name in sorted(used) for k in sorted(used[name]) for slot in pools[name].slots(k))
