"""One slot's state during placement, and the limits every planner checks a slot against.

Owns Ask (a model resolved against its profile), SlotState and NodeState (what a slot and its node
hold while a plan is built), `check` (bytes, the node's host RAM, the swap group's TTFT bound, the
link share of every streaming model) and `pin_less` (slices keep more layers, in turn, where host RAM is
short). Used by the greedy (controller.planning.greedy), the exact solver (controller.planning.plan_exact),
the growth of slices (controller.planning.growth) and controller.planning.plan; the rules are in
docs/planner.md.
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

    slice_cache: dict = field(default_factory=dict, repr=False)  # shared by the asks of one plan

    def __post_init__(self):
        self.need_bytes = self.need.total
        self.key: tuple[str, str] = self.model.key
        # the names a worker serves it under: its name, then its spec.servedNames
        self.names: tuple[str, ...] = tuple(dict.fromkeys((self.model.name, *self.model.served_names)))

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
        """Its elastic start slice with `streamers` models on the link: where its TPOT target bounds it
        (`is_tight`), the fewest resident layers whose streaming meets the target at that share, None when no
        slice within `limit` does; else the elastic minimum (None when that exceeds `limit`)."""
        key = (streamers, limit)
        if key not in self._starts:
            if is_tight(self, limit):
                self._starts[key] = self.start_meeting(streamers, limit)
            else:
                self._starts[key] = self.minimum if self.minimum.footprint <= limit else None
        return self._starts[key]

    def meets_alone(self, limit: int) -> bool:
        """It meets its TPOT target streaming alone on a GPU (the whole link, no co-tenant busy): the alone
        figure of predict_elastic at the fewest resident layers within `limit` that stream within it. Only
        then does the target bound where it may stream; a target it misses even alone is reported missed."""
        key = ("alone", limit)
        if key not in self._starts:
            piece = self.start_meeting(1, limit)
            self._starts[key] = piece is not None and not cost.missed(
                self.slo, cost.predict_elastic(self.profile, self.slo, piece))
        return self._starts[key]

    def start_meeting(self, streamers: int, limit: int) -> cost.ElasticSlice | None:
        key = ("meeting", streamers, limit)
        if key not in self._starts:
            self._starts[key] = cost.smallest_slice_meeting(self.profile, self.slo, limit, streamers, self.slices)
        return self._starts[key]

    def keeps_tpot(self, piece: cost.ElasticSlice, streamers: int, limit: int) -> bool:
        """A slice kept from the last plan still streams within its TPOT target at this share (or the target
        does not bound it): the streaming term of the link-share limit, checked before the whole of it."""
        return not is_tight(self, limit) or cost.streams_within(self.profile, self.slo, piece, streamers)

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

    @property
    def step_ms(self) -> float:
        """One decode step at its concurrency, alone on the GPU."""
        if "step" not in self._starts:
            self._starts["step"] = cost.decode_step_ms(self.profile, self.slo.concurrency)
        return self._starts["step"]

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
    summary: tuple | None = None  # slo_fits' bounds, with the slot's state they were computed at
    served: tuple | None = None   # the compositions and served names of its models, likewise (greedy's rule check)
    slack: tuple | None = None    # link_slack_ms, likewise

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
    if not state.node.fits(host - state.host_used):
        # host RAM is short: the re-sliced elastic models keep more layers on the GPU (they then pin less)
        turn = [[a, p, fixed] for a, p, fixed in pieces]
        used = pin_less(turn, state.slot, used, state.node.used + host - state.host_used - state.node.host_bytes)
        if used is None:
            return None
        pieces = [(a, p, fixed) for a, p, fixed in turn]
        host = sum(a.profile.weight_bytes for a in swap) + sum(p.streamed_bytes for _, p, _ in pieces)
    if rule_broken(resident + swap + [a for a, _, _ in pieces]) is not None:
        return None
    if not slo_limits_hold(state.slot, resident, swap, [(a, p) for a, p, _ in pieces]):
        return None
    return Layout(tuple(resident), tuple(swap), tuple(pieces), used, host)


def slo_limits_hold(slot: GpuSlot, resident: list[Ask], swap: list[Ask], pieces: list[tuple[Ask, cost.ElasticSlice]]) -> bool:
    """The SLO limits, judged by the prediction the decisions carry and the verdict uses (`predictions`: every
    co-tenant decoding at once; docs/planner.md, "One definition of a met SLO"). Swap wait: in a group of two
    or more, each member with a TTFT target meets it after the worst wait for the others' turns and its own
    swap-in. Link share: each streaming model whose TPOT target bounds it (`is_tight`) meets it, the larger of
    its streaming at its share and its step with the co-tenants' steps."""
    waiting = [a for a in swap if a.slo.ttft_ms is not None] if len(swap) >= 2 else []
    streaming = [a for a, _ in pieces if is_tight(a, a.limit(slot))]
    if not waiting and not streaming:
        return True
    predicted = predictions(resident, swap, pieces, only={a.key for a in waiting + streaming})
    return (not any("ttft" in cost.missed(a.slo, predicted[a.key]) for a in waiting)
            and not any("tpot" in cost.missed(a.slo, predicted[a.key]) for a in streaming))


def predictions(resident: list[Ask], swap: list[Ask], pieces: list[tuple[Ask, cost.ElasticSlice]],
                only: set | None = None) -> dict:
    """Per member key (those in `only`, if given): its predicted TTFT/TPOT on a slot with this layout, co-tenants
    all decoding at once: the one computation behind the decisions, the SLO limits and the planners' SLO
    objective."""
    n = len(pieces)
    shared = shared_ms(resident, swap, pieces, only)
    turns = {a.key: a.turn_ms(n + 1) for a in swap}
    out = {}
    for ask in resident:
        if ask.key in shared:
            out[ask.key] = cost.predict_resident(ask.profile, ask.slo, shared[ask.key])
    for ask in swap:
        if ask.key in shared:
            wait = sum(turns.values()) - turns[ask.key]
            out[ask.key] = cost.predict_swap(ask.profile, ask.slo, wait, shared[ask.key], n + 1)
    for ask, piece in pieces:
        if ask.key in shared:
            out[ask.key] = cost.predict_elastic(ask.profile, ask.slo, piece, n, shared[ask.key])
    return out


def shared_ms(resident: list[Ask], swap: list[Ask], pieces: list[tuple[Ask, cost.ElasticSlice]],
              only: set | None = None) -> dict:
    """Per member key (those in `only`, if given): the co-tenants' GPU time inside one of its decode steps, when
    all of them decode at once. Resident models and the active swap member (the slowest, for the worst case)
    step back to back; an elastic model computes for one step per streamed pass, so it takes its step once per
    pass: its share of the member's step is step × (member's step ÷ the pass), at most one step."""
    n = len(pieces)
    streaming = [(a.key, a.step_ms, cost.copy_ms(piece.streamed_bytes, a.profile, n)) for a, piece in pieces]
    group = max((a.step_ms for a in swap), default=0.0)
    in_resident = sum(a.step_ms for a in resident)
    shared = {}
    for members, base_of in ((resident, lambda a: in_resident - a.step_ms + group), (swap, lambda a: in_resident),
                             ([a for a, _ in pieces], lambda a: in_resident + group)):
        for a in members:
            if only is not None and a.key not in only:
                continue
            base = base_of(a)
            own = a.step_ms + base
            shared[a.key] = base + sum(step * min(1.0, own / pass_ms) if pass_ms else step
                                       for key, step, pass_ms in streaming if key != a.key)
    return shared


def slo_fits(state: SlotState, ask: Ask) -> bool:
    """Adding `ask` resident to the slot leaves every SLO target met that was met: its own and its co-tenants'
    (a resident or swap co-tenant's TPOT grows by its step at least; any co-tenant's by at most its step
    and the elastic models' steps). Decided by these bounds: where they leave it open, it does not fit."""
    fixed, streamed, slack, whole_slack = _summary(state)
    if not _has_targets(ask) and slack is None:
        return True
    if cost.missed(ask.slo, cost.predict_resident(ask.profile, ask.slo, fixed)):
        return False
    if whole_slack is not None and whole_slack < ask.step_ms:
        return False
    own_ok = not cost.missed(ask.slo, cost.predict_resident(ask.profile, ask.slo, fixed + streamed))
    return own_ok and (slack is None or slack >= ask.step_ms + streamed)


def _summary(state: SlotState) -> tuple:
    """(GPU time a new resident shares with the residents and the swap group; the elastic models' steps, at
    most what they add; the least room left under a met target of any member, and of a resident or swap
    member; None where no such target). Cached until the slot changes."""
    stamp = (state.used, state.host_used, len(state.resident), len(state.swap), len(state.elastic))
    if state.summary is not None and state.summary[0] == stamp:
        return state.summary[1]
    fixed = sum(a.step_ms for a in state.resident) + max((a.step_ms for a in state.swap), default=0.0)
    streamed = sum(a.step_ms for a, _, _ in state.elastic.values())
    rooms: dict[bool, list[float]] = {True: [], False: []}
    targeted = [a for a in state.members() if _has_targets(a)]
    if targeted:
        pieces = [(a, p) for a, p, _ in state.elastic.values()]
        now = predictions(state.resident, state.swap, pieces)
        for a in targeted:
            pred = now[a.key]
            for target, value in ((a.slo.ttft_ms, pred.ttft_ms), (a.slo.tpot_ms, pred.tpot_ms)):
                if target is not None and value <= target:
                    rooms[a.key in state.elastic].append(target - value)
    every = rooms[True] + rooms[False]
    result = (fixed, streamed, min(every) if every else None, min(rooms[False]) if rooms[False] else None)
    state.summary = (stamp, result)
    return result


def link_slack_ms(state: SlotState) -> float | None:
    """The least room left under the TPOT target of the streaming models on the slot that it bounds (`is_tight`):
    target − (its step + the co-tenants' steps, all decoding at once), the decode part of the link-share limit;
    None where none is bound. A new resident adds at least its own step to each, so one whose step exceeds
    this breaks the limit there: the greedy skips such a slot before checking it whole. Cached until the slot
    changes."""
    stamp = (state.used, state.host_used, len(state.resident), len(state.swap), len(state.elastic))
    if state.slack is not None and state.slack[0] == stamp:
        return state.slack[1]
    bound = [a for a, _, _ in state.elastic.values() if is_tight(a, a.limit(state.slot))]
    result = None
    if bound:
        pieces = [(a, p) for a, p, _ in state.elastic.values()]
        shared = shared_ms(state.resident, state.swap, pieces, only={a.key for a in bound})
        result = min(a.slo.tpot_ms - a.step_ms - shared[a.key] for a in bound)
    state.slack = (stamp, result)
    return result


def alone_misses(ask: Ask) -> tuple[str, ...]:
    """The targets it misses alone on a GPU of its product: whole when it may run whole, else streaming at
    its start slice with the link to itself."""
    if ask.whole:
        return cost.missed(ask.slo, cost.predict_resident(ask.profile, ask.slo))
    piece = ask.start(1, ask.model.budget_bytes) or ask.minimum
    return cost.missed(ask.slo, cost.predict_elastic(ask.profile, ask.slo, piece))


def _has_targets(ask: Ask) -> bool:
    return ask.slo.ttft_ms is not None or ask.slo.tpot_ms is not None


def rule_broken(members: list[Ask]) -> tuple[str, Ask, Ask] | None:
    """The first render-time rule these models on one slot break, as (reason, the model, the one it clashes
    with): one composition per GPU (MixedCompositions: each composition's worker claims the GPU) and each
    served name once per worker (ServedNameTaken). controller.rendering.compose refuses the same."""
    names = [n for a in members for n in a.names]
    if len({a.model.composition for a in members}) <= 1 and len(set(names)) == len(names):
        return None
    composition: dict[str, Ask] = {}
    served: dict[str, Ask] = {}
    for ask in sorted(members, key=lambda a: a.key):
        first = next(iter(composition.values()), None)
        if first is not None and ask.model.composition not in composition:
            return ("MixedCompositions", ask, first)
        composition.setdefault(ask.model.composition, ask)
        for name in ask.names:
            if name in served:
                return ("ServedNameTaken", ask, served[name])
            served[name] = ask
    return None


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


def pin_less(pieces: list[list], slot: GpuSlot, used: int, over: int) -> int | None:
    """Host RAM short by `over` bytes: the slices of `pieces` ([ask, slice, fixed] each) that are not fixed keep one
    more decoder layer on the GPU each, in turn by name, until they pin `over` bytes less (docs/planner.md: the
    turn the slices grow in). `pieces` changes in place; returns the GPU bytes then in use (`used` before), or
    None where the slices run out of layers, budget or the slot's bytes first."""
    turn = sorted((e for e in pieces if not e[2]), key=lambda e: e[0].key)
    while over > 0:
        moved = False
        for entry in turn:
            ask, piece, _ = entry
            if piece.resident_layers + 1 >= ask.profile.total_layers:
                continue
            bigger = ask.slices[piece.resident_layers + 1]
            if bigger.footprint > ask.limit(slot) or used + bigger.footprint - piece.footprint > slot.usable_bytes:
                continue
            used += bigger.footprint - piece.footprint
            over -= piece.streamed_bytes - bigger.streamed_bytes
            entry[1] = bigger
            moved = True
            if over <= 0:
                break
        if not moved:
            return None
    return used
