"""The greedy's repair for the models its placement still refuses: make room by moving the models placed this pass.

Owns `readmit` (docs/planner.md, "Exact where small, greedy at scale"). For a refused model it tries the moves the
exact search would consider on a slot: the largest of the models there that may move (1, 2, ... up to MOVERS,
first any it may not share a worker with) make way, the refused model takes the slot (resident, into its swap
group, else streaming), and those that made way are placed again by the greedy's own rules on that slot and the
slots around it (resident by best fit, into a swap group or a slot re-packed into one, streaming beside another
model); one that no slot takes may in turn make room the same way (DEPTH deep), never moving a model this chain
moved. So a resident joins another in a swap group, or a streaming neighbour takes a resident's place, to let
the refused one in. The moves are made on copies of those few slots (their nodes' host RAM included) and kept
only where every model that made way is placed again and every limit holds on each slot changed (GPU bytes, the
node's host RAM, the render-time rules and the SLO limits, `slots.slo_limits_hold`): one fewer refused and none
newly refused, else nothing changes.

Who may move: models placed this pass (not kept from the last plan, not a kept slice). In a sticky pass the
models the last plan placed stay too, so re-planning a plan's own decisions moves nothing; in the plan without
stickiness that a pass falls back to where it refuses fewer, they may move, and the stability rule names the move.

Bounded work: at most SCAN slots per refused model, fewest bytes moved first, and NEARBY slots around each (the
most free, and those whose residents a re-pack or a swap group could take); a refused model like one that could
not be admitted (same profile, need, budget, SLO, composition) is not tried again until something moved.
Deterministic: every choice is ordered by bytes, then slot position, then name. Called by
controller.planning.greedy, which passes its placement of models on given slots (`place`).
"""
from __future__ import annotations

from collections.abc import Callable

from controller.planning.slots import (Ask, NodeState, SlotState, apply, check, elastic_entries, rule_broken,
                                      slo_limits_hold)

SCAN = 8     # slots tried as the room for one refused model
NEARBY = 8   # other slots the models that made way may go to
MOVERS = 4   # models that make way on one slot, at most
DEPTH = 1    # a model that made way may make way in turn this many times over

Place = Callable[[list[Ask], list[SlotState]], bool]


def readmit(refused: list[Ask], states: list[SlotState], kept: set, place: Place, *, sticky: bool) -> list[Ask]:
    """The models still refused after trying to make room for each, smallest first; `states` are changed in place
    where a model is admitted. `place(asks, slots)`: the greedy places each of `asks` in order on `slots`, False
    at the first it cannot place. `sticky`: models the last plan placed stay (in the plan without stickiness that
    the pass falls back to where it refuses fewer, they may move: the stability rule then names the move)."""
    movable = _kept_out(kept, sticky)
    rooms = _Rooms(movable)
    left, failed = [], set()
    for ask in sorted(refused, key=_order):
        shape = _shape(ask)
        if shape not in failed and _admit(ask, states, movable, rooms, place):
            failed.clear()  # the slots changed: what failed may fit now
        else:
            failed.add(shape)
            left.append(ask)
    return [a for a in refused if any(a is b for b in left)]


def _shape(ask: Ask) -> tuple:
    """What decides where a model fits, but its names: a model like one that could not be admitted is not either."""
    return (ask.profile.key, ask.need_bytes, ask.model.budget_bytes, ask.slo, ask.model.composition)


def _order(ask: Ask) -> tuple:
    return (_size(ask), ask.key)


def _size(ask: Ask) -> int:
    """The fewest bytes it can take on a slot: its need resident, or its start slice on a quiet link."""
    start = ask.start(1, ask.model.budget_bytes) or ask.minimum
    return min(ask.need_bytes, start.footprint) if ask.whole else start.footprint


def _kept_out(kept: set, sticky: bool) -> Callable[[Ask, SlotState], bool]:
    def movable(ask: Ask, state: SlotState) -> bool:
        entry = state.elastic.get(ask.key)
        return (ask.key not in kept and not (sticky and ask.placed_before)
                and not (entry is not None and entry[2]))
    return movable


def _admit(ask: Ask, states: list[SlotState], movable, rooms: _Rooms, place: Place, depth: int = 0) -> bool:
    """`ask` placed on `states` by making room; a model that made way and no slot takes may in turn make room
    (DEPTH deep), never moving a model this chain moved."""
    pool = _around(states, movable)
    for target, movers in _targets(ask, states, rooms):
        nearby = [target] + [s for s in pool if s is not target][:NEARBY]
        copies = _copies(nearby)
        room = copies[0]
        if not _without(room, movers) or not _take(room, ask):
            continue
        moved = {a.key for a in movers} | {ask.key}
        inner = _frozen(movable, moved)
        if all(place([m], copies) or (depth < DEPTH and _admit(m, copies, inner, _Rooms(inner), place, depth + 1))
               for m in sorted(movers, key=_order)) and all(_holds(c) for c in copies):
            _commit(copies, nearby)
            return True
    return False


def _frozen(movable, keys: set):
    return lambda ask, state: ask.key not in keys and movable(ask, state)


class _Rooms:
    """Per slot as it stands (cached until it changes): its movable models, largest first, and the bytes the
    slot frees when the first 1, 2, ... MOVERS of them leave; the compositions and served names of the others."""

    def __init__(self, movable):
        self.movable = movable
        self.cache: dict[int, tuple] = {}

    def of(self, state: SlotState) -> tuple:
        stamp = (state.used, state.host_used, len(state.resident), len(state.swap), len(state.elastic))
        hit = self.cache.get(state.position)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        members = state.members()
        movers = [a for a in members if self.movable(a, state)]
        stay = [a for a in members if not self.movable(a, state)]
        largest = sorted(movers, key=lambda a: (-_freed(state, {id(a)}), a.key))
        prefixes = [(largest[:n], _freed(state, {id(a) for a in largest[:n]}))
                    for n in range(1, min(len(largest), MOVERS) + 1)]
        value = (largest, prefixes, {a.model.composition for a in stay}, {n for a in stay for n in a.names},
                 {a.model.composition for a in movers}, {n for a in movers for n in a.names})
        self.cache[state.position] = (stamp, value)
        return value


def _targets(ask: Ask, states: list[SlotState], rooms: _Rooms) -> list[tuple[SlotState, list[Ask]]]:
    """(slot, the models that make way there): on each slot with movable models, its largest movable one, then
    the two largest, and so on up to MOVERS (first any it may not share a worker with), wherever `ask` then has
    the bytes; the fewest bytes moved first, at most SCAN."""
    out = []
    need = _size(ask)
    for state in states:
        largest, prefixes, compositions, names, moving, moving_names = rooms.of(state)
        if not largest or compositions - {ask.model.composition} or any(n in names for n in ask.names):
            continue
        clash = ([a for a in largest if rule_broken([a, ask]) is not None]
                 if moving - {ask.model.composition} or any(n in moving_names for n in ask.names) else [])
        if clash:  # those leave first, then the largest of the others
            rest = [a for a in largest if all(a is not b for b in clash)]
            prefixes = [(clash + rest[:n], _freed(state, {id(a) for a in clash + rest[:n]}))
                        for n in range(0, min(len(rest), MOVERS) + 1)]
        for leaving, freed in prefixes:
            if state.used - freed + need <= state.slot.usable_bytes:
                out.append((freed, len(leaving), state.position, state, leaving))
    return [(s, m) for *_, s, m in sorted(out, key=lambda t: t[:3])[:SCAN]]


def _freed(state: SlotState, gone: set[int]) -> int:
    """The GPU bytes the slot frees when the models in `gone` (by id) leave it."""
    area = max((a.need_bytes for a in state.swap if id(a) not in gone), default=0)
    return (sum(a.need_bytes for a in state.resident if id(a) in gone) + state.swap_area - area
            + sum(p.footprint for a, p, _ in state.elastic.values() if id(a) in gone))


def _take(state: SlotState, ask: Ask) -> bool:
    """`ask` onto the slot made room on: resident, else into its swap group, else streaming."""
    entries = elastic_entries(state)
    tries = ([(state.resident + [ask], state.swap, entries)] if ask.whole else [])
    tries += [(state.resident, state.swap + [ask], entries)] if ask.whole and state.swap and ask.swap_ok() else []
    tries.append((state.resident, state.swap, entries + [(ask, None, False)]))
    for resident, swap, elastic in tries:
        layout = check(state, resident, swap, elastic)
        if layout is not None:
            apply(state, layout)
            if ask.whole and ask.key in state.elastic:
                state.squeezed.add(ask.key)
            return True
    return False


def _around(states: list[SlotState], movable) -> list[SlotState]:
    """The slots the models that make way may go to, by position: the NEARBY // 2 with the most free bytes, then
    those a re-pack or a swap group could take them on (movable residents or a swap group, by the room a re-pack
    sees), NEARBY + 1 in all (one may be the slot they leave)."""
    if len(states) <= NEARBY + 1:
        return list(states)
    chosen = {s.position: s for s in sorted(states, key=lambda s: (-s.free, s.position))[:NEARBY // 2]}
    grouped = sorted((s for s in states if s.swap or any(movable(a, s) for a in s.resident)),
                     key=lambda s: (-(s.slot.usable_bytes - s.elastic_bytes - s.kept_bytes), s.position))
    for s in grouped:
        if len(chosen) > NEARBY:
            break
        chosen.setdefault(s.position, s)
    return sorted(chosen.values(), key=lambda s: s.position)


def _copies(states: list[SlotState]) -> list[SlotState]:
    """The slots as they are, on nodes copied once each (a node's other slots' host RAM stays counted)."""
    nodes: dict[str, NodeState] = {}
    out = []
    for s in states:
        node = nodes.setdefault(s.node.name, NodeState(s.node.name, s.node.host_bytes, s.node.used))
        copy = SlotState(s.slot, s.position, node, list(s.resident), list(s.swap),
                         {k: list(e) for k, e in s.elastic.items()}, set(s.squeezed))
        copy.used, copy.host_used, copy.elastic_bytes, copy.kept_bytes = s.used, s.host_used, s.elastic_bytes, s.kept_bytes
        out.append(copy)
    return out


def _without(state: SlotState, movers: list[Ask]) -> bool:
    """The slot with `movers` taken out (the others re-checked: their slices re-start at the link's new share)."""
    gone = {a.key for a in movers}
    layout = check(state, [a for a in state.resident if a.key not in gone], [a for a in state.swap if a.key not in gone],
                   [e for e in elastic_entries(state) if e[0].key not in gone])
    if layout is None:
        return False
    apply(state, layout)
    state.squeezed -= gone
    return True


def _holds(state: SlotState) -> bool:
    """Every limit on the slot as it stands: bytes, its node's host RAM, the render-time rules, the SLO limits."""
    pieces = [(a, p) for a, p, _ in state.elastic.values()]
    used = (sum(a.need_bytes for a in state.resident) + state.swap_area + sum(p.footprint for _, p in pieces))
    return (used <= state.slot.usable_bytes and state.node.fits(0) and rule_broken(state.members()) is None
            and slo_limits_hold(state.slot, state.resident, state.swap, pieces))


def _commit(copies: list[SlotState], originals: list[SlotState]) -> None:
    for copy, state in zip(copies, originals):
        state.resident, state.swap, state.elastic, state.squeezed = copy.resident, copy.swap, copy.elastic, copy.squeezed
        state.used, state.host_used, state.elastic_bytes = copy.used, copy.host_used, copy.elastic_bytes
        state.kept_bytes = copy.kept_bytes
        state.node.used = copy.node.used
        state.summary = state.served = state.slack = None
