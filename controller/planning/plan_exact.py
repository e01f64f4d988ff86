"""The exact planner for small instances: a group of GPU products' models and slots as a CP-SAT model.

Owns the integer model of the planner's rules and objective (docs/planner.md); the final layout of
each slot goes through controller.planning.slots (`check`), so both planners judge a slot alike.
Deterministic: the model is built in sorted order and solved with a fixed seed, one worker
and a deterministic time limit. Called by controller.planning.plan.plan_product (method "auto" on
small instances, or "exact") and, through it, by bench/plan_quality.py.

Variables: x[a, s, o] = model a takes option o on slot s (of a product it has a profile for: the product is
chosen with the slot); options are resident, swap, elastic with at most c streaming models on the link (its
start slice at that share), and for a model whose inputs did not change, its previous placement kept as it was.
Objective, lexicographic in two solves: first models the last plan placed that are refused; refused; moved (an
unchanged model not kept as it was, or a model the last plan placed now refused); the cost of the pool nodes
it opens (controller.planning.capacity: a model is offered a new node's GPU only where it keeps no place); elastic;
swap; predicted SLO targets missed. Then, with those fixed at their optimum: the predicted latency against the SLO targets (the sum of
predicted ÷ target); the predicted TPOT of every model; the smaller models resident; a canonical tie-break (by name, earlier slots first;
refusing later names first). Predictions are those of controller.planning.slots.predictions (co-tenants all
decoding), except that an elastic co-tenant counts a bound on the part of its step its pass overlaps (the
decisions count that part exactly): the solver's figures are never below the decisions', so a limit it holds (the
swap wait, _ttft_bounds; the link share, _tpot_bounds), the slot holds.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ortools.sat.python import cp_model

from controller.planning import cost
from controller.planning.capacity import PoolRoom, cost_units, node_states, open_nodes
from controller.planning.greedy import greedy_fleet
from controller.planning.slots import Ask, SlotState, apply, check, is_tight, rule_broken

SEED = 0
DETERMINISTIC_LIMIT_S = 10.0  # the solver's own deterministic time (not wall-clock), per solve: same result every run
US = 1000                     # times in the integer model are in microseconds
LATENCY_CAP_MS = 10_000       # a model's predicted TPOT counts up to 10 s ...
RATIO_UNIT = 1000             # ... and predicted ÷ target in thousandths ...
RATIO_CAP = 10 * RATIO_UNIT   # ... up to ten times the target
HOST_STEPS = 16               # larger slices offered where host RAM is limited (they pin less)


@dataclass(frozen=True)
class _Option:
    ask: Ask
    state: SlotState
    mode: str                      # resident, swap, elastic
    piece: cost.ElasticSlice | None = None
    cap: int | None = None         # elastic: at most this many streaming models on the link
    keep: bool = False             # the previous placement, kept as it was
    stream_us: int = 0             # elastic: streaming its slice at the share its cap gives, per token


def solve(asks: list[Ask], states: list[SlotState], *, slo_first: bool = False,
          rooms: Mapping[str, PoolRoom] | None = None,
          new_nodes: Sequence[tuple[PoolRoom, int]] = ()) -> tuple[list[SlotState], list[Ask]]:
    """slo_first: SLO targets missed rank right after refused (before moves, elastic and swap): the reference
    bench/plan_quality.py measures the planner's SLO share against (the best plan with the same refusals).
    `new_nodes`: the pool nodes it may open (controller.planning.capacity.candidates), each at the cost of its
    node, ranked right after moves: only where that refuses fewer, never for a model that keeps its place, and
    never streaming a model that fits whole there (it runs whole on a new node, or shares it in a swap group;
    one that no new node's GPU holds whole streams on one).
    The states returned are `states` and the new nodes' GPUs it opened; their ordinals leave `rooms`' free."""
    base = list(states)
    asks = sorted(asks, key=lambda a: a.key)  # stable: each model's asks stay in its order of preference
    first: dict = {}
    for a in asks:
        first.setdefault(a.key, a)
    keys = sorted(first)
    n = len(keys)
    opening = []
    for room, k in new_nodes:
        fresh = node_states(room.pool, k, len(states))
        states = [*states, *fresh]
        opening.append((room, k, fresh))
    existing = {s.slot.id for s in base}
    fresh_at = {s.position for _, _, fresh in opening for s in fresh}
    # a new node: whole models whole, unless no new node's GPU holds the model whole (then it streams on one, as
    # the greedy's opening stage does: capacity.streams_on_any)
    held_whole = {a.key for a in asks for _, _, fresh in opening for s in fresh
                  if s.slot.product == a.profile.gpu_product and a.whole and a.need_bytes <= s.slot.usable_bytes}
    options = [o for a in asks for s in states if s.slot.product == a.profile.gpu_product
               and not (s.position in fresh_at and a.previous is not None and a.previous.slot in existing)
               for o in _options(a, s, n)
               if not (s.position in fresh_at and a.whole and a.key in held_whole and o.mode == "elastic")]
    model = cp_model.CpModel()
    x = [model.NewBoolVar(f"x{i}") for i in range(len(options))]
    by_key: dict = {k: [] for k in keys}
    for var, opt in zip(x, options):
        by_key[opt.ask.key].append((var, opt))
    placed = {}
    for k in keys:
        model.AddAtMostOne(v for v, _ in by_key[k])
        placed[k] = sum(v for v, _ in by_key[k])

    n_max = n + 1
    nodes: dict = {}
    times: dict = {}
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
        times[state.position] = _slot_times(model, state, here)
        _rules(model, here)
        _ttft_bounds(model, swaps, streamers, n_max, state.position, times[state.position][1])
        _tpot_bounds(model, here, times[state.position])
        nodes.setdefault(state.node.name, (state.node, []))[1].extend(here)
    for node, here in nodes.values():
        if node.host_bytes is not None:
            model.Add(sum(_host(o) * v for v, o in here if _host(o)) <= node.host_bytes)

    units = cost_units(rooms.values()) if rooms else {}
    node_open = []
    for room, k, _ in opening:
        var = model.NewBoolVar(f"open_{room.pool.name}_{k}")
        if node_open and node_open[-1][0] is room:  # interchangeable nodes: the lower ordinal opens first
            model.Add(node_open[-1][1] >= var)
        node_open.append((room, var, units[room.pool.name]))
    node_at = {s.position: node_open[i][1] for i, (_, _, fresh) in enumerate(opening) for s in fresh}
    for v, o in zip(x, options):
        if o.state.position in node_at:
            model.AddImplication(v, node_at[o.state.position])
    opened_cost = sum(cost * var for _, var, cost in node_open)
    cost_max = sum(cost for _, _, cost in node_open)

    refused = {k: 1 - placed[k] for k in keys}
    # a move: an unchanged model not kept as it was, or a model the last plan placed now refused
    kept_before = {a.key for a in asks if a.previous is not None}
    moved = [1 - sum(v for v, o in by_key[k] if o.keep) for k in keys if k in kept_before]
    moved += [refused[k] for k in keys if k not in kept_before and first[k].placed_before]
    lost = [refused[k] for k in keys if first[k].placed_before]
    misses, ratios, tpots = _slo_terms(model, by_key, keys, times)
    w_swap = 2 * n + 1 if not slo_first else 1
    w_elastic = w_swap * (n + 1)
    w_cost = w_elastic * (n + 1)  # new pool nodes, in cost units: above elastic and swap, below moves
    w_moved = w_cost * (cost_max + 1)
    w_miss = 1 if not slo_first else (len(moved) + 1) * w_moved
    w_refused = max(w_moved * (len(moved) + 1), w_miss * (2 * n + 1))
    w_lost = w_refused * (n + 1)  # a model the last plan placed is never refused to admit others
    primary = (w_lost * sum(lost) + w_refused * sum(refused.values()) + w_moved * sum(moved)
               + w_cost * opened_cost
               + w_elastic * sum(v for v, o in zip(x, options) if o.mode == "elastic")
               + w_swap * sum(v for v, o in zip(x, options) if o.mode == "swap") + w_miss * sum(misses))
    # Canonical last tie-break, lexicographic by name: each model's slot position (refused: after the last), so
    # that equally good plans resolve alike whatever else changed (a larger budget keeps the same plan).
    n_slots = len(states)
    tie_base = n_slots + 1
    tie = sum(tie_base ** (n - 1 - i) * (sum(o.state.position * v for v, o in by_key[k]) + n_slots * refused[k])
              for i, k in enumerate(keys))
    # then, as the greedy's swap groups do, the larger models swap and the smaller stay resident
    rank = {k: i for i, k in enumerate(sorted(keys, key=lambda k: (first[k].need_bytes, k)))}
    residents = sum(rank[o.ask.key] * v for v, o in zip(x, options) if o.mode == "resident")
    w_size = tie_base ** n
    w_tpot = w_size * (n * n + 1)
    w_ratio = w_tpot * (n * LATENCY_CAP_MS + 1)
    secondary = w_ratio * sum(ratios) + w_tpot * sum(tpots) + w_size * residents + tie

    solver = _solver()
    model.Minimize(primary)
    status = solver.Solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return _greedy(asks, base, rooms)
    model.Add(primary <= round(solver.ObjectiveValue()))
    for var in x:
        model.AddHint(var, solver.Value(var))
    model.Minimize(secondary)
    status = solver.Solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):  # pragma: no cover - the first solution is feasible
        return _greedy(asks, base, rooms)
    chosen = {opt.ask.key: opt for var, opt in zip(x, options) if solver.Value(var)}
    states, refused = _build(states, chosen, [first[k] for k in keys if k not in chosen])
    used = {o.state.position for o in chosen.values()}
    kept = list(base)
    for room, k, fresh in opening:
        if any(s.position in used for s in fresh):
            room.free.remove(k)
            kept.extend(fresh)
    for i, state in enumerate(kept):  # the decisions index the states by position
        state.position = i
    return kept, refused


def _greedy(asks: list[Ask], states: list[SlotState], rooms: Mapping[str, PoolRoom] | None
            ) -> tuple[list[SlotState], list[Ask]]:
    """The greedy regime, where the solver finds no solution: placement on the existing GPUs, then new nodes."""
    states, refused = greedy_fleet(asks, states, sticky=True)
    if refused and rooms:
        choices: dict = {}
        for ask in asks:
            choices.setdefault(ask.key, []).append(ask)
        refused = open_nodes(refused, choices, states, rooms)
    return states, refused


def _solver() -> cp_model.CpSolver:
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = SEED
    solver.parameters.max_deterministic_time = DETERMINISTIC_LIMIT_S
    # OR-Tools 9.15's symmetry detection aborts the whole process on some of these models ("Check failed:
    # context_->VarToConstraints(var).empty()"; tests/test_plan_slo_limits.py has one): the solve does without it
    solver.parameters.symmetry_level = 0
    return solver


def _step_us(ask: Ask) -> int:
    return math.ceil(ask.step_ms * US)


def _slot_times(model: cp_model.CpModel, state: SlotState, here: list) -> tuple:
    """(all: the decode time a resident member's TPOT counts, its own step included; fixed: the residents'
    steps and the streaming models' bursts, what a swap member adds to its own step; burst: per elastic option,
    the most of its step it can add to a co-tenant's) in microseconds. The swap group adds its slowest member's
    step to the others. A streaming model takes its step once per pass: at most step × (the longest co-tenant
    step ÷ its shortest pass, the link to itself) of another's step (controller.planning.slots.shared_ms)."""
    longest: dict = {}
    for _, o in here:
        longest[o.ask.key] = max(longest.get(o.ask.key, 0.0), o.ask.step_ms)
    own_max = sum(longest.values())
    burst = {}
    for _, o in here:
        if o.mode == "elastic":
            pass_ms = cost.copy_ms(o.piece.streamed_bytes, o.ask.profile, 1)
            burst[id(o)] = math.ceil(o.ask.step_ms * (min(1.0, own_max / pass_ms) if pass_ms else 1.0) * US)
    bound = sum(_step_us(o.ask) for _, o in here) + 1
    group = model.NewIntVar(0, bound, f"group{state.position}")
    for v, o in here:
        if o.mode == "swap":
            model.Add(group >= _step_us(o.ask)).OnlyEnforceIf(v)
    fixed = model.NewIntVar(0, bound, f"fixed{state.position}")
    model.Add(fixed == sum(_step_us(o.ask) * v for v, o in here if o.mode == "resident")
              + sum(burst[id(o)] * v for v, o in here if o.mode == "elastic"))
    every = model.NewIntVar(0, 2 * bound, f"all{state.position}")
    model.Add(every == fixed + group)
    return every, fixed, burst


def _rules(model: cp_model.CpModel, here: list) -> None:
    """Render-time rules: two models that may not share a worker (another composition, a served name taken)
    never share this slot."""
    asks = {}
    for _, o in here:
        asks.setdefault(o.ask.key, o.ask)
    keys = sorted(asks)
    for i, k in enumerate(keys):
        for other in keys[i + 1:]:
            if rule_broken([asks[k], asks[other]]) is not None:
                model.Add(sum(v for v, o in here if o.ask.key in (k, other)) <= 1)


def _slo_terms(model: cp_model.CpModel, by_key: dict, keys: list, times: dict) -> tuple[list, list, list]:
    """Per model: a bool per SLO target it is predicted to miss; its predicted latency ÷ each target (in
    RATIO_UNIT); its predicted TPOT (ms). Each is bound from below by the chosen option's prediction."""
    misses, ratios, tpots = [], [], []
    for k in keys:
        first = by_key[k][0][1].ask if by_key[k] else None
        if first is None:
            continue
        slo = first.slo
        tpot_var = _capped(model, tpots, LATENCY_CAP_MS, f"tpot{len(tpots)}")
        targets = [(name, t) for name, t in (("tpot", slo.tpot_ms), ("ttft", slo.ttft_ms)) if t is not None]
        missed = {name: model.NewBoolVar(f"miss{len(misses)}_{name}") for name, _ in targets}
        misses += missed.values()
        ratio = {name: _capped(model, ratios, RATIO_CAP, f"ratio{len(ratios)}_{name}") for name, _ in targets}
        for v, o in by_key[k]:
            every, fixed, burst = times[o.state.position]
            own = _step_us(o.ask)
            if o.mode == "swap":
                tpot, tpot_const = fixed, own
            else:  # `every` counts a streaming model's burst in place of its own step
                tpot, tpot_const = every, own - burst[id(o)] if o.mode == "elastic" else 0
            stream = o.stream_us
            ttft_const = (math.ceil(cost.predict_resident(o.ask.profile, o.ask.slo).ttft_ms * US) - own
                          if o.mode != "elastic" else _elastic_ttft_us(o))
            if o.mode == "swap":
                ttft_const += math.ceil(cost.copy_ms(o.ask.profile.weight_bytes, o.ask.profile) * US)
            big = 10 ** 12
            # TPOT (ms, rounded up), every model: the larger of its decode time and its streaming
            model.Add(tpot_var * US >= tpot + tpot_const - big * (1 - v))
            model.Add(tpot_var * US >= stream - big * (1 - v))
            for name, target in targets:
                t = math.floor(target * US)
                value_const = tpot_const + (ttft_const if name == "ttft" else 0)
                if name == "tpot" and o.mode == "elastic" and is_tight(o.ask, o.ask.limit(o.state.slot)):
                    pass  # met: the link-share limit holds it (_tpot_bounds)
                elif name == "tpot" and stream > t:
                    model.Add(missed[name] >= v)
                elif not (name == "ttft" and o.mode == "swap"):  # a swap member's TTFT is a limit (_ttft_bounds)
                    model.Add(tpot + value_const <= t + big * (1 - v) + big * missed[name])
                model.Add(ratio[name] * t >= (tpot + value_const) * RATIO_UNIT - big * RATIO_UNIT * (1 - v))
                if name == "tpot" and stream:
                    model.Add(ratio[name] * t >= stream * RATIO_UNIT - big * RATIO_UNIT * (1 - v))
    return misses, ratios, tpots


def _capped(model: cp_model.CpModel, terms: list, cap: int, name: str):
    """A variable bound from below by the constraints the caller adds; `terms` gets it at most `cap`."""
    raw = model.NewIntVar(0, 10 ** 9, name)
    capped = model.NewIntVar(0, cap, name + "_capped")
    model.AddMinEquality(capped, [raw, cap])
    terms.append(capped)
    return raw


def _elastic_ttft_us(o: _Option) -> int:
    """An elastic model's TTFT beside its TPOT: every prefill chunk (sized to the streaming floor) streams its
    non-resident layers once."""
    return math.ceil(cost.elastic_prefill_ms(o.ask.profile, o.ask.slo, o.piece.streamed_bytes, o.stream_us / US) * US)


def _options(ask: Ask, state: SlotState, n_asks: int) -> list[_Option]:
    limit = ask.limit(state.slot)
    out = []
    prev = ask.previous
    kept_here = prev is not None and prev.slot == state.slot.id
    if ask.whole and ask.need_bytes <= limit:
        out.append(_Option(ask, state, "resident", keep=kept_here and prev.mode == "resident"))
        if ask.swap_ok():
            out.append(_Option(ask, state, "swap", keep=kept_here and prev.mode == "swap"))
    if kept_here and prev.mode == "elastic" and prev.resident_layers < ask.profile.total_layers:
        piece = cost.elastic_slice_at(ask.profile, ask.slo, prev.resident_layers)
        if piece.footprint <= limit:
            cap = max((c for c in range(1, n_asks + 2) if ask.keeps_tpot(piece, c, limit)), default=None)
            if cap is not None:
                out.append(_Option(ask, state, "elastic", piece, None if cap == n_asks + 1 else cap, keep=True,
                                   stream_us=_stream(ask, piece, cap)))
    seen: dict = {}
    for c in range(1, n_asks + 2):
        piece = ask.start(c, limit)
        if piece is not None:
            seen[piece] = c  # the largest share count this start slice still holds at
    for piece, c in sorted(seen.items(), key=lambda kv: kv[1]):
        cap = None if c == n_asks + 1 else c
        out.append(_Option(ask, state, "elastic", piece, cap, stream_us=_stream(ask, piece, c)))
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
                               stream_us=_stream(ask, piece, c)))
    return out


def _stream(ask: Ask, piece: cost.ElasticSlice, streamers: int) -> int:
    return math.ceil(cost.copy_ms(piece.streamed_bytes, ask.profile, streamers) * US)


def _host(opt: _Option) -> int:
    if opt.mode == "swap":
        return opt.ask.profile.weight_bytes
    return opt.piece.streamed_bytes if opt.mode == "elastic" else 0


def _ttft_bounds(model: cp_model.CpModel, swaps: list, streamers, n_max: int, position: int, fixed) -> None:
    """Each swap member with a TTFT target meets it after the worst wait: the others' turns at the share the
    slot's streamer count gives, its own swap-in, and the residents' and streaming models' steps (`fixed`, in
    microseconds) beside its own."""
    if len(swaps) < 2 or all(o.ask.slo.ttft_ms is None for _, o in swaps):
        return
    for c in range(0, n_max + 1):  # c elastic models on the link: a swap-in gets 1/(c + 1) of it
        at_c = model.NewBoolVar(f"n{position}_{c}")
        model.Add(streamers == c).OnlyEnforceIf(at_c)
        model.Add(streamers != c).OnlyEnforceIf(at_c.Not())
        turns = {o.ask.key: math.ceil(o.ask.turn_ms(c + 1) * US) for _, o in swaps}
        for v, o in swaps:
            room = o.ask.swap_room_ms(c + 1)
            if room is None:
                continue
            others = sum(turns[p.ask.key] * w for w, p in swaps if p.ask.key != o.ask.key)
            model.Add(others + fixed <= math.floor(max(room * US, -1))).OnlyEnforceIf([v, at_c])


def _tpot_bounds(model: cp_model.CpModel, here: list, times: tuple) -> None:
    """The link-share limit (controller.planning.slots.slo_limits_hold): each streaming option whose TPOT target T
    bounds it meets T all busy: its step, the residents' steps, the swap group's slowest step, and of each other
    streaming model's step the part its pass overlaps. Where the limit holds, its step with the residents' and
    the group's is within T, and two models at least share the link, so that part is at most T ÷ the other's
    pass at half the link: a bound never below the decisions' figure, and close to it."""
    every, fixed, _ = times
    elastic = [(v, o) for v, o in here if o.mode == "elastic"]
    residents = sum(_step_us(o.ask) * v for v, o in here if o.mode == "resident")
    for v, o in elastic:
        if not is_tight(o.ask, o.ask.limit(o.state.slot)):
            continue
        target = o.ask.slo.tpot_ms
        others = sum(math.ceil(p.ask.step_ms * _overlap(target, p) * US) * w for w, p in elastic
                     if p.ask.key != o.ask.key)
        model.Add(residents + (every - fixed) + _step_us(o.ask) + others <= math.floor(target * US)).OnlyEnforceIf(v)


def _overlap(target_ms: float, o: _Option) -> float:
    """The most of a streaming option's step that a co-tenant whose own decode time is within `target_ms` shares:
    its pass at half the link or longer."""
    pass_ms = cost.copy_ms(o.piece.streamed_bytes, o.ask.profile, 2)
    return min(1.0, target_ms / pass_ms) if pass_ms else 1.0


def _build(states: list[SlotState], chosen: dict, refused: list[Ask]) -> tuple[list[SlotState], list[Ask]]:
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
    return states, refused
