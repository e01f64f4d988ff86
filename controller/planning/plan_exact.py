"""The exact planner for small instances: one GPU product's models and slots as a CP-SAT model.

Owns the integer model of the planner's rules and objective (docs/planner.md); the final layout of
each slot goes through controller.planning.slots (`check`), so both planners judge a slot alike.
Deterministic: the model is built in sorted order and solved with a fixed seed, one worker
and a deterministic time limit. Called by controller.planning.plan.plan_product (method "auto" on
small instances, or "exact") and, through it, by bench/plan_quality.py.

Variables: x[a, s, o] = model a takes option o on slot s; options are resident, swap,
elastic with at most c streaming models on the link (its start slice at that share), and
for a model whose inputs did not change, its previous placement kept as it was.
Objective, lexicographic through weights: models the last plan placed that are refused; refused;
moved (an unchanged model not kept as it
was, or a model the last plan placed now refused); elastic; swap; predicted streaming latency;
then a canonical tie-break (by name, earlier slots first; refusing later names first).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ortools.sat.python import cp_model

from controller.planning import cost
from controller.planning.greedy import greedy
from controller.planning.slots import Ask, SlotState, apply, check

SEED = 0
DETERMINISTIC_LIMIT_S = 10.0  # the solver's own deterministic time (not wall-clock): same result every run
LATENCY_UNIT_MS = 10          # the latency term counts streaming time in steps of 10 ms ...
LATENCY_CAP = 10_000          # ... up to 100 s per model
HOST_STEPS = 16               # larger slices offered where host RAM is limited (they pin less)


@dataclass(frozen=True)
class _Option:
    ask: Ask
    state: SlotState
    mode: str                      # resident, swap, elastic
    piece: cost.ElasticSlice | None = None
    cap: int | None = None         # elastic: at most this many streaming models on the link
    keep: bool = False             # the previous placement, kept as it was
    latency: int = 0               # streaming time per token (swap: the swap-in), in LATENCY_UNIT_MS


def solve(asks: list[Ask], states: list[SlotState]) -> tuple[list[SlotState], list[Ask]]:
    asks = sorted(asks, key=lambda a: a.key)
    n_asks = len(asks)
    options = [o for a in asks for s in states for o in _options(a, s, n_asks)]
    model = cp_model.CpModel()
    x = [model.NewBoolVar(f"x{i}") for i in range(len(options))]
    by_ask: dict = {a.key: [] for a in asks}
    for var, opt in zip(x, options):
        by_ask[opt.ask.key].append((var, opt))
    placed = {}
    for a in asks:
        model.AddAtMostOne(v for v, _ in by_ask[a.key])
        placed[a.key] = sum(v for v, _ in by_ask[a.key])

    n_max = n_asks + 1
    nodes: dict = {}
    for state in states:
        here = [(v, o) for v, o in zip(x, options) if o.state is state]
        swaps = [(v, o) for v, o in here if o.mode == "swap"]
        elastic = [(v, o) for v, o in here if o.mode == "elastic"]
        area = model.NewIntVar(0, state.slot.usable_bytes, f"area{state.position}")
        for v, o in swaps:
            model.Add(area >= o.ask.need_bytes).OnlyEnforceIf(v)
        model.Add(sum(o.ask.need_bytes * v for v, o in here if o.mode == "resident") + area
                  + sum(o.piece.footprint * v for v, o in elastic) <= state.slot.usable_bytes)
        streamers = model.NewIntVar(0, n_max, f"n{state.position}")
        model.Add(streamers == sum(v for v, _ in elastic))  # a swap-in shares the link only while it runs
        for v, o in elastic:
            if o.cap is not None:
                model.Add(streamers <= o.cap).OnlyEnforceIf(v)
        _ttft_bounds(model, swaps, streamers, n_max, state.position)
        nodes.setdefault(state.node.name, (state.node, []))[1].extend(here)
    for node, here in nodes.values():
        if node.host_bytes is not None:
            model.Add(sum(_host(o) * v for v, o in here if _host(o)) <= node.host_bytes)

    refused = {a.key: 1 - placed[a.key] for a in asks}
    # a move: an unchanged model not kept as it was, or a model the last plan placed now refused
    moved = [1 - sum(v for v, o in by_ask[a.key] if o.keep) for a in asks if a.previous is not None]
    moved += [refused[a.key] for a in asks if a.previous is None and a.placed_before]
    # Canonical last tie-break, lexicographic by name: each model's slot position (refused: after the last), so
    # that equally good plans resolve alike whatever else changed (a larger budget keeps the same plan).
    n_slots = len(states)
    tie_base = n_slots + 1
    tie = sum(tie_base ** (n_asks - 1 - i) * (sum(o.state.position * v for v, o in by_ask[a.key])
                                             + n_slots * refused[a.key]) for i, a in enumerate(asks))
    w_latency = tie_base ** n_asks
    w_swap = w_latency * (n_asks * LATENCY_CAP + 1)
    w_elastic = w_swap * (n_asks + 1)
    w_moved = w_elastic * (n_asks + 1)
    w_refused = w_moved * (len(moved) + 1)
    w_lost = w_refused * (n_asks + 1)  # a model the last plan placed is never refused to admit others
    lost = [refused[a.key] for a in asks if a.placed_before]
    model.Minimize(
        w_lost * sum(lost) + w_refused * sum(refused.values()) + w_moved * sum(moved)
        + w_elastic * sum(v for v, o in zip(x, options) if o.mode == "elastic")
        + w_swap * sum(v for v, o in zip(x, options) if o.mode == "swap")
        + w_latency * sum(o.latency * v for v, o in zip(x, options) if o.latency) + tie)

    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = SEED
    solver.parameters.max_deterministic_time = DETERMINISTIC_LIMIT_S
    status = solver.Solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return greedy(asks, states, sticky=True)
    chosen = {opt.ask.key: opt for var, opt in zip(x, options) if solver.Value(var)}
    return _build(asks, states, chosen)


def _options(ask: Ask, state: SlotState, n_asks: int) -> list[_Option]:
    limit = ask.limit(state.slot)
    out = []
    prev = ask.previous
    kept_here = prev is not None and prev.slot == state.slot.id
    if ask.whole and ask.need_bytes <= limit:
        out.append(_Option(ask, state, "resident", keep=kept_here and prev.mode == "resident"))
        if ask.swap_ok():
            swap_in = _units(cost.copy_ms(ask.profile.weight_bytes, ask.profile))
            out.append(_Option(ask, state, "swap", keep=kept_here and prev.mode == "swap", latency=swap_in))
    if kept_here and prev.mode == "elastic" and prev.resident_layers < ask.profile.total_layers:
        piece = cost.elastic_slice_at(ask.profile, ask.slo, prev.resident_layers)
        if piece.footprint <= limit:
            cap = max((c for c in range(1, n_asks + 2) if ask.keeps_tpot(piece, c, limit)), default=None)
            if cap is not None:
                out.append(_Option(ask, state, "elastic", piece, None if cap == n_asks + 1 else cap, keep=True,
                                   latency=_stream(ask, piece, cap)))
    seen: dict = {}
    for c in range(1, n_asks + 2):
        piece = ask.start(c, limit)
        if piece is not None:
            seen[piece] = c  # the largest share count this start slice still holds at
    for piece, c in sorted(seen.items(), key=lambda kv: kv[1]):
        cap = None if c == n_asks + 1 else c
        out.append(_Option(ask, state, "elastic", piece, cap, latency=_stream(ask, piece, c)))
    if seen and state.node.host_bytes is not None:
        out += _host_saving(ask, state, min(p.resident_layers for p in seen), limit, n_asks)
    return out


def _host_saving(ask: Ask, state: SlotState, start: int, limit: int, n_asks: int) -> list[_Option]:
    """Where the node's host RAM is limited, larger slices pin less: up to HOST_STEPS of them between the start
    and the largest within the limit, each with the streamer count it still meets its TPOT at."""
    largest = cost.largest_elastic_slice(ask.profile, ask.slo, limit)
    if largest is None or largest.resident_layers <= start:
        return []
    span = largest.resident_layers - start
    ks = sorted({start + round(span * i / HOST_STEPS) for i in range(1, HOST_STEPS + 1)})
    out = []
    for k in ks:
        piece = ask.slices[k]
        caps = [c for c in range(1, n_asks + 2) if ask.keeps_tpot(piece, c, limit)]
        if caps:
            c = max(caps)
            out.append(_Option(ask, state, "elastic", piece, None if c == n_asks + 1 else c,
                               latency=_stream(ask, piece, c)))
    return out


def _stream(ask: Ask, piece: cost.ElasticSlice, streamers: int) -> int:
    return _units(cost.copy_ms(piece.streamed_bytes, ask.profile, streamers))


def _units(ms: float) -> int:
    return min(math.ceil(ms / LATENCY_UNIT_MS), LATENCY_CAP)


def _host(opt: _Option) -> int:
    if opt.mode == "swap":
        return opt.ask.profile.weight_bytes
    return opt.piece.streamed_bytes if opt.mode == "elastic" else 0


def _ttft_bounds(model: cp_model.CpModel, swaps: list, streamers, n_max: int, position: int) -> None:
    """Each swap member with a TTFT target waits at most its room for the others' turns, at the share
    the slot's streamer count gives."""
    if len(swaps) < 2 or all(o.ask.slo.ttft_ms is None for _, o in swaps):
        return
    for c in range(0, n_max + 1):  # c elastic models on the link: a swap-in gets 1/(c + 1) of it
        at_c = model.NewBoolVar(f"n{position}_{c}")
        model.Add(streamers == c).OnlyEnforceIf(at_c)
        model.Add(streamers != c).OnlyEnforceIf(at_c.Not())
        turns = {o.ask.key: math.ceil(o.ask.turn_ms(c + 1)) for _, o in swaps}
        for v, o in swaps:
            room = o.ask.swap_room_ms(c + 1)
            if room is None:
                continue
            others = sum(turns[p.ask.key] * w for w, p in swaps if p.ask.key != o.ask.key)
            model.Add(others <= math.floor(max(room, -1))).OnlyEnforceIf([v, at_c])


def _build(asks: list[Ask], states: list[SlotState], chosen: dict) -> tuple[list[SlotState], list[Ask]]:
    for state in states:
        mine = [o for o in chosen.values() if o.state is state]
        resident = [o.ask for o in mine if o.mode == "resident"]
        swap = [o.ask for o in mine if o.mode == "swap"]
        # the chosen slices as they are (each holds at its streamer cap); those not kept may grow afterwards
        elastic = [(o.ask, o.piece, True) for o in mine if o.mode == "elastic"]
        if len(swap) == 1:
            resident, swap = resident + swap, []
        layout = check(state, resident, swap, elastic)
        if layout is None:  # pragma: no cover - the integer model encodes every limit check() applies
            raise AssertionError(f"exact plan for {state.slot.id} fails the planner's own limits")
        apply(state, layout)
        for o in mine:
            if o.mode == "elastic" and not o.keep:
                state.elastic[o.ask.key][2] = False
        state.squeezed.update(a.key for a, _, _ in layout.elastic if a.whole)
    return states, [ask for ask in asks if ask.key not in chosen]
