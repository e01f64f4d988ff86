"""How the elastic slices placed this pass end up: one rule, whichever planner placed them (docs/planner.md).

Owns `grow`, called by controller.planning.plan once every model has its place. On each slot the slices not
kept from the last plan are set by one rule, the same for the exact solver's plan and the greedy's:
1. each starts at its start slice at the slot's final link share (the fewest resident layers that meet its TPOT
   target there; the elastic minimum without one);
2. where the node's host RAM is short, they keep one more layer on the GPU each, in turn by name, until what the
   node pins fits (`slots.pin_less`, the turn `check` uses while placing);
3. then they grow into the bytes left, one layer each in turn by name, within each model's budget, while the SLO
   limits hold (a slice that streams less passes sooner, so its step takes more of a co-tenant's time).
So the room left is shared out a layer per model in turn: a fair share, never all of it to one model. A slot
the rule cannot make hold (which the placement's own slices did) keeps those slices and grows them by step 3.
"""
from __future__ import annotations

from controller.planning import cost
from controller.planning.slots import SlotState, is_tight, pin_less, slo_limits_hold


def grow(states: list[SlotState]) -> None:
    for state in states:
        turn = sorted((e for e in state.elastic.values() if not e[2]), key=lambda e: e[0].key)
        if turn:
            _restart(state, turn)
            _into_room(state, turn)


def _set(state: SlotState, entry: list, piece: cost.ElasticSlice) -> None:
    """One slice replaced, with the slot's and its node's bytes."""
    old = entry[1]
    state.used += piece.footprint - old.footprint
    state.elastic_bytes += piece.footprint - old.footprint
    state.host_used += piece.streamed_bytes - old.streamed_bytes
    state.node.used += piece.streamed_bytes - old.streamed_bytes
    entry[1] = piece


def _holds(state: SlotState) -> bool:
    pieces = [(a, p) for a, p, _ in state.elastic.values()]
    return (state.used <= state.slot.usable_bytes and state.node.fits(0)
            and slo_limits_hold(state.slot, state.resident, state.swap, pieces))


def _restart(state: SlotState, turn: list[list]) -> None:
    """Steps 1 and 2; the placement's slices stay where the rule's do not hold."""
    placed = [e[1] for e in turn]
    n = len(state.elastic)
    starts = [a.start(n, a.limit(state.slot)) for a, _, _ in turn]
    if any(s is None for s in starts):
        return
    for entry, start in zip(turn, starts):
        _set(state, entry, start)
    over = 0 if state.node.host_bytes is None else state.node.used - state.node.host_bytes
    if over > 0:
        pieces = [list(e) for e in turn]
        if pin_less(pieces, state.slot, state.used, over) is not None:
            for entry, (_, piece, _) in zip(turn, pieces):
                _set(state, entry, piece)
    if not _holds(state):
        for entry, piece in zip(turn, placed):
            _set(state, entry, piece)


def _into_room(state: SlotState, turn: list[list]) -> None:
    """Step 3: a layer each in turn by name while one fits in the bytes left, the budget and the SLO limits."""
    # a shorter pass lengthens a swap member's wait or another bound streaming model's TPOT, never its own
    bound = len(state.swap) > 1 or len(state.elastic) > 1 and any(
        is_tight(a, a.limit(state.slot)) for a, _, _ in state.elastic.values())
    growing = list(turn)
    while growing:
        still = []
        for entry in growing:
            ask, piece, _ = entry
            k = piece.resident_layers + 1
            if k >= ask.profile.total_layers:
                continue
            bigger = ask.slices[k]
            if bigger.footprint - piece.footprint > state.free or bigger.footprint > ask.limit(state.slot):
                continue
            _set(state, entry, bigger)
            if bound and not slo_limits_hold(state.slot, state.resident, state.swap,
                                             [(a, p) for a, p, _ in state.elastic.values()]):
                _set(state, entry, piece)
                continue
            still.append(entry)
        growing = still
