"""The occupancy planner: ElasticModels + profiles + GPU slots -> one decision per model.

Owns placement (which GPU slot) and mode (resident, swap, elastic, or refused), by
docs/architecture.md's rules; the per-model arithmetic lives in controller.planning.cost. Pure and
deterministic: no I/O, and the result does not depend on input order. Called by
the CLI (`gpushare plan`, `explain`) and by the reconcile pass.

How one pass places models:
1. Each model picks its GPU product (its selector, else the profiled product where it
   fits without streaming, then the largest GPU, then by name). No profile for that
   product -> Pending (a profiler Job is needed); no such product -> refused.
2. need > min(budget, slot usable) -> elastic: the largest slice that fits; below
   the elastic minimum -> refused (BudgetBelowElasticMinimum).
3. Models are placed in a stable order: those whose SLO a swap-in would break first,
   then the rest; within a tier, larger need first, then by namespace/name. Neither
   the budget nor the last decisions change a model's place in this order: a larger
   budget can only widen what is left for it when its turn comes (it never gets a
   worse mode), and re-planning unchanged inputs reproduces the same plan (a pass with
   nothing new commits nothing). A model whose inputs are unchanged prefers its
   previous slot wherever that slot would take it.
4. A model that fits alone goes resident in the slot with the least free space that
   holds it. Where none does, it joins the swap group of a
   slot (one full model on the GPU at a time; the group's area is its largest need),
   re-packing that slot's members: SLO-sensitive and then larger models stay resident
   first. Where no slot can take it whole, it streams (elastic) in the largest
   free space. Nothing that fits nowhere is overcommitted: it is refused (NoCapacity).
"""
from __future__ import annotations

import bisect
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping

from controller.planning import cost
from contract.quantity import format_bytes as fb
from controller.types import Decision, ElasticModel, GpuSlot, Inputs, Pending, Plan, Profile

TIER_SLO_SENSITIVE, TIER_OTHER = 0, 1


@dataclass
class _Ask:
    """One model, resolved against its product's profile."""

    model: ElasticModel
    profile: Profile
    need: cost.Need
    elastic: bool
    tier: int
    sticky_slot: str | None

    @property
    def need_bytes(self) -> int:
        return self.need.total

    def order(self) -> tuple:
        return (self.tier, -self.need_bytes, self.model.namespace, self.model.name)

    def pack_priority(self) -> tuple:
        """Who stays resident when a slot re-packs: SLO-sensitive first, then larger, then by name. It does
        not look at last pass's modes, so re-planning unchanged inputs reproduces the same plan."""
        return (self.tier != TIER_SLO_SENSITIVE, -self.need_bytes, self.model.namespace, self.model.name)


@dataclass
class _SlotState:
    """One slot during placement, with running byte counts (members only ever join)."""

    slot: GpuSlot
    position: int
    elastic: list[tuple[_Ask, cost.ElasticSlice]] = field(default_factory=list)
    squeezed: set[tuple[str, str]] = field(default_factory=set)  # fit their budget, streamed for lack of room
    resident: list[_Ask] = field(default_factory=list)
    swap: list[_Ask] = field(default_factory=list)
    elastic_bytes: int = 0
    resident_bytes: int = 0
    swap_area: int = 0

    @property
    def used(self) -> int:
        return self.elastic_bytes + self.resident_bytes + self.swap_area

    @property
    def free(self) -> int:
        return self.slot.usable_bytes - self.used

    @property
    def room_beside_residents(self) -> int:
        """What a swap group could grow into without moving anyone: free + the current swap area."""
        return self.free + self.swap_area

    @property
    def room_beside_elastic(self) -> int:
        """The largest model that fits alone here once the fit-alone members are re-packed."""
        return self.slot.usable_bytes - self.elastic_bytes

    def add_elastic(self, ask: _Ask, piece: cost.ElasticSlice, squeezed: bool = False) -> None:
        self.elastic.append((ask, piece))
        self.elastic_bytes += piece.footprint
        if squeezed:
            self.squeezed.add(ask.model.key)

    def add_resident(self, ask: _Ask) -> None:
        self.resident.append(ask)
        self.resident_bytes += ask.need_bytes

    def join_swap(self, ask: _Ask) -> None:
        self.swap.append(ask)
        self.swap_area = max(self.swap_area, ask.need_bytes)

    def repack(self, ask: _Ask) -> None:
        """Greedy: keep resident whoever fits beside the swap area the rest still needs."""
        members = sorted(self.resident + self.swap + [ask], key=_Ask.pack_priority)
        avail = self.room_beside_elastic
        resident: list[_Ask] = []
        remaining = list(members)
        used = 0
        for candidate in members:
            rest = max((a.need_bytes for a in remaining if a is not candidate), default=0)
            if used + candidate.need_bytes + rest <= avail:
                resident.append(candidate)
                remaining.remove(candidate)
                used += candidate.need_bytes
        if len(remaining) == 1:  # a swap group of one is simply resident
            resident += remaining
            remaining = []
        self.resident, self.swap = resident, remaining
        self.resident_bytes = sum(a.need_bytes for a in resident)
        self.swap_area = max((a.need_bytes for a in remaining), default=0)


class _Index:
    """Slots sorted by one measure of room, for best-fit and largest lookups in O(log n)."""

    def __init__(self, states: list[_SlotState], measure: Callable[[_SlotState], int]):
        self.states, self.measure = states, measure
        self.entries = sorted((measure(s), s.position) for s in states)

    def best_fit(self, nbytes: int) -> _SlotState | None:
        """The slot with the least room that still holds `nbytes`."""
        pos = bisect.bisect_left(self.entries, (nbytes, -1))
        return self.states[self.entries[pos][1]] if pos < len(self.entries) else None

    def largest(self) -> _SlotState | None:
        return self.states[self.entries[-1][1]] if self.entries else None

    def remove(self, state: _SlotState) -> None:
        del self.entries[bisect.bisect_left(self.entries, (self.measure(state), state.position))]

    def add(self, state: _SlotState) -> None:
        bisect.insort(self.entries, (self.measure(state), state.position))


class _ProductSlots:
    """The slots of one GPU product and their indexes, kept in step on every change."""

    def __init__(self, states: list[_SlotState]):
        self.states = states
        self.largest_usable = max(s.slot.usable_bytes for s in states)
        self.by_free = _Index(states, lambda s: s.free)
        self.by_swap_room = _Index(states, lambda s: s.room_beside_residents)
        self.by_alone_room = _Index(states, lambda s: s.room_beside_elastic)
        self._indexes = (self.by_free, self.by_swap_room, self.by_alone_room)

    @contextmanager
    def changing(self, state: _SlotState) -> Iterator[_SlotState]:
        for index in self._indexes:
            index.remove(state)
        yield state
        for index in self._indexes:
            index.add(state)


def plan(inputs: Inputs, previous: Mapping[tuple[str, str], Decision] | None = None) -> Plan:
    previous = previous or {}
    slots_by_product: dict[str, list[GpuSlot]] = {}
    for slot in sorted(inputs.slots, key=lambda s: (s.product, s.node, s.index)):
        slots_by_product.setdefault(slot.product, []).append(slot)
    profiles = {p.key: p for p in inputs.profiles}
    largest_usable = {p: max(s.usable_bytes for s in slots) for p, slots in slots_by_product.items()}

    decisions: list[Decision] = []
    pending: list[Pending] = []
    asks: list[_Ask] = []
    for model in sorted(inputs.models, key=lambda m: m.key):
        product = _choose_product(model, largest_usable, profiles)
        if product is None:
            decisions.append(_no_matching_gpu(model, slots_by_product))
            continue
        profile = profiles.get((model.model, model.revision, product))
        if profile is None:
            pending.append(Pending(
                name=model.name, namespace=model.namespace, model=model.model, gpu_product=product,
                revision=model.revision,
                reason=f"no profile of {model.model}{_at_revision(model.revision)} on {product} yet: "
                       "a profiler Job measures it first",
            ))
            continue
        asks.append(_resolve(model, profile, largest_usable[product], previous.get(model.key)))

    products = {p: _ProductSlots([_SlotState(s, i) for i, s in enumerate(slots)])
                for p, slots in slots_by_product.items()}
    by_id = {s.slot.id: s for group in products.values() for s in group.states}

    refused: list[Decision] = []
    for ask in sorted(asks, key=_Ask.order):
        group = products[ask.profile.gpu_product]
        sticky = by_id.get(ask.sticky_slot) if ask.sticky_slot else None
        outcome = _place_elastic(ask, group, sticky) if ask.elastic else _place_alone(ask, group, sticky)
        if outcome is not None:
            refused.append(outcome)

    for group in products.values():
        for state in group.states:
            decisions.extend(_slot_decisions(state))
    decisions.extend(refused)
    decisions.sort(key=lambda d: d.key)
    pending.sort(key=lambda p: p.key)
    return Plan(decisions=tuple(decisions), pending=tuple(pending))


def _choose_product(model: ElasticModel, largest_usable: dict[str, int],
                    profiles: dict[tuple[str, str], Profile]) -> str | None:
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


def _resolve(model: ElasticModel, profile: Profile, largest_usable: int, prev: Decision | None) -> _Ask:
    need = cost.need(profile, model.slo)
    elastic = need.total > min(model.budget_bytes, largest_usable)
    resident_pred = cost.predict_resident(profile, model.slo)
    swap_pred = cost.predict_swap(profile, model.slo)
    slo_sensitive = not cost.slo_misses(model.slo, resident_pred) and bool(cost.slo_misses(model.slo, swap_pred))
    tier = TIER_SLO_SENSITIVE if slo_sensitive and not elastic else TIER_OTHER
    unchanged = (prev is not None and prev.slot is not None and prev.model == model.model
                 and prev.budget_bytes == model.budget_bytes and prev.need_bytes == need.total)
    return _Ask(model, profile, need, elastic, tier, sticky_slot=prev.slot if unchanged else None)


def _place_elastic(ask: _Ask, group: _ProductSlots, sticky: _SlotState | None) -> Decision | None:
    limit = min(ask.model.budget_bytes, group.largest_usable)
    piece = cost.largest_elastic_slice(ask.profile, ask.model.slo, limit)
    if piece is None:
        return _refused_below_minimum(ask, limit, group.largest_usable)
    target = sticky if sticky is not None and sticky.free >= piece.footprint else group.by_free.best_fit(piece.footprint)
    if target is None:
        return _squeeze_elastic(ask, group)
    with group.changing(target):
        target.add_elastic(ask, piece)
    return None


def _place_alone(ask: _Ask, group: _ProductSlots, sticky: _SlotState | None) -> Decision | None:
    """Resident where it fits beside the others; else join a swap group as it stands; else re-pack
    a slot (demoting residents into a swap area); else stream it in the largest free space."""
    nbytes = ask.need_bytes

    def pick(fits: Callable[[_SlotState], bool], fallback: _SlotState | None) -> _SlotState | None:
        if sticky is not None and fits(sticky):
            return sticky
        return fallback if fallback is not None and fits(fallback) else None

    target = pick(lambda s: s.free >= nbytes, group.by_free.best_fit(nbytes))
    if target is not None:
        with group.changing(target):
            target.add_resident(ask)
        return None
    target = pick(lambda s: bool(s.swap) and s.room_beside_residents >= nbytes, group.by_swap_room.best_fit(nbytes))
    if target is not None:
        with group.changing(target):
            target.join_swap(ask)
        return None
    target = pick(lambda s: s.room_beside_elastic >= nbytes, group.by_alone_room.largest())
    if target is not None:
        with group.changing(target):
            target.repack(ask)
        return None
    return _squeeze_elastic(ask, group)


def _squeeze_elastic(ask: _Ask, group: _ProductSlots) -> Decision | None:
    """A model with no room to run whole still serves elastic in the largest free space,
    if its elastic minimum fits there; otherwise it is refused (NoCapacity)."""
    target = group.by_free.largest()
    limit = min(ask.model.budget_bytes, target.free) if target else 0
    piece = cost.largest_elastic_slice(ask.profile, ask.model.slo, limit) if target else None
    if piece is None:
        return _no_capacity(ask, cost.elastic_slice_at(ask.profile, ask.model.slo, 0).footprint, group)
    with group.changing(target):
        target.add_elastic(ask, piece, squeezed=not ask.elastic)
    return None


def _slot_decisions(state: _SlotState) -> list[Decision]:
    slot = state.slot
    out = []
    for ask in state.resident:
        pred = cost.predict_resident(ask.profile, ask.model.slo)
        reason = (f"need {_need_terms(ask)} fits budget {fb(ask.model.budget_bytes)} and slot {slot.id} "
                  f"holds it beside the others")
        out.append(_decision(ask, slot, "resident", ask.profile.total_layers, nbytes=ask.need_bytes,
                             pred=pred, reason=reason, code="FitsResident"))
    for ask in state.swap:
        pred = cost.predict_swap(ask.profile, ask.model.slo)
        reason = (f"need {_need_terms(ask)} fits budget {fb(ask.model.budget_bytes)}, but the slot cannot hold "
                  f"every fitting model at once: it shares a {fb(state.swap_area)} swap area with "
                  f"{len(state.swap) - 1} other model(s) (PLAN.md lists them); "
                  f"swap-in {pred.swap_in_ms:g} ms = {fb(ask.profile.weight_bytes)} ÷ "
                  f"{ask.profile.host_to_device_gbps:g} GB/s")
        out.append(_decision(ask, slot, "swap", ask.profile.total_layers, nbytes=ask.need_bytes,
                             pred=pred, reason=reason, code="SharesSwapArea"))
    for ask, piece in state.elastic:
        pred = cost.predict_elastic(ask.profile, ask.model.slo, piece)
        limit = min(ask.model.budget_bytes, slot.usable_bytes)
        if ask.model.key in state.squeezed:
            why = (f"need {_need_terms(ask)} fits budget {fb(ask.model.budget_bytes)} but no {slot.product} slot "
                   f"has that much room beside the models placed before it")
        else:
            why = (f"need {_need_terms(ask)} > limit {fb(limit)} (budget {fb(ask.model.budget_bytes)}, "
                   f"slot usable {fb(slot.usable_bytes)})")
        reason = (f"{why}: keeps {piece.resident_layers}/{piece.total_layers} layers plus embeddings, head, KV, "
                  f"activations, overhead and 2 stream buffers ({fb(piece.buffer_bytes)}) = "
                  f"{fb(piece.footprint)}; streams {fb(piece.streamed_bytes)} per pass at "
                  f"{ask.profile.host_to_device_gbps:g} GB/s")
        code = "ExceedsFreeSpace" if ask.model.key in state.squeezed else "ExceedsBudget"
        out.append(_decision(ask, slot, "elastic", piece.resident_layers, nbytes=piece.footprint,
                             pred=pred, reason=reason, code=code))
    return out


def _decision(ask: _Ask, slot: GpuSlot | None, mode: str, layers: int, *, nbytes: int,
              pred, reason: str, code: str) -> Decision:
    slo = ask.model.slo
    misses = cost.slo_misses(slo, pred) if pred is not None else []
    has_targets = slo.ttft_ms is not None or slo.tpot_ms is not None
    if misses:
        reason += "; SLO missed: " + ", ".join(misses)
    return Decision(
        name=ask.model.name, namespace=ask.model.namespace, model=ask.model.model,
        gpu_product=ask.profile.gpu_product, slot=slot.id if slot else None, mode=mode,
        resident_layers=layers, total_layers=ask.profile.total_layers, need_bytes=ask.need_bytes,
        budget_bytes=ask.model.budget_bytes, footprint_bytes=nbytes, predicted=pred,
        slo_met=(not misses) if (has_targets and pred is not None) else None,
        reason=reason, reason_code=code, profile=f"{ask.profile.model}@{ask.profile.gpu_product}",
        dtype=ask.profile.dtype, terms=ask.profile.terms,
    )


def _refused_below_minimum(ask: _Ask, limit: int, usable: int) -> Decision:
    minimum = cost.elastic_slice_at(ask.profile, ask.model.slo, 0).footprint
    slo = ask.model.slo
    if minimum > usable:
        fix = (f"No budget helps: a {ask.profile.gpu_product} has {fb(usable)} usable. Lower slo.contextTokens or "
               f"slo.concurrency, or choose a larger GPU (spec.gpu.product)")
    else:
        fix = f"Raise memoryBudget to at least {minimum} bytes ({fb(minimum)}) or lower slo.contextTokens/concurrency"
    reason = (f"need {_need_terms(ask)} > limit {fb(limit)}, and even streaming every layer needs "
              f"{fb(minimum)} on the GPU (embeddings, head, KV cache for {slo.context_tokens}×{slo.concurrency} "
              f"tokens, activations, overhead, 2 stream buffers): {minimum - limit} bytes missing. {fix}")
    return _decision(ask, None, "refused", 0, nbytes=0, pred=None, reason=reason, code="BudgetBelowElasticMinimum")


def _no_capacity(ask: _Ask, nbytes: int, group: _ProductSlots) -> Decision:
    best = group.by_free.largest()
    free = best.free if best else 0
    reason = (f"needs {fb(nbytes)} on a {ask.profile.gpu_product} but the most any slot has left is {fb(free)} "
              f"({len(group.states)} slots): {nbytes - free} bytes missing. Add a GPU, make room (remove a "
              f"model or lower another's memoryBudget), or lower slo.contextTokens/concurrency")
    return _decision(ask, None, "refused", 0, nbytes=0, pred=None, reason=reason, code="NoCapacity")


def _no_matching_gpu(model: ElasticModel, slots_by_product: dict[str, list[GpuSlot]]) -> Decision:
    have = ", ".join(sorted(slots_by_product)) or "none"
    wanted = model.gpu_product or "any"
    return Decision(
        name=model.name, namespace=model.namespace, model=model.model, gpu_product=model.gpu_product,
        slot=None, mode="refused", resident_layers=0, total_layers=0, need_bytes=0,
        budget_bytes=model.budget_bytes, footprint_bytes=0, predicted=None, slo_met=None,
        reason=(f"no GPU of product {wanted} in the inventory (products: {have}); fix spec.gpu.product or add "
                f"such a node (gpus.yaml, or nvidia.com/gpu.product node labels)"),
        reason_code="NoMatchingGPU",
    )


def _at_revision(revision: str) -> str:
    return "" if revision == "main" else f"@{revision}"


def _need_terms(ask: _Ask) -> str:
    n = ask.need
    slo = ask.model.slo
    return (f"{fb(n.total)} (weights {fb(n.weights)} + KV {fb(n.kv_cache)} for {slo.context_tokens}×"
            f"{slo.concurrency} tokens + activations {fb(n.activation)} + overhead {fb(n.overhead)})")
