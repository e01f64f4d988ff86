"""The fleet-scale planner: a greedy placement by the rules of docs/planner.md.

Owns the order models are placed in and where each goes: unchanged models keep their place; then the
models that must stream, then those that fit whole (resident by best fit, else a swap group, else a
re-packed slot, else elastic); then repairs for refused ones (residents stream, a TPOT-bound streamer
gives up its link); then the SLO repair (a resident that misses a target moves where it meets it). Over
several products (greedy_fleet), each model's product first, then the next product for one refused.
bench/plan_quality.py measures its gap to the exact solver. `place` places one model (the opening stage,
controller.planning.capacity, fills new pool nodes with it). Called by
controller.planning.plan (instances too large to solve exactly) and by controller.planning.plan_exact
(if the solver finds nothing).
"""
from __future__ import annotations

import bisect
import itertools

from controller.planning import cost
from controller.planning.readmit import readmit
from controller.planning.slots import (Ask, Layout, SlotState, alone_misses, apply, check, elastic_entries, is_tight,
                                      link_slack_ms, predictions, slo_fits)

SCAN = 32               # slots the greedy tries per step before it gives up on a mode
SLACK_MARGIN_MS = 1e-3  # predictions are rounded to 1 µs: a step beyond the slack by more breaks the limit
SLO_SCAN = 8            # of those, the best fits it predicts SLOs on (and the emptiest) before it takes the best fit


class _FreeIndex:
    """Slots sorted by free bytes, for best-fit and largest-free lookups in O(log n); the same for the
    "calm" slots (no streaming neighbour whose TPOT target bounds the link's sharing)."""

    def __init__(self, states: list[SlotState]):
        self.states = {s.position: s for s in states}  # positions are those of the whole plan's slots
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



def greedy_fleet(asks: list[Ask], states: list[SlotState], *, sticky: bool) -> tuple[list[SlotState], list[Ask]]:
    """The greedy over several GPU products. A model that may run on more than one (no spec.gpu.product) first
    goes to the product that meets its SLO alone and has the most room left for it; if that product refuses
    it, the next product that can take it does (a model is never refused while another product's GPU could
    serve it). Returns the states and the refused models (their preferred product's ask)."""
    choices: dict = {}
    for ask in asks:
        choices.setdefault(ask.key, []).append(ask)
    by_product: dict[str, list[SlotState]] = {}
    for state in states:
        by_product.setdefault(state.slot.product, []).append(state)
    first = _first_choices(choices, by_product)
    refused: dict = {}
    for product, group in sorted(_by_product(first).items()):
        refused.update((a.key, a) for a in greedy(group, by_product.get(product, []), sticky=sticky)[1])
    tried = {key: {ask.profile.gpu_product} for key, ask in ((a.key, a) for a in first)}
    while True:
        retry = {}
        for key in sorted(refused):
            nxt = next((a for a in choices[key] if a.profile.gpu_product not in tried[key]), None)
            if nxt is not None:
                retry[key] = nxt
                tried[key].add(nxt.profile.gpu_product)
        if not retry:
            break
        for product, group in sorted(_by_product(list(retry.values())).items()):
            placed = {a.key for a in group}
            for ask in greedy(group, by_product.get(product, []), sticky=False)[1]:
                placed.discard(ask.key)
                refused.setdefault(ask.key, ask)  # a streamer that gave its place up is refused here
            for key in placed:
                refused.pop(key, None)
    return states, [choices[key][0] for key in sorted(refused)]


def _by_product(asks: list[Ask]) -> dict[str, list[Ask]]:
    out: dict[str, list[Ask]] = {}
    for ask in asks:
        out.setdefault(ask.profile.gpu_product, []).append(ask)
    return out


def _first_choices(choices: dict, by_product: dict[str, list[SlotState]]) -> list[Ask]:
    """One ask per model: its only one, or (several products) the product where it meets its SLO alone,
    runs whole, and leaves the largest share of the product's memory free after the models bound to it."""
    products = {a.profile.gpu_product for options in choices.values() for a in options}
    capacity = {p: sum(s.slot.usable_bytes for s in by_product.get(p, [])) for p in products}
    load = dict.fromkeys(capacity, 0)
    for options in choices.values():
        if len(options) == 1:
            load[options[0].profile.gpu_product] += _size(options[0])
    out = [options[0] for options in choices.values() if len(options) == 1]
    for key in sorted(k for k, options in choices.items() if len(options) > 1):
        def rank(ask: Ask) -> tuple:
            p = ask.profile.gpu_product
            free = capacity[p] - load[p] - _size(ask)
            return (len(alone_misses(ask)), not ask.whole, free < 0, -free / max(capacity[p], 1))
        best = min(choices[key], key=rank)
        load[best.profile.gpu_product] += _size(best)
        out.append(best)
    return out


def _size(ask: Ask) -> int:
    return ask.need_bytes if ask.whole else ask.minimum.footprint


def greedy(asks: list[Ask], states: list[SlotState], *, sticky: bool) -> tuple[list[SlotState], list[Ask]]:
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
        loud = _loud(batch)
        for ask in sorted((a for a in batch if a.whole and a.key in loud), key=_whole_order):
            if not _place_whole(ask, states, index, kept):
                refused.append(ask)
        for ask in sorted((a for a in batch if not a.whole), key=_streaming_order):
            if not _place_elastic(ask, states, index, squeezed=False):
                refused.append(ask)
        for ask in sorted((a for a in batch if a.whole and a.key not in loud), key=_whole_order):
            if not _place_whole(ask, states, index, kept):
                refused.append(ask)
    # streaming residents frees bytes: it helps a model no slot had the bytes for
    most = max((s.free for s in states), default=0)
    refused = [a for a in refused if a.minimum.footprint <= most or not _stream_residents_to_admit(a, states, index,
                                                                                                   kept)]
    refused = _trade_streamers(refused, states, index, kept)
    if refused:  # models placed this pass make room: a swap group, a streaming neighbour... (controller.planning.readmit)
        left = readmit(refused, states, kept, lambda group, nearby: _place_each(group, nearby, kept), sticky=sticky)
        if len(left) < len(refused):
            index = _indexed(states)
        refused = left
    _slo_repair(states, index, kept)
    for state in states:  # a swap group of one (kept members whose partners left) is simply resident
        if len(state.swap) == 1:
            apply(state, check(state, state.resident + state.swap, [], elastic_entries(state)))
    return states, refused


def _place_each(asks: list[Ask], states: list[SlotState], kept: set) -> bool:
    """Each of `asks` in order on `states` by the rules above (whole: resident, swap, re-pack, else elastic);
    False at the first that no slot takes."""
    index = _indexed(states)
    return all(_place_whole(a, states, index, kept) if a.whole else _place_elastic(a, states, index, squeezed=False)
               for a in asks)


def _indexed(states: list[SlotState]) -> _FreeIndex:
    """A fresh index of `states`, the slots with a streaming model its TPOT target bounds marked as such."""
    index = _FreeIndex(states)
    for state in states:
        if any(is_tight(a, a.model.budget_bytes) for a, _, _ in state.elastic.values()):
            index.mark_tight(state)
    return index


def _whole_order(ask: Ask) -> tuple:
    """Those a swap-in would break first (they must stay resident), then the smaller first."""
    return (ask.swap_ok(), ask.need_bytes, ask.key)


def _place_whole(ask: Ask, states: list[SlotState], index: _FreeIndex, kept: set) -> bool:
    """Resident by best fit, else into a swap group, else a slot re-packs into one, else elastic."""
    return (_place_resident(ask, index) or _join_swap(ask, states, index) or _repack(ask, states, index, kept)
            or _place_elastic(ask, states, index, squeezed=True))


def _loud(batch: list[Ask]) -> set:
    """The models that fit whole and whose decode step alone exceeds the TPOT target of a streaming model of the
    batch that the target bounds: no slot may hold both (the link-share limit), so they are placed before the
    streaming models spread over every quiet slot."""
    bound = [a.slo.tpot_ms for a in batch if not a.whole and is_tight(a, a.model.budget_bytes)]
    if not bound:
        return set()
    least = min(bound)
    return {a.key for a in batch if a.whole and a.step_ms > least}


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
            entries = elastic_entries(state) + [(a, None, False) for a in streamed] + [(ask, None, False)]
            if _change(state, index, resident, state.swap, entries):
                state.squeezed.update(a.key for a in streamed + ([ask] if ask.whole else []))
                return True
    return False


def _trade_streamers(refused: list[Ask], states: list[SlotState], index: _FreeIndex, kept: set) -> list[Ask]:
    """A streaming model placed this pass gives its place up where that admits refused models: two or more
    (fewer refused), or one that then runs resident (as many refused, one fewer elastic). It is refused
    instead, unless another slot takes it. Models kept or placed by the last plan never give way."""
    for state in states:
        for key, (ask, _, fixed) in sorted(state.elastic.items()):
            if not refused:
                return refused
            if fixed or key in kept or ask.placed_before or key not in state.elastic:
                continue
            before = (list(state.resident), list(state.swap), elastic_entries(state))
            if not _change(state, index, before[0], before[1], [e for e in before[2] if e[0] is not ask]):
                continue
            resident, streamed = [], []
            for r in refused:
                if r.whole and _change(state, index, state.resident + [r], state.swap, elastic_entries(state)):
                    resident.append(r)
                elif _change(state, index, state.resident, state.swap, elastic_entries(state) + [(r, None, False)]):
                    streamed.append(r)
            if len(resident) + len(streamed) >= 2 or resident:
                state.squeezed.discard(key)
                state.squeezed.update(r.key for r in streamed if r.whole)
                refused = [r for r in refused if all(r is not a for a in resident + streamed)]
                if not _place_elastic(ask, states, index, squeezed=ask.whole):
                    refused.append(ask)
                continue
            _change(state, index, *before)  # undo: it keeps its place
    return refused


def _streaming_order(ask: Ask) -> tuple:
    """Models whose TPOT target limits their link share first (they need quiet links), smallest start
    first; then the rest, smallest elastic minimum first."""
    limit = ask.model.budget_bytes
    tight = is_tight(ask, limit)
    start = ask.start(1, limit) if tight else ask.minimum
    return (not tight, start.footprint if start else 0, ask.key)



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
        if _change(state, index, state.resident + [ask], state.swap, elastic_entries(state)):
            state.kept_bytes += ask.need_bytes
            return True
        return False
    if prev.mode == "swap":
        return _change(state, index, state.resident, state.swap + [ask], elastic_entries(state))
    piece = cost.elastic_slice_at(ask.profile, ask.slo, prev.resident_layers)
    if piece.footprint > ask.limit(state.slot) or prev.resident_layers >= ask.profile.total_layers:
        return False
    if _change(state, index, state.resident, state.swap, elastic_entries(state) + [(ask, piece, True)]):
        if ask.whole:
            state.squeezed.add(ask.key)
        if is_tight(ask, ask.limit(state.slot)):
            index.mark_tight(state)
        return True
    return False


def _place_resident(ask: Ask, index: _FreeIndex) -> bool:
    """Its last slot if it holds it, else best fit among the slots whose worker may serve it (packing tight keeps
    the large holes for the large models; the SLO repair moves it later if it then misses a target). A
    resident member changes only the slot's bytes and its co-tenants' decode time: where a swap group or a
    streaming model's SLO limit could be touched, the slot's limits are checked whole."""
    last = [s for s in [index.by_id.get(ask.last_slot)] if s is not None and s.free >= ask.need_bytes]
    tried = 0
    for state in last or index.at_least(ask.need_bytes):
        slack = link_slack_ms(state)
        if slack is not None and ask.step_ms > slack + SLACK_MARGIN_MS:
            continue  # its step alone would make a bound streaming model there miss its TPOT (the link-share limit)
        tried += 1
        if tried > SCAN and not last:
            return False
        if _clashes(state, ask):
            continue
        if state.swap or state.elastic:
            if _change(state, index, state.resident + [ask], state.swap, elastic_entries(state)):
                return True
            continue
        _add_resident(state, ask, index)
        return True
    return False


def _add_resident(state: SlotState, ask: Ask, index: _FreeIndex) -> None:
    before = state.free
    state.resident.append(ask)
    state.used += ask.need_bytes
    index.update(state, before)


def _slo_repair(states: list[SlotState], index: _FreeIndex, kept: set) -> None:
    """After every model has its place: a resident placed this pass that misses an SLO target moves to a slot
    with the room where it and every neighbour there then meet what they met (the SLO_SCAN best fits and the
    emptiest slot are tried). Leaving only shortens its old neighbours' steps, so no target is lost and no
    model refused; models kept from the last plan stay (the stability rule)."""
    for state in states:
        if not state.resident or state.swap or state.elastic:
            continue
        for ask in [a for a in state.resident if a.key not in kept and (a.slo.ttft_ms or a.slo.tpot_ms)]:
            if not cost.missed(ask.slo, predictions(state.resident, [], [])[ask.key]):
                continue
            emptiest = next(index.most_free(), None)
            tries = [s for s in list(itertools.islice(index.at_least(ask.need_bytes), SLO_SCAN)) + [emptiest]
                     if s is not None and s is not state and s.free >= ask.need_bytes and not s.swap
                     and not s.elastic]
            target = next((s for s in tries if not _clashes(s, ask) and slo_fits(s, ask)), None)
            if target is not None:
                before = state.free
                state.resident.remove(ask)
                state.used -= ask.need_bytes
                index.update(state, before)
                _add_resident(target, ask, index)


def _clashes(state: SlotState, ask: Ask) -> bool:
    """A render-time rule (controller.planning.slots.rule_broken) keeps `ask` off this slot's worker."""
    stamp = (len(state.resident), len(state.swap), len(state.elastic), state.used)
    if state.served is None or state.served[0] != stamp:
        members = state.members()
        state.served = (stamp, {a.model.composition for a in members}, {n for a in members for n in a.names})
    _, compositions, names = state.served
    return bool(compositions - {ask.model.composition}) or any(n in names for n in ask.names)


def _join_swap(ask: Ask, states: list[SlotState], index: _FreeIndex) -> bool:
    """Into an existing swap group whose area (grown if it must) still fits; tightest first."""
    if not ask.swap_ok():
        return False
    candidates = sorted((s for s in states if s.swap and s.free + s.swap_area >= ask.need_bytes),
                        key=lambda s: (s.free + s.swap_area, s.position))
    for state in candidates[:SCAN]:
        if _change(state, index, state.resident, state.swap + [ask], elastic_entries(state)):
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
        layout = check(state, fixed + must + can[k:], can[:k], elastic_entries(state))
        if layout is not None:
            return layout
    return None


def _place_elastic(ask: Ask, states: list[SlotState], index: _FreeIndex, *, squeezed: bool) -> bool:
    """Stream it where its start slice fits and its share of the link (and its neighbours') still holds:
    fewest streamers first, then the most free."""
    need = ask.minimum.footprint
    tight = is_tight(ask, ask.model.budget_bytes)
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
        if _change(state, index, state.resident, state.swap, elastic_entries(state) + [(ask, None, False)]):
            if squeezed:
                state.squeezed.add(ask.key)
            if tight:
                index.mark_tight(state)
            return True
    return False


def place(ask: Ask, states: list[SlotState], *, squeeze: bool = True) -> bool:
    """Place one model on `states` as the greedy places a model the last plan did not: whole by best fit, else
    into a swap group or a re-packed slot, else (`squeeze`) elastic; streaming where its budget makes it. True
    when placed. The opening stage (controller.planning.capacity) fills the pool nodes it opens with it, never
    streaming a model that fits whole (squeeze False): such a model gets a node where it runs whole."""
    index = _FreeIndex(states)
    if not ask.whole:
        return _place_elastic(ask, states, index, squeezed=False)
    if squeeze:
        return _place_whole(ask, states, index, set())
    return _place_resident(ask, index) or _join_swap(ask, states, index) or _repack(ask, states, index, set())
