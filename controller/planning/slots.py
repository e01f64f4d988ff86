"""One slot's state during placement, and the limits every planner checks a slot against.

Owns Ask (a model resolved against its profile), SlotState and NodeState (what a slot and its node
hold while a plan is built), `check` (bytes, the node's host RAM, the swap group's TTFT bound, the
link share of every streaming model) and `grow` (elastic slices into the room left). Used by the
greedy (controller.planning.greedy), the exact solver (controller.planning.plan_exact) and
controller.planning.plan; the rules are in docs/planner.md.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from controller.planning import cost
from controller.types import Decision, ElasticModel, GpuSlot, Profile


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

    used: int = 0          # bytes on the GPU, kept by apply() and grow()
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


def elastic_entries(state: SlotState) -> list:
    return [(a, p, fixed) for a, p, fixed in state.elastic.values()]



def is_tight(ask: Ask, limit: int) -> bool:
    """Its TPOT target bounds how many may share its link (it can meet the target, alone at least)."""
    return ask.slo.tpot_ms is not None and ask.meets_alone(limit)


def grow(states: list[SlotState]) -> None:
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
