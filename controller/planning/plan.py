"""The occupancy planner: ElasticModels + profiles + GPU slots -> one decision per model.

Owns the pass: each model's product and profile, and which planner (exact or greedy) places
each product's models. A slot's limits are controller.planning.slots, the greedy
controller.planning.greedy, the wording controller.planning.decisions, one model's
arithmetic controller.planning.cost. Pure and deterministic: no I/O, and
the result does not depend on input order. Called by the CLI (`gpushare plan`,
`explain`), by the reconcile pass and by bench/plan_quality.py.

The rules (docs/planner.md; docs/architecture.md has the design):
1. A model with spec.gpu.product runs on it; one without may run on any product it has a profile for,
   and its product is chosen with its slot (products joined by such a model are planned together). No
   profile on any of them -> Pending on the preferred product (the largest GPU): a profiler Job is needed;
   no such product -> refused.
2. need <= limit = min(budget, slot usable) -> the model may run whole (resident, or swap
   when the slot cannot hold every whole model at once); otherwise it is elastic. An
   elastic model starts at the fewest resident layers that meet its TPOT target at its
   share of the host->device link (the elastic minimum without one); budget below the
   elastic minimum -> refused (BudgetBelowElasticMinimum). Slices grow into the room
   left only after every model has a place, a layer each in turn by name
   (controller.planning.growth): a budget is a cap, never a reservation.
3. Limits of a slot: bytes (resident needs + the swap area, the largest member's need, +
   elastic slices) within its usable memory; pinned host copies (swap members' weights,
   elastic models' streamed layers) on all GPUs of a node within the node's host RAM; the
   worst swap-in wait of a swap group within each member's TTFT; and every streaming
   model's TPOT within a target it meets alone: the longer of its streaming at its share of
   the link (divided among the elastic models) and its step with the co-tenants' steps. Both
   SLO limits are judged on the all-busy prediction the decision carries.
4. The objective, in order: no model the last plan placed is refused to admit others;
   fewest refused; fewest moves of models whose own inputs did not change (so a model keeps
   its slot and mode unless keeping it would refuse someone, and the reason names the move);
   fewest elastic; fewest swap; fewest SLO targets predicted missed; the lowest predicted latency
   against the targets; the lowest predicted TPOT. Render-time rules (one composition per GPU, a
   served name once per worker) are limits of a slot, and a model no slot may serve is refused with them.
   Small instances are solved exactly (controller.planning.plan_exact, CP-SAT with a fixed seed
   and one worker: deterministic); larger ones by the greedy below, whose gap to the exact
   optimum bench/plan_quality.py measures.
5. The greedy (controller.planning.greedy): unchanged models keep their slot, mode and
   slice first. Then the models that must stream, then those that fit whole: resident by best
   fit; else into a swap group; else a slot re-packs its re-placeable residents into a swap
   group; else elastic where the link and bytes allow; then repairs for the refused ones
   (the last, controller.planning.readmit: models placed this pass make way). If
   that refuses a model that a plan without stickiness would place, the plan without
   stickiness wins and every moved model's reason says so.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from contract.gpu_catalog import capability_of
from contract.precision import AUTO, product_problem
from controller.planning import capacity, cost
from controller.planning.capacity import PoolRoom, existing_slots, kept_pool_slots, pool_rooms
from controller.planning.decisions import decisions, no_matching_gpu, refused_below_minimum
from controller.planning.greedy import greedy_fleet
from controller.planning.growth import grow
from controller.planning.slots import Ask, NodeState, SlotState
from controller.types import Decision, ElasticModel, GpuSlot, Inputs, Pending, Plan, Profile

EXACT_MAX_MODELS = 10   # per GPU product; beyond this the greedy plans (bench/plan_quality.py measures its gap)
EXACT_MAX_PAIRS = 40    # models × slots of one product


SETTLE_PASSES = 3
_PLACEMENT_FREE_REFUSALS = ("BudgetBelowElasticMinimum", "NoMatchingGPU")  # no placement could change these


def plan(inputs: Inputs, previous: Mapping[tuple[str, str], Decision] | None = None, *,
         method: str = "auto", drain: frozenset[str] | None = None) -> Plan:
    """method: "auto" (exact where small, else greedy), "exact" or "greedy" (the bench compares them), or
    "slo-first" (exact, with SLO targets missed ranked right after refused: the bench's reference).
    `drain`: pool nodes this plan gives back, opening none (consolidation's trials, controller.planning.consolidate).

    A first plan (no previous decisions) that refused a model for lack of room is settled: re-planned
    with its own decisions until that changes nothing (at most SETTLE_PASSES more plans), because the sticky
    repairs can admit a model the first greedy left out. So re-planning a plan's own decisions is a fixed
    point, and the next pass does not move models the first could have placed better."""
    result = _plan_once(inputs, previous or {}, method, drain)
    if previous or not any(d.mode == "refused" and d.reason_code not in _PLACEMENT_FREE_REFUSALS
                           for d in result.decisions):
        return result
    for _ in range(SETTLE_PASSES):
        again = _plan_once(inputs, {d.key: d for d in result.decisions}, method, drain)
        if again == result:
            break
        result = again
    return result


def _plan_once(inputs: Inputs, previous: Mapping[tuple[str, str], Decision], method: str,
               drain: frozenset[str] | None = None) -> Plan:
    rooms = pool_rooms(inputs.pools, dict(inputs.pool_nodes), previous.values(), dict(inputs.prices), drain)
    slots_by_product: dict[str, list[GpuSlot]] = {}
    for slot in sorted([*inputs.slots, *existing_slots(rooms)], key=lambda s: (s.product, s.node, s.index)):
        slots_by_product.setdefault(slot.product, []).append(slot)
    profiles = {p.key: p for p in inputs.profiles}
    largest_usable = {p: max(s.usable_bytes for s in slots) for p, slots in slots_by_product.items()}
    for room in rooms.values():  # a pool's GPUs count whether or not a node of it exists yet
        if room.open or room.free:
            usable = room.pool.slots(0)[0].usable_bytes
            largest_usable[room.pool.product] = max(largest_usable.get(room.pool.product, 0), usable)

    decisions: list[Decision] = []
    pending: list[Pending] = []
    asks: list[Ask] = []
    slice_cache: dict = {}
    for model in sorted(inputs.models, key=lambda m: m.key):
        product = _choose_product(model, largest_usable, profiles)
        if product is None:
            decisions.append(no_matching_gpu(model, largest_usable))
            continue
        # the product is chosen with the slot: every product it has a profile on (its own, when it names one)
        candidates = [p for p in ([model.gpu_product] if model.gpu_product else sorted(largest_usable))
                      if model.profile_key(p) in profiles and runs_on(model, p)]
        if not candidates:
            pending.append(Pending(
                name=model.name, namespace=model.namespace, model=model.model, gpu_product=product,
                revision=model.revision, weight_dtype=model.weight_dtype,
                reason=f"no profile of {model.model}{_at_revision(model.revision)}{_in_dtype(model.weight_dtype)} "
                       f"on {product} yet: a profiler Job measures it first",
                pool_selector=_profiling_pool(product, inputs.slots, rooms),
            ))
            continue
        mine = []
        for p in [product] + [c for c in candidates if c != product]:
            ask = _resolve(model, profiles[model.profile_key(p)], largest_usable[p],
                           previous.get(model.key))
            ask.slice_cache = slice_cache
            if ask.minimum.footprint <= min(model.budget_bytes, largest_usable[p]):
                mine.append(ask)
        if not mine:
            decisions.append(refused_below_minimum(_resolve(model, profiles[model.profile_key(product)],
                                                            largest_usable[product], None),
                                                   min(model.budget_bytes, largest_usable[product]),
                                                   largest_usable[product]))
        asks.extend(mine)

    for group, products in _components(asks):
        mine = {name: room for name, room in rooms.items() if room.pool.product in products}
        decisions.extend(plan_product(group, [s for p in products for s in slots_by_product.get(p, [])], method,
                                      mine))
    decisions.sort(key=lambda d: d.key)
    pending.sort(key=lambda p: p.key)
    return Plan(decisions=tuple(decisions), pending=tuple(pending), pool_slots=kept_pool_slots(decisions, inputs.pools))


def _components(asks: list[Ask]) -> list[tuple[list[Ask], list[str]]]:
    """The asks split into groups planned apart: products joined by a model that may run on either."""
    parent: dict[str, str] = {}

    def root(p: str) -> str:
        while parent.setdefault(p, p) != p:
            p = parent[p]
        return p

    by_key: dict = {}
    for ask in asks:
        by_key.setdefault(ask.key, []).append(ask.profile.gpu_product)
    for products in by_key.values():
        for p in products[1:]:
            parent[root(p)] = root(products[0])
    groups: dict[str, tuple[list[Ask], set]] = {}
    for ask in asks:
        group = groups.setdefault(root(ask.profile.gpu_product), ([], set()))
        group[0].append(ask)
        group[1].add(ask.profile.gpu_product)
    return [(group, sorted(products)) for _, (group, products) in sorted(groups.items())]


def plan_product(asks: list[Ask], slots: list[GpuSlot], method: str = "auto",
                 rooms: Mapping[str, PoolRoom] | None = None) -> list[Decision]:
    """Decisions for the models of one group of GPU products over their slots (the fixed nodes' and the pool
    nodes' the plan starts from), opening pool nodes (`rooms`, the group's pools) for models none of them can
    take. A model may come with an ask per product it can run on (its preferred first); it takes at most one."""
    rooms = rooms or {}
    models = len({a.key for a in asks})
    new_nodes = capacity.candidates(asks, rooms)
    per_product: dict[str, int] = {}
    for slot in [*slots, *(s for room, _ in new_nodes for s in room.pool.slots(0))]:
        per_product[slot.product] = per_product.get(slot.product, 0) + 1
    pairs = sum(per_product.get(a.profile.gpu_product, 0) for a in asks)
    exact = method in ("exact", "slo-first") or (method == "auto" and models <= EXACT_MAX_MODELS
                                                   and pairs <= EXACT_MAX_PAIRS)
    choices: dict[tuple[str, str], list[Ask]] = {}
    for ask in asks:
        choices.setdefault(ask.key, []).append(ask)
    if exact:
        from controller.planning import plan_exact  # OR-Tools loads only when a small instance needs it
        states, refused = plan_exact.solve(asks, _states(slots), slo_first=method == "slo-first", rooms=rooms,
                                           new_nodes=new_nodes)
    else:
        states, refused, rooms = _greedy(asks, slots, choices, rooms, sticky=True)
        if refused and any(a.previous for a in asks):  # the stability rule yields only to a refusal it causes
            fresh = _greedy(asks, slots, choices, rooms, sticky=False)
            if capacity.refusals(fresh[1]) < capacity.refusals(refused):
                states, refused, rooms = fresh
    grow(states)
    hits = capacity.limit_hits(refused, choices, states, rooms) if rooms else {}
    return decisions(states, refused, {key: (hit.pool, hit.planned) for key, hit in hits.items()})


def _greedy(asks: list[Ask], slots: list[GpuSlot], choices: Mapping[tuple[str, str], list[Ask]],
            rooms: Mapping[str, PoolRoom], *, sticky: bool) -> tuple[list[SlotState], list[Ask], dict[str, PoolRoom]]:
    """The greedy over `slots`, then new pool nodes for the models it refused (on a copy of `rooms`)."""
    rooms = {name: replace(room, free=list(room.free)) for name, room in rooms.items()}
    states, refused = greedy_fleet(asks, _states(slots), sticky=sticky)
    if refused and rooms:
        refused = capacity.open_nodes(refused, choices, states, rooms)
    return states, refused, rooms


def _states(slots: list[GpuSlot]) -> list[SlotState]:
    nodes: dict[str, NodeState] = {}
    for slot in slots:
        nodes.setdefault(slot.node, NodeState(slot.node, slot.host_memory_bytes))
    return [SlotState(s, i, nodes[s.node]) for i, s in enumerate(slots)]


def _choose_product(model: ElasticModel, largest_usable: dict[str, int],
                    profiles: dict[tuple[str, str, str, str], Profile]) -> str | None:
    if model.gpu_product is not None:
        return model.gpu_product if model.gpu_product in largest_usable else None
    runnable = [p for p in largest_usable if runs_on(model, p)]
    if not runnable:
        return None

    def preference(product: str) -> tuple:
        usable = largest_usable[product]
        profile = profiles.get(model.profile_key(product))
        fits = profile is not None and cost.need(profile, model.slo).total <= min(model.budget_bytes, usable)
        return (profile is None, not fits, -usable, product)

    return min(runnable, key=preference)


def runs_on(model: ElasticModel, product: str) -> bool:
    """Whether `product` can run the model's spec.weights.dtype (contract.precision, by the GPU catalog's compute
    capability; a product the catalog does not know is not ruled out: its profiler Job finds out)."""
    return product_problem(product, capability_of(product), model.weight_dtype) is None


def _in_dtype(weight_dtype: str) -> str:
    return "" if weight_dtype == AUTO else f" in {weight_dtype}"


def _resolve(model: ElasticModel, profile: Profile, largest_usable: int, prev: Decision | None) -> Ask:
    need = cost.need(profile, model.slo)
    unchanged = (prev is not None and prev.slot is not None and prev.mode != "refused" and prev.model == model.model
                 and prev.budget_bytes == model.budget_bytes and prev.need_bytes == need.total
                 and prev.total_layers == profile.total_layers)
    minimum = cost.elastic_slice_at(profile, model.slo, 0)
    return Ask(model, profile, need, whole=need.total <= min(model.budget_bytes, largest_usable),
               minimum=minimum, previous=prev if unchanged and prev.gpu_product == profile.gpu_product else None,
               placed_before=prev is not None and prev.mode != "refused" and prev.slot is not None,
               last_slot=prev.slot if prev is not None and prev.mode != "refused" else None)



def _profiling_pool(product: str, slots: tuple[GpuSlot, ...], rooms: Mapping[str, PoolRoom]) -> tuple[str, str] | None:
    """The label a profiler Job for `product` selects when no fixed node has that product: the cheapest pool's
    that has it (its pending Job makes the autoscaler add a node, which leaves again once the Job is done)."""
    if any(s.product == product for s in slots):
        return None
    mine = sorted((room for room in rooms.values() if room.pool.product == product and room.pool.max_nodes),
                  key=PoolRoom.rank)
    return mine[0].pool.selector if mine else None


def _at_revision(revision: str) -> str:
    return "" if revision == "main" else f"@{revision}"
