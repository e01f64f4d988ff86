"""The occupancy planner: ElasticModels + profiles + GPU slots -> one decision per model.

Owns placement (which GPU slot) and mode (resident, swap, elastic, or refused); the
per-model arithmetic lives in controller.planning.cost. Pure and deterministic: no I/O, and
the result does not depend on input order. Called by the CLI (`gpushare plan`,
`explain`), by the reconcile pass and by bench/plan_quality.py.

The rules (docs/planner.md; docs/architecture.md has the design):
1. Each model picks its GPU product (its selector, else the profiled product where it
   fits without streaming, then the largest GPU, then by name). No profile for that
   product -> Pending (a profiler Job is needed); no such product -> refused. Products
   never share a node, so each product is planned on its own.
2. need <= limit = min(budget, slot usable) -> the model may run whole (resident, or swap
   when the slot cannot hold every whole model at once); otherwise it is elastic. An
   elastic model starts at the fewest resident layers that meet its TPOT target at its
   share of the host->device link (the elastic minimum without one); budget below the
   elastic minimum -> refused (BudgetBelowElasticMinimum). Slices grow into the room
   left only after every model has a place: a budget is a cap, never a reservation.
3. Limits of a slot: bytes (resident needs + the swap area, the largest member's need, +
   elastic slices) within its usable memory; pinned host copies (swap members' weights,
   elastic models' streamed layers) on all GPUs of a node within the node's host RAM; the
   worst swap-in wait of a swap group within each member's TTFT; and every streaming
   model's TPOT at its share of the link (the link divided among the elastic models and
   the swap group) within its target.
4. The objective, in order: no model the last plan placed is refused to admit others;
   fewest refused; fewest moves of models whose own inputs did not change (so a model keeps
   its slot and mode unless keeping it would refuse someone, and the reason names the move);
   fewest elastic; fewest swap; lowest predicted latency.
   Small instances are solved exactly (controller.planning.plan_exact, CP-SAT with a fixed seed
   and one worker: deterministic); larger ones by the greedy below, whose gap to the exact
   optimum bench/plan_quality.py measures.
5. The greedy: unchanged models keep their slot, mode and slice first. Then the models that
   must stream (smallest elastic start first), then those that fit whole (those a swap-in
   would break first, then smaller need first): resident in the slot with the least room
   that holds it; else into a swap group; else a slot re-packs its re-placeable residents
   into a swap group; else elastic where the link and bytes allow; else refused with the
   bytes missing. If that refuses a model that a plan without stickiness would place, the
   plan without stickiness wins and every moved model's reason says so.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Mapping

from controller.planning import cost
from contract.quantity import format_bytes as fb
from controller.types import Decision, ElasticModel, GpuSlot, Inputs, Pending, Plan, Predicted, Profile

EXACT_MAX_MODELS = 10   # per GPU product; beyond this the greedy plans (bench/plan_quality.py measures its gap)
EXACT_MAX_PAIRS = 40    # models × slots of one product
SCAN = 32               # slots the greedy tries per step before it gives up on a mode


@dataclass
class Ask:
    """One model resolved against its product's profile, with what the limits need to know about it."""

    model: ElasticModel
    profile: Profile
    need: cost.Need
    whole: bool                    # need <= min(budget, largest usable): may run resident or swap
    minimum: cost.ElasticSlice     # every layer streamed
    previous: Decision | None      # its last decision, when its own inputs are unchanged (sticky)
    placed_before: bool = False    # the last plan placed it (its inputs may have changed since)
    last_slot: str | None = None   # where the last plan placed it: tried first when it is re-placed
    _starts: dict = field(default_factory=dict, repr=False)

    @property
    def key(self) -> tuple[str, str]:
        return self.model.key

    slice_cache: dict = field(default_factory=dict, repr=False)  # shared by the asks of one plan

    def __post_init__(self):
        self.need_bytes = self.need.total

    @property
    def slices(self) -> list[cost.ElasticSlice]:
        """Its elastic slices by resident layers (computed once per profile, context and concurrency)."""
        key = (self.profile.key, self.slo.context_tokens, self.slo.concurrency)
        if key not in self.slice_cache:
            self.slice_cache[key] = cost.elastic_slices(self.profile, self.slo)
        return self.slice_cache[key]

    @property
    def slo(self):
        return self.model.slo

    def limit(self, slot: GpuSlot) -> int:
        return min(self.model.budget_bytes, slot.usable_bytes)

    def start(self, streamers: int, limit: int) -> cost.ElasticSlice | None:
        """Its elastic start slice with `streamers` models on the link; None when its share would break its
        TPOT target (or nothing fits `limit`). A target no slice meets even alone does not stop it: it is
        placed at the elastic minimum and reported as missed."""
        key = (streamers, limit)
        if key not in self._starts:
            piece = self.start_meeting(streamers, limit)
            if piece is None and self.minimum.footprint <= limit and not self.meets_alone(limit):
                piece = self.minimum
            self._starts[key] = piece
        return self._starts[key]

    def meets_alone(self, limit: int) -> bool:
        return self.start_meeting(1, limit) is not None

    def start_meeting(self, streamers: int, limit: int) -> cost.ElasticSlice | None:
        key = ("meeting", streamers, limit)
        if key not in self._starts:
            self._starts[key] = cost.smallest_slice_meeting(self.profile, self.slo, limit, streamers, self.slices)
        return self._starts[key]

    def keeps_tpot(self, piece: cost.ElasticSlice, streamers: int, limit: int) -> bool:
        """A slice kept from the last plan still meets TPOT at this share (or no slice ever could)."""
        if self.slo.tpot_ms is None or not self.meets_alone(limit):
            return True
        return cost.copy_ms(piece.streamed_bytes, self.profile, streamers) <= self.slo.tpot_ms

    def turn_ms(self, streamers: int) -> float:
        return cost.swap_turn_ms(self.profile, self.slo, streamers)

    def swap_room_ms(self, streamers: int) -> float | None:
        """How long it may wait for the other members' turns before its own swap-in breaks its TTFT;
        None without a TTFT target."""
        if self.slo.ttft_ms is None:
            return None
        own = cost.predict_resident(self.profile, self.slo).ttft_ms + cost.copy_ms(
            self.profile.weight_bytes, self.profile, streamers)
        return self.slo.ttft_ms - own

    def swap_ok(self) -> bool:
        room = self.swap_room_ms(1)
        return room is None or room >= 0


@dataclass
class NodeState:
    name: str
    host_bytes: int | None     # None: host RAM not planned
    used: int = 0

    def fits(self, extra: int) -> bool:
        return self.host_bytes is None or self.used + extra <= self.host_bytes


@dataclass
class SlotState:
    """One slot during placement. `elastic` maps a model key to [ask, slice, fixed] (fixed: kept from
    the last plan, never re-sliced or grown)."""

    slot: GpuSlot
    position: int
    node: NodeState
    resident: list[Ask] = field(default_factory=list)
    swap: list[Ask] = field(default_factory=list)
    elastic: dict = field(default_factory=dict)
    squeezed: set = field(default_factory=set)  # fit whole, streamed for lack of room

    used: int = 0          # bytes on the GPU, kept by apply() and _grow()
    host_used: int = 0     # pinned host bytes of this slot's models
    elastic_bytes: int = 0
    kept_bytes: int = 0    # residents kept from the last plan (a re-pack never moves them)

    @property
    def swap_area(self) -> int:
        return max((a.need_bytes for a in self.swap), default=0)

    @property
    def free(self) -> int:
        return self.usable - self.used

    def __post_init__(self):
        self.usable = self.slot.usable_bytes

    @property
    def streamers(self) -> int:
        """Elastic models: they stream every token, so they share the link all the time. A swap-in takes
        its share of the link too, but only while it runs (swap-ins use streamers + 1)."""
        return len(self.elastic)

    def members(self) -> list[Ask]:
        return self.resident + self.swap + [a for a, _, _ in self.elastic.values()]


@dataclass(frozen=True)
class Layout:
    """A candidate content of one slot, checked against every limit (see `check`)."""

    resident: tuple[Ask, ...]
    swap: tuple[Ask, ...]
    elastic: tuple[tuple[Ask, cost.ElasticSlice, bool], ...]
    used: int
    host: int


def check(state: SlotState, resident: list[Ask], swap: list[Ask], elastic: list[tuple[Ask, cost.ElasticSlice | None,
                                                                                       bool]]) -> Layout | None:
    """The layout if the slot can hold it: non-fixed elastic slices re-started at the new link share, bytes,
    the node's host RAM (beside what the node's other slots pin), the swap group's TTFT bound and every
    kept slice's TPOT at its share. `elastic` entries with slice None are new and start fresh."""
    streamers = len(elastic)
    pieces = []
    for ask, piece, fixed in elastic:
        if fixed:
            if not ask.keeps_tpot(piece, streamers, ask.limit(state.slot)):
                return None
        else:
            piece = ask.start(streamers, ask.limit(state.slot))
            if piece is None:
                return None
        pieces.append((ask, piece, fixed))
    used = (sum(a.need_bytes for a in resident) + max((a.need_bytes for a in swap), default=0)
            + sum(p.footprint for _, p, _ in pieces))
    if used > state.slot.usable_bytes:
        return None
    host = sum(a.profile.weight_bytes for a in swap) + sum(p.streamed_bytes for _, p, _ in pieces)
    while not state.node.fits(host - state.host_used):
        # host RAM is short: keep more layers of a re-sliced elastic model on the GPU (it then pins less)
        growable = [i for i, (a, p, fixed) in enumerate(pieces) if not fixed and p.resident_layers + 1 <
                    a.profile.total_layers and a.slices[p.resident_layers + 1].footprint <= a.limit(state.slot)]
        if not growable:
            return None
        i = max(growable, key=lambda j: (pieces[j][1].streamed_bytes, pieces[j][0].key))
        ask, piece, fixed = pieces[i]
        bigger = ask.slices[piece.resident_layers + 1]
        used += bigger.footprint - piece.footprint
        host -= piece.streamed_bytes - bigger.streamed_bytes
        if used > state.slot.usable_bytes:
            return None
        pieces[i] = (ask, bigger, fixed)
    if len(swap) > 1 and not swap_group_ok(swap, streamers + 1):
        return None
    return Layout(tuple(resident), tuple(swap), tuple(pieces), used, host)


def swap_group_ok(swap: list[Ask] | tuple[Ask, ...], streamers: int) -> bool:
    """Every member with a TTFT target can wait for all the other members' turns (the worst case under
    LRU: it was just evicted) plus its own swap-in."""
    turns = [a.turn_ms(streamers) for a in swap]
    total = sum(turns)
    for ask, turn in zip(swap, turns):
        room = ask.swap_room_ms(streamers)
        if room is not None and total - turn > room:
            return False
    return True


def apply(state: SlotState, layout: Layout) -> None:
    state.node.used += layout.host - state.host_used
    state.resident, state.swap = list(layout.resident), list(layout.swap)
    state.elastic = {a.key: [a, p, fixed] for a, p, fixed in layout.elastic}
    state.used, state.host_used = layout.used, layout.host
    state.elastic_bytes = sum(p.footprint for _, p, _ in layout.elastic)


def _elastic_entries(state: SlotState) -> list:
    return [(a, p, fixed) for a, p, fixed in state.elastic.values()]


class _FreeIndex:
    """Slots sorted by free bytes, for best-fit and largest-free lookups in O(log n); the same for the
    "calm" slots (no streaming neighbour whose TPOT target bounds the link's sharing)."""

    def __init__(self, states: list[SlotState]):
        self.states = states
        self.entries = sorted((s.free, s.position) for s in states)
        self.by_id = {s.slot.id: s for s in states}
        self.calm = list(self.entries)
        self.tight: set[int] = set()
        self.no_streamers = {s.position: None for s in states if not s.streamers}  # ordered by position

    def at_least(self, nbytes: int):
        """Slots with at least `nbytes` free, least room first."""
        for i in range(bisect.bisect_left(self.entries, (nbytes, -1)), len(self.entries)):
            yield self.states[self.entries[i][1]]

    def most_free(self, calm: bool = False):
        entries = self.calm if calm else self.entries
        for i in range(len(entries) - 1, -1, -1):
            yield self.states[entries[i][1]]

    def quiet(self, nbytes: int, count: int) -> list[SlotState]:
        """Up to `count` slots with no streaming model yet and `nbytes` free, by position."""
        out = []
        for p in self.no_streamers:
            if self.states[p].free >= nbytes:
                out.append(self.states[p])
                if len(out) >= count:
                    break
        return out

    def update(self, state: SlotState, before: int) -> None:
        del self.entries[bisect.bisect_left(self.entries, (before, state.position))]
        bisect.insort(self.entries, (state.free, state.position))
        if state.position not in self.tight:
            del self.calm[bisect.bisect_left(self.calm, (before, state.position))]
            bisect.insort(self.calm, (state.free, state.position))
        if state.streamers and state.position in self.no_streamers:
            del self.no_streamers[state.position]

    def mark_tight(self, state: SlotState) -> None:
        if state.position not in self.tight:
            self.tight.add(state.position)
            del self.calm[bisect.bisect_left(self.calm, (state.free, state.position))]


# ------------------------------------------------------------------------------------------- the pass

def plan(inputs: Inputs, previous: Mapping[tuple[str, str], Decision] | None = None, *,
         method: str = "auto") -> Plan:
    """method: "auto" (exact where small, else greedy), "exact" or "greedy" (the bench compares them)."""
    previous = previous or {}
    slots_by_product: dict[str, list[GpuSlot]] = {}
    for slot in sorted(inputs.slots, key=lambda s: (s.product, s.node, s.index)):
        slots_by_product.setdefault(slot.product, []).append(slot)
    profiles = {p.key: p for p in inputs.profiles}
    largest_usable = {p: max(s.usable_bytes for s in slots) for p, slots in slots_by_product.items()}

    decisions: list[Decision] = []
    pending: list[Pending] = []
    asks: dict[str, list[Ask]] = {}
    slice_cache: dict = {}
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
        ask = _resolve(model, profile, largest_usable[product], previous.get(model.key))
        ask.slice_cache = slice_cache
        limit = min(model.budget_bytes, largest_usable[product])
        if ask.minimum.footprint > limit:
            decisions.append(_refused_below_minimum(ask, limit, largest_usable[product]))
        else:
            asks.setdefault(product, []).append(ask)

    for product, group in asks.items():
        decisions.extend(plan_product(group, slots_by_product[product], method))
    decisions.sort(key=lambda d: d.key)
    pending.sort(key=lambda p: p.key)
    return Plan(decisions=tuple(decisions), pending=tuple(pending))


def plan_product(asks: list[Ask], slots: list[GpuSlot], method: str = "auto") -> list[Decision]:
    """Decisions for the models of one GPU product over its slots."""
    exact = method == "exact" or (method == "auto" and len(asks) <= EXACT_MAX_MODELS
                                  and len(asks) * len(slots) <= EXACT_MAX_PAIRS)
    if exact:
        from controller.planning import plan_exact  # OR-Tools loads only when a small instance needs it
        states, refused = plan_exact.solve(asks, _states(slots))
    else:
        states, refused = _greedy(asks, _states(slots), sticky=True)
        if refused and any(a.previous for a in asks):
            fresh_states, fresh_refused = _greedy(asks, _states(slots), sticky=False)
            if _refusals(fresh_refused) < _refusals(refused):
                states, refused = fresh_states, fresh_refused
    _grow(states)
    return _decisions(states, refused)


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
               minimum=minimum, previous=prev if unchanged else None,
               placed_before=prev is not None and prev.mode != "refused" and prev.slot is not None,
               last_slot=prev.slot if prev is not None and prev.mode != "refused" else None)


# ------------------------------------------------------------------------------------------- greedy

def _greedy(asks: list[Ask], states: list[SlotState], *, sticky: bool) -> tuple[list[SlotState], list[Ask]]:
    by_id = {s.slot.id: s for s in states}
    index = _FreeIndex(states)
    kept: set = set()
    if sticky:
        for ask in sorted((a for a in asks if a.previous is not None), key=lambda a: a.key):
            state = by_id.get(ask.previous.slot)
            if state is not None and _keep(state, ask, index):
                kept.add(ask.key)
    rest = [a for a in asks if a.key not in kept]
    # models the last plan placed go before new or refused ones: changing a budget never costs a model its place
    refused = []
    for first in (True, False):
        batch = [a for a in rest if a.placed_before == first]
        for ask in sorted((a for a in batch if not a.whole), key=_streaming_order):
            if not _place_elastic(ask, states, index, squeezed=False):
                refused.append(ask)
        for ask in sorted((a for a in batch if a.whole), key=lambda a: (a.swap_ok(), a.need_bytes, a.key)):
            if not (_place_resident(ask, index) or _join_swap(ask, states, index)
                    or _repack(ask, states, index, kept) or _place_elastic(ask, states, index, squeezed=True)):
                refused.append(ask)
    refused = [a for a in refused if not _stream_residents_to_admit(a, states, index, kept)]
    refused = _trade_tight_streamers(refused, states, index, kept)
    for state in states:  # a swap group of one (kept members whose partners left) is simply resident
        if len(state.swap) == 1:
            apply(state, check(state, state.resident + state.swap, [], _elastic_entries(state)))
    return states, refused


def _stream_residents_to_admit(ask: Ask, states: list[SlotState], index: _FreeIndex, kept: set) -> bool:
    """Fewer refused before fewer elastic: a model no slot took is admitted where re-placeable residents
    (not kept from the last plan) stream instead, the fewest of them, largest saving first."""
    def saving(a: Ask, s: SlotState) -> int:
        start = a.start(s.streamers + 1, a.limit(s.slot))
        return a.need_bytes - start.footprint if start is not None else 0
    def room(s: SlotState) -> int:
        return s.free + sum(max(0, saving(a, s)) for a in s.resident if a.key not in kept)
    candidates = sorted((s for s in states if room(s) >= ask.minimum.footprint), key=lambda s: (-room(s), s.position))
    for state in candidates[:SCAN]:
        movable = sorted((a for a in state.resident if a.key not in kept and saving(a, state) > 0),
                         key=lambda a: (-saving(a, state), a.key))
        for n in range(1, len(movable) + 1):
            streamed = movable[:n]
            resident = [a for a in state.resident if all(a is not m for m in streamed)]
            entries = _elastic_entries(state) + [(a, None, False) for a in streamed] + [(ask, None, False)]
            if _change(state, index, resident, state.swap, entries):
                state.squeezed.update(a.key for a in streamed + ([ask] if ask.whole else []))
                return True
    return False


def _trade_tight_streamers(refused: list[Ask], states: list[SlotState], index: _FreeIndex, kept: set) -> list[Ask]:
    """Fewer refused: a model whose TPOT target keeps its link to itself gives the link up where two or more
    refused models then fit on it (it is refused instead, unless another slot takes it)."""
    for state in states:
        if len(refused) < 2:
            break
        for key, (ask, _, fixed) in sorted(state.elastic.items()):
            if fixed or key in kept or ask.placed_before or not _tight(ask, ask.limit(state.slot)):
                continue
            before = (list(state.resident), list(state.swap), _elastic_entries(state))
            if not _change(state, index, before[0], before[1], [e for e in before[2] if e[0] is not ask]):
                continue
            admitted = [r for r in refused if _change(state, index, state.resident, state.swap,
                                                       _elastic_entries(state) + [(r, None, False)])]
            if len(admitted) >= 2:
                state.squeezed.discard(key)
                state.squeezed.update(r.key for r in admitted if r.whole)
                refused = [r for r in refused if all(r is not a for a in admitted)]
                if not _place_elastic(ask, states, index, squeezed=ask.whole):
                    refused.append(ask)
                break
            _change(state, index, *before)  # undo: it keeps its link
    return refused


def _streaming_order(ask: Ask) -> tuple:
    """Models whose TPOT target limits their link share first (they need quiet links), smallest start
    first; then the rest, smallest elastic minimum first."""
    limit = ask.model.budget_bytes
    tight = _tight(ask, limit)
    start = ask.start(1, limit) if tight else ask.minimum
    return (not tight, start.footprint if start else 0, ask.key)


def _tight(ask: Ask, limit: int) -> bool:
    """Its TPOT target bounds how many may share its link (it can meet the target, alone at least)."""
    return ask.slo.tpot_ms is not None and ask.meets_alone(limit)


def _change(state: SlotState, index: _FreeIndex, resident, swap, elastic) -> bool:
    layout = check(state, resident, swap, elastic)
    if layout is None:
        return False
    before = state.free
    apply(state, layout)
    index.update(state, before)
    return True


def _keep(state: SlotState, ask: Ask, index: _FreeIndex) -> bool:
    prev = ask.previous
    if prev.mode == "resident":
        if _change(state, index, state.resident + [ask], state.swap, _elastic_entries(state)):
            state.kept_bytes += ask.need_bytes
            return True
        return False
    if prev.mode == "swap":
        return _change(state, index, state.resident, state.swap + [ask], _elastic_entries(state))
    piece = cost.elastic_slice_at(ask.profile, ask.slo, prev.resident_layers)
    if piece.footprint > ask.limit(state.slot) or prev.resident_layers >= ask.profile.total_layers:
        return False
    if _change(state, index, state.resident, state.swap, _elastic_entries(state) + [(ask, piece, True)]):
        if ask.whole:
            state.squeezed.add(ask.key)
        if _tight(ask, ask.limit(state.slot)):
            index.mark_tight(state)
        return True
    return False


def _place_resident(ask: Ask, index: _FreeIndex) -> bool:
    """Its last slot if it holds it, else best fit; a resident member changes only the slot's bytes (no link
    share, host RAM or swap wait)."""
    last = [s for s in [index.by_id.get(ask.last_slot)] if s is not None and s.free >= ask.need_bytes]
    for state in last or index.at_least(ask.need_bytes):
        before = state.free
        state.resident.append(ask)
        state.used += ask.need_bytes
        index.update(state, before)
        return True
    return False


def _join_swap(ask: Ask, states: list[SlotState], index: _FreeIndex) -> bool:
    """Into an existing swap group whose area (grown if it must) still fits; tightest first."""
    if not ask.swap_ok():
        return False
    candidates = sorted((s for s in states if s.swap and s.free + s.swap_area >= ask.need_bytes),
                        key=lambda s: (s.free + s.swap_area, s.position))
    for state in candidates[:SCAN]:
        if _change(state, index, state.resident, state.swap + [ask], _elastic_entries(state)):
            return True
    return False


def _repack(ask: Ask, states: list[SlotState], index: _FreeIndex, kept: set) -> bool:
    """Form or grow a swap group on a slot: its re-placeable residents (not kept from the last plan) and the
    swap members, with `ask`, split into the largest that fit as residents and the rest as one group."""
    def room(s: SlotState) -> int:
        return s.slot.usable_bytes - s.elastic_bytes - s.kept_bytes
    candidates = sorted((s for s in states if room(s) >= ask.need_bytes), key=lambda s: (-room(s), s.position))
    for state in candidates[:SCAN]:
        fixed = [a for a in state.resident if a.key in kept]
        pool = [a for a in state.resident if a.key not in kept] + state.swap + [ask]
        layout = _split(state, fixed, pool)
        if layout is not None:
            before = state.free
            apply(state, layout)
            index.update(state, before)
            return True
    return False


def _split(state: SlotState, fixed: list[Ask], pool: list[Ask]) -> Layout | None:
    """Residents and a swap group from `pool`: members a swap-in would break stay resident; of the rest the
    largest go to the group (its area is the largest need) until the others fit beside it."""
    must = [a for a in pool if not a.swap_ok()]
    can = sorted((a for a in pool if a.swap_ok()), key=lambda a: (-a.need_bytes, a.key))
    for k in range(2, len(can) + 1):
        layout = check(state, fixed + must + can[k:], can[:k], _elastic_entries(state))
        if layout is not None:
            return layout
    return None


def _place_elastic(ask: Ask, states: list[SlotState], index: _FreeIndex, *, squeezed: bool) -> bool:
    """Stream it where its start slice fits and its share of the link (and its neighbours') still holds:
    fewest streamers first, then the most free."""
    need = ask.minimum.footprint
    tight = _tight(ask, ask.model.budget_bytes)
    candidates = []
    # a model without a TPOT bound goes where no bound neighbour streams, if any such slot has room
    for calm in ((False,) if tight else (True, False)):
        for state in index.most_free(calm):
            if state.free < need or len(candidates) >= SCAN:
                break
            candidates.append(state)
        if candidates:
            break
    quiet = index.quiet(need, SCAN)
    last = [s for s in [index.by_id.get(ask.last_slot)] if s is not None]
    for state in last + sorted({s.position: s for s in candidates + quiet}.values(),
                               key=lambda s: (s.streamers, -s.free, s.position)):
        if _change(state, index, state.resident, state.swap, _elastic_entries(state) + [(ask, None, False)]):
            if squeezed:
                state.squeezed.add(ask.key)
            if tight:
                index.mark_tight(state)
            return True
    return False


def _no_room_code(ask: Ask, states: list[SlotState], room: dict) -> tuple[str, dict]:
    """Why no slot takes it in the final plan, measured before slices grow (`room`: slot position -> (free
    bytes, free host bytes of its node)): NoCapacity when no slot has the bytes for its elastic minimum;
    else what stops it on those that have (HostMemoryFull or LinkShareTooSmall)."""
    roomy = [s for s in states if room[s.position][0] >= ask.minimum.footprint]
    best = max(states, key=lambda s: (room[s.position][0], -s.position), default=None)
    if not roomy:
        return "NoCapacity", {"free": room[best.position][0] if best else 0, "slots": len(states)}
    hosted = [s for s in roomy if s.node.host_bytes is None or room[s.position][1] >= ask.minimum.streamed_bytes]
    if not hosted:
        node = roomy[0].node
        return "HostMemoryFull", {"roomy": len(roomy), "node": node.name, "host": node.host_bytes or 0,
                                  "host_free": room[roomy[0].position][1]}
    fewest = min(hosted, key=lambda s: (s.streamers, s.position))
    return "LinkShareTooSmall", {"roomy": len(roomy), "slot": fewest.slot.id, "streamers": fewest.streamers,
                                 "neighbours": _names(fewest.members())}


def _grow(states: list[SlotState]) -> None:
    """Elastic slices placed this pass grow one layer at a time, in turn by name, into the room left."""
    for state in states:
        growing = sorted((e for e in state.elastic.values() if not e[2]), key=lambda e: e[0].key)
        free = state.free
        while growing:
            still = []
            for entry in growing:
                ask, piece, _ = entry
                k = piece.resident_layers + 1
                if k >= ask.profile.total_layers:
                    continue
                bigger = ask.slices[k]
                if bigger.footprint - piece.footprint <= free and bigger.footprint <= ask.limit(state.slot):
                    free -= bigger.footprint - piece.footprint
                    state.used += bigger.footprint - piece.footprint
                    state.elastic_bytes += bigger.footprint - piece.footprint
                    state.node.used -= piece.streamed_bytes - bigger.streamed_bytes
                    state.host_used -= piece.streamed_bytes - bigger.streamed_bytes
                    entry[1] = bigger
                    still.append(entry)
            growing = still


# ------------------------------------------------------------------------------------------- decisions

def _decisions(states: list[SlotState], refused: list[Ask]) -> list[Decision]:
    out = []
    for state in states:
        out.extend(_slot_decisions(state))
    if refused:
        room = _room_before_growth(states)
        for ask in refused:
            out.append(_refused(ask, *_no_room_code(ask, states, room)))
    return out


def _room_before_growth(states: list[SlotState]) -> dict:
    """Per slot position: (free bytes, free host bytes of its node) with every elastic slice at its start
    (growth only fills room nobody else could take), so a refusal reads the same in a re-plan that kept
    the grown slices."""
    n_host: dict[str, int] = {}
    out = {}
    for state in states:
        n = state.streamers
        grown = host_back = 0
        for ask, piece, _ in state.elastic.values():
            start = ask.start(n, ask.limit(state.slot)) or piece
            if start.resident_layers < piece.resident_layers:
                grown += piece.footprint - start.footprint
                host_back += start.streamed_bytes - piece.streamed_bytes
        n_host[state.node.name] = n_host.get(state.node.name, 0) + host_back
        out[state.position] = state.free + grown
    return {p: (free, (states[p].node.host_bytes or 0) - states[p].node.used - n_host[states[p].node.name])
            for p, free in out.items()}


def _shared_ms(state: SlotState) -> dict:
    """Per member: the co-tenants' GPU time inside one of its decode steps, when all of them decode at once.
    Resident models and the active swap member (the slowest, for the worst case) step back to back; an
    elastic model computes for one step per streamed pass, so it takes its step once per pass: its share
    of the member's step is step × (member's step ÷ the pass), at most one step."""
    n = state.streamers
    steps = {a.key: cost.decode_step_ms(a.profile, a.slo.concurrency) for a in state.members()}
    passes = {k: cost.copy_ms(piece.streamed_bytes, a.profile, n) for k, (a, piece, _) in state.elastic.items()}
    group = max((steps[a.key] for a in state.swap), default=0.0)
    resident = sum(steps[a.key] for a in state.resident)
    shared = {}
    for a in state.members():
        in_group = any(a is m for m in state.swap)
        base = resident + (0.0 if in_group else group) - (steps[a.key] if not in_group and a.key not in
                                                            state.elastic else 0.0)
        own = steps[a.key] + base
        bursts = sum(steps[k] * min(1.0, own / passes[k]) if passes[k] else steps[k]
                     for k in state.elastic if k != a.key)
        shared[a.key] = base + bursts
    return shared


def _slot_decisions(state: SlotState) -> list[Decision]:
    slot = state.slot
    n = state.streamers
    shared = _shared_ms(state)
    host = _host_terms(state)
    out = []
    for ask in state.resident:
        pred = cost.predict_resident(ask.profile, ask.slo, shared[ask.key])
        reason = (f"need {_need_terms(ask)} fits budget {fb(ask.model.budget_bytes)} and slot {slot.id} "
                  f"holds it beside the others")
        out.append(_decision(ask, slot, "resident", ask.profile.total_layers, nbytes=ask.need_bytes, pred=pred,
                             reason=reason + _shared_terms(ask, state, shared), code="FitsResident", host_bytes=0))
    turns = {a.key: a.turn_ms(n + 1) for a in state.swap}
    for ask in state.swap:
        wait = sum(turns.values()) - turns[ask.key]
        pred = cost.predict_swap(ask.profile, ask.slo, wait, shared[ask.key], n + 1)
        reason = (f"need {_need_terms(ask)} fits budget {fb(ask.model.budget_bytes)}, but the slot cannot hold "
                  f"every fitting model at once: it shares a {fb(state.swap_area)} swap area with "
                  f"{len(state.swap) - 1} other model(s) (PLAN.md lists them); swap-in {pred.swap_in_ms:g} ms = "
                  f"{fb(ask.profile.weight_bytes)} ÷ {pred.link_share_gbps:g} GB/s (its share of the link beside "
                  f"{n} elastic model(s)); worst wait for the others' turns {wait:g} ms (swap-in + minimum residency "
                  f"{cost.MIN_RESIDENCY_MS} ms + draining {cost.SWAP_DRAIN_TOKENS} steps each); {host}")
        out.append(_decision(ask, slot, "swap", ask.profile.total_layers, nbytes=ask.need_bytes, pred=pred,
                             reason=reason, code="SharesSwapArea", host_bytes=ask.profile.weight_bytes))
    for ask, piece, _ in sorted(state.elastic.values(), key=lambda e: e[0].key):
        pred = cost.predict_elastic(ask.profile, ask.slo, piece, n, shared[ask.key])
        limit = ask.limit(slot)
        squeezed = ask.key in state.squeezed
        if squeezed:
            why = (f"need {_need_terms(ask)} fits budget {fb(ask.model.budget_bytes)} but no {slot.product} slot "
                   f"has that much room beside the models placed before it")
        else:
            why = (f"need {_need_terms(ask)} > limit {fb(limit)} (budget {fb(ask.model.budget_bytes)}, "
                   f"slot usable {fb(slot.usable_bytes)})")
        reason = (f"{why}: keeps {piece.resident_layers}/{piece.total_layers} layers plus embeddings, head, KV, "
                  f"activations, overhead and 2 stream buffers ({fb(piece.buffer_bytes)}) = "
                  f"{fb(piece.footprint)}; streams {fb(piece.streamed_bytes)} per pass at "
                  f"{pred.link_share_gbps:g} GB/s (1/{n} of the {ask.profile.host_to_device_gbps:g} GB/s link"
                  f"{'; 1/' + str(n + 1) + ' while a swap-in runs' if state.swap else ''}); {host}")
        out.append(_decision(ask, slot, "elastic", piece.resident_layers, nbytes=piece.footprint, pred=pred,
                             reason=reason + _shared_terms(ask, state, shared),
                             code="ExceedsFreeSpace" if squeezed else "ExceedsBudget",
                             host_bytes=piece.streamed_bytes))
    return out


def _shared_terms(ask: Ask, state: SlotState, shared: dict) -> str:
    if not shared[ask.key]:
        return ""
    others = len(state.members()) - 1
    return (f"; TPOT counts {shared[ask.key]:.1f} ms of {others} co-tenant(s)' decode steps (all decoding at once) "
            f"on top of its own step {cost.decode_step_ms(ask.profile, ask.slo.concurrency):.1f} ms at "
            f"concurrency {ask.slo.concurrency}")


def _host_terms(state: SlotState) -> str:
    node = state.node
    if node.host_bytes is None:
        return f"host RAM of node {node.name} not planned (no hostMemory / node memory)"
    return f"node {node.name} pins {fb(node.used)} of {fb(node.host_bytes)} host RAM"


def _decision(ask: Ask, slot: GpuSlot | None, mode: str, layers: int, *, nbytes: int, pred: Predicted | None,
              reason: str, code: str, host_bytes: int = 0) -> Decision:
    slo = ask.model.slo
    misses = cost.slo_misses(slo, pred) if pred is not None else []
    has_targets = slo.ttft_ms is not None or slo.tpot_ms is not None
    if misses:
        reason += "; SLO missed: " + ", ".join(misses)
    prev = ask.previous
    if slot is not None and prev is not None and (prev.slot, prev.mode) != (slot.id, mode):
        reason += (f"; moved from {prev.slot} ({prev.mode}): keeping it there would have refused a model "
                   f"this plan places")
    if ask.profile.estimated and pred is not None:
        reason += "; predictions from an estimated profile (not measured)"
    return Decision(
        name=ask.model.name, namespace=ask.model.namespace, model=ask.model.model,
        gpu_product=ask.profile.gpu_product, slot=slot.id if slot else None, mode=mode,
        resident_layers=layers, total_layers=ask.profile.total_layers, need_bytes=ask.need_bytes,
        budget_bytes=ask.model.budget_bytes, footprint_bytes=nbytes, predicted=pred,
        slo_met=(not misses) if (has_targets and pred is not None) else None,
        reason=reason, reason_code=code, profile=f"{ask.profile.model}@{ask.profile.gpu_product}",
        estimated=ask.profile.estimated, host_bytes=host_bytes,
        dtype=ask.profile.dtype, terms=ask.profile.terms,
    )


def _refused_below_minimum(ask: Ask, limit: int, usable: int) -> Decision:
    minimum = ask.minimum.footprint
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


def _refused(ask: Ask, code: str, info: dict) -> Decision:
    nbytes = ask.minimum.footprint
    if code == "LinkShareTooSmall":
        share = cost.link_share_gbps(ask.profile, info["streamers"] + 1)
        own = (f"; its TPOT {ask.slo.tpot_ms:g} ms needs about "
               f"{ask.minimum.streamed_bytes / (ask.slo.tpot_ms * 1e-3) / cost.GB:.3g} GB/s at its elastic minimum"
               if ask.slo.tpot_ms else "")
        reason = (f"{info['roomy']} slot(s) had room for its elastic minimum {fb(nbytes)}, but streaming there it "
                  f"would share the host→device link with at least {info['streamers']} streaming model(s) "
                  f"({', '.join(info['neighbours'])} on {info['slot']}): {share:g} GB/s each{own}, and a "
                  f"share that small breaks its TPOT target or a neighbour's. Raise memoryBudget (more resident "
                  f"layers stream less), relax slo.tpotMs, or add a GPU")
    elif code == "HostMemoryFull":
        missing = ask.minimum.streamed_bytes - info["host_free"]
        reason = (f"{info['roomy']} slot(s) had room for its elastic minimum {fb(nbytes)}, but it would pin "
                  f"{fb(ask.minimum.streamed_bytes)} of host RAM where node {info['node']} had "
                  f"{fb(info['host_free'])} left of {fb(info['host'])}: {missing} bytes missing. Add host RAM "
                  f"or a node, or make room (fewer swap members or streamed layers there)")
    else:
        free = info["free"]
        reason = (f"needs {fb(nbytes)} on a {ask.profile.gpu_product} but the most any slot had left is {fb(free)} "
                  f"({info['slots']} slots): {nbytes - free} bytes missing. Add a GPU, make room (remove a "
                  f"model or lower another's memoryBudget), or lower slo.contextTokens/concurrency")
    return _decision(ask, None, "refused", 0, nbytes=0, pred=None, reason=reason, code=code)


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


def _names(asks: list[Ask]) -> list[str]:
    return sorted(a.model.name for a in asks)


def _at_revision(revision: str) -> str:
    return "" if revision == "main" else f"@{revision}"


def _need_terms(ask: Ask) -> str:
    n = ask.need
    slo = ask.model.slo
    return (f"{fb(n.total)} (weights {fb(n.weights)} + KV {fb(n.kv_cache)} for {slo.context_tokens}×"
            f"{slo.concurrency} tokens + activations {fb(n.activation)} + overhead {fb(n.overhead)})")
