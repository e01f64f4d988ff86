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

from typing import Mapping

from controller.planning import cost
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
         method: str = "auto") -> Plan:
    """method: "auto" (exact where small, else greedy), "exact" or "greedy" (the bench compares them), or
    "slo-first" (exact, with SLO targets missed ranked right after refused: the bench's reference).

    A first plan (no previous decisions) that refused a model for lack of room is settled: re-planned
    with its own decisions until that changes nothing (at most SETTLE_PASSES more plans), because the sticky
    repairs can admit a model the first greedy left out. So re-planning a plan's own decisions is a fixed
    point, and the next pass does not move models the first could have placed better."""
    result = _plan_once(inputs, previous or {}, method)
    if previous or not any(d.mode == "refused" and d.reason_code not in _PLACEMENT_FREE_REFUSALS
                           for d in result.decisions):
        return result
    for _ in range(SETTLE_PASSES):
        again = _plan_once(inputs, {d.key: d for d in result.decisions}, method)
        if again == result:
            break
        result = again
    return result


def _plan_once(inputs: Inputs, previous: Mapping[tuple[str, str], Decision], method: str) -> Plan:
    slots_by_product: dict[str, list[GpuSlot]] = {}
    for slot in sorted(inputs.slots, key=lambda s: (s.product, s.node, s.index)):
        slots_by_product.setdefault(slot.product, []).append(slot)
    profiles = {p.key: p for p in inputs.profiles}
    largest_usable = {p: max(s.usable_bytes for s in slots) for p, slots in slots_by_product.items()}

    decisions: list[Decision] = []
    pending: list[Pending] = []
    asks: list[Ask] = []
    slice_cache: dict = {}
    for model in sorted(inputs.models, key=lambda m: m.key):
        product = _choose_product(model, largest_usable, profiles)
        if product is None:
            decisions.append(no_matching_gpu(model, slots_by_product))
            continue
        # the product is chosen with the slot: every product it has a profile on (its own, when it names one)
        candidates = [p for p in ([model.gpu_product] if model.gpu_product else sorted(largest_usable))
                      if (model.model, model.revision, p) in profiles]
        if not candidates:
            pending.append(Pending(
                name=model.name, namespace=model.namespace, model=model.model, gpu_product=product,
                revision=model.revision,
                reason=f"no profile of {model.model}{_at_revision(model.revision)} on {product} yet: "
                       "a profiler Job measures it first",
            ))
            continue
        mine = []
        for p in [product] + [c for c in candidates if c != product]:
            ask = _resolve(model, profiles[(model.model, model.revision, p)], largest_usable[p],
                           previous.get(model.key))
            ask.slice_cache = slice_cache
            if ask.minimum.footprint <= min(model.budget_bytes, largest_usable[p]):
                mine.append(ask)
        if not mine:
            decisions.append(refused_below_minimum(_resolve(model, profiles[(model.model, model.revision, product)],
                                                            largest_usable[product], None),
                                                   min(model.budget_bytes, largest_usable[product]),
                                                   largest_usable[product]))
        asks.extend(mine)

    for group, products in _components(asks):
        decisions.extend(plan_product(group, [s for p in products for s in slots_by_product[p]], method))
    decisions.sort(key=lambda d: d.key)
    pending.sort(key=lambda p: p.key)
    return Plan(decisions=tuple(decisions), pending=tuple(pending))


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


def plan_product(asks: list[Ask], slots: list[GpuSlot], method: str = "auto") -> list[Decision]:
    """Decisions for the models of one group of GPU products over their slots. A model may come with an ask
    per product it can run on (its preferred first); it takes at most one of them."""
    models = len({a.key for a in asks})
    per_product: dict[str, int] = {}
    for slot in slots:
        per_product[slot.product] = per_product.get(slot.product, 0) + 1
    pairs = sum(per_product.get(a.profile.gpu_product, 0) for a in asks)
    exact = method in ("exact", "slo-first") or (method == "auto" and models <= EXACT_MAX_MODELS
                                                   and pairs <= EXACT_MAX_PAIRS)
    if exact:
        from controller.planning import plan_exact  # OR-Tools loads only when a small instance needs it
        states, refused = plan_exact.solve(asks, _states(slots), slo_first=method == "slo-first")
    else:
        states, refused = greedy_fleet(asks, _states(slots), sticky=True)
        if refused and any(a.previous for a in asks):
            fresh_states, fresh_refused = greedy_fleet(asks, _states(slots), sticky=False)
            if _refusals(fresh_refused) < _refusals(refused):
                states, refused = fresh_states, fresh_refused
    grow(states)
    return decisions(states, refused)


def _refusals(refused: list[Ask]) -> tuple[int, int]:
    """Refusals as the objective counts them: models the last plan placed first, then all."""
    return (sum(1 for a in refused if a.placed_before), len(refused))


def _states(slots: list[GpuSlot]) -> list[SlotState]:
    nodes: dict[str, NodeState] = {}
    for slot in slots:
        nodes.setdefault(slot.node, NodeState(slot.node, slot.host_memory_bytes))
    return [SlotState(s, i, nodes[s.node]) for i, s in enumerate(slots)]


def _choose_product(model: ElasticModel, largest_usable: dict[str, int],
                    profiles: dict[tuple[str, str, str], Profile]) -> str | None:
    if model.gpu_product is not None:
        return model.gpu_product if model.gpu_product in largest_usable else None
    if not largest_usable:
        return None

    def preference(product: str) -> tuple:
        usable = largest_usable[product]
        profile = profiles.get((model.model, model.revision, product))
        fits = profile is not None and cost.need(profile, model.slo).total <= min(model.budget_bytes, usable)
        return (profile is None, not fits, -usable, product)

    return min(largest_usable, key=preference)


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



def _at_revision(revision: str) -> str:
    return "" if revision == "main" else f"@{revision}"
