"""Decisions from a finished placement: mode, predictions, and the reason in numbers.

Owns the wording of every decision and refusal, the predictions a slot's layout gives (link share,
co-tenants' time, swap wait) through controller.planning.cost, and why a refused model found no
slot (a pool at its maxNodes included). Called by controller.planning.plan.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from contract.quantity import format_bytes as fb
from contract.quantity import paste_quantity as paste
from controller.planning import cost
from controller.planning.slots import Ask, SlotState, predictions, rule_broken, shared_ms
from controller.types import Decision, ElasticModel, GpuSlot, Pool, Predicted, Profile


def decisions(states: list[SlotState], refused: list[Ask],
              at_limit: Mapping[tuple[str, str], tuple[Pool, int]] | None = None) -> list[Decision]:
    """`at_limit`: per refused model, the pool that could have added a node for it but is at its maxNodes, and
    how many nodes of it the plan has."""
    out = []
    for state in states:
        out.extend(_slot_decisions(state))
    if refused:
        room = _room_before_growth(states)
        for ask in refused:  # judged on the slots of the product it is reported on
            mine = [s for s in states if s.slot.product == ask.profile.gpu_product]
            hit = (at_limit or {}).get(ask.key)
            if hit is not None:
                out.append(refused_at_pool_limit(ask, *hit, max((room[s.position][0] for s in mine), default=0)))
            else:
                out.append(_refused(ask, *_no_room_code(ask, mine, room)))
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


def _slot_decisions(state: SlotState) -> list[Decision]:
    slot = state.slot
    n = state.streamers
    pieces = [(a, p) for a, p, _ in state.elastic.values()]
    shared = shared_ms(state.resident, state.swap, pieces)
    predicted = predictions(state.resident, state.swap, pieces)
    host = _host_terms(state)
    out = []
    for ask in state.resident:
        pred = _with_alone(predicted[ask.key], cost.predict_resident(ask.profile, ask.slo))
        reason = (f"need {_need_terms(ask)} fits budget {fb(ask.model.budget_bytes)} and slot {slot.id} "
                  f"holds it beside the others")
        out.append(_decision(ask, slot, "resident", ask.profile.total_layers, nbytes=ask.need_bytes, pred=pred,
                             reason=reason + _shared_terms(ask, state, shared), code="FitsResident", host_bytes=0))
    turns = {a.key: a.turn_ms(n + 1) for a in state.swap}
    for ask in state.swap:
        wait = sum(turns.values()) - turns[ask.key]
        pred = _with_alone(predicted[ask.key], cost.predict_swap(ask.profile, ask.slo))
        reason = (f"need {_need_terms(ask)} fits budget {fb(ask.model.budget_bytes)}, but the slot cannot hold "
                  f"every fitting model at once: it shares a {fb(state.swap_area)} swap area with "
                  f"{len(state.swap) - 1} other model(s) (PLAN.md lists them); swap-in {pred.swap_in_ms:g} ms = "
                  f"{fb(ask.profile.weight_bytes)} ÷ {pred.link_share_gbps:g} GB/s (its share of the link beside "
                  f"{n} elastic model(s)); worst wait for the others' turns {wait:g} ms (swap-in + minimum residency "
                  f"{cost.MIN_RESIDENCY_MS} ms + draining {cost.SWAP_DRAIN_TOKENS} steps each); {host}")
        out.append(_decision(ask, slot, "swap", ask.profile.total_layers, nbytes=ask.need_bytes, pred=pred,
                             reason=reason, code="SharesSwapArea", host_bytes=ask.profile.weight_bytes))
    for ask, piece, _ in sorted(state.elastic.values(), key=lambda e: e[0].key):
        pred = _with_alone(predicted[ask.key], cost.predict_elastic(ask.profile, ask.slo, piece))
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


def _with_alone(busy: Predicted, alone: Predicted) -> Predicted:
    """The prediction with every co-tenant busy, carrying the same mode and slice's figures alone on the GPU."""
    return replace(busy, alone_ttft_ms=alone.ttft_ms, alone_tpot_ms=alone.tpot_ms)


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
        reason += "; SLO missed (all busy: every co-tenant decoding at once): " + ", ".join(misses)
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
        reason=reason, reason_code=code, profile=profile_name(ask.profile),
        estimated=ask.profile.estimated, host_bytes=host_bytes,
        dtype=ask.profile.dtype, terms=ask.profile.terms, weight_dtype=ask.model.weight_dtype,
        pool=slot.pool.name if slot is not None and slot.pool is not None else None,
    )


def profile_name(profile: Profile) -> str:
    """How a decision names its profile: model@product, /dtype after it for a spec.weights.dtype other than auto
    (the folder the profile lives in under profiles/<product>/)."""
    tail = "" if profile.weight_dtype == "auto" else f"/{profile.weight_dtype}"
    return f"{profile.model}@{profile.gpu_product}{tail}"


def refused_below_minimum(ask: Ask, limit: int, usable: int) -> Decision:
    minimum = ask.minimum.footprint
    slo = ask.model.slo
    if minimum > usable:
        fix = (f"No budget helps: a {ask.profile.gpu_product} has {fb(usable)} usable. Lower slo.contextTokens or "
               f"slo.concurrency, or choose a larger GPU (spec.gpu.product)")
    else:
        fix = f"Raise memoryBudget to at least {paste(minimum)}, or lower slo.contextTokens/concurrency"
    reason = (f"need {_need_terms(ask)} > limit {fb(limit)}, and even streaming every layer needs "
              f"{fb(minimum)} on the GPU (embeddings, head, KV cache for {slo.context_tokens}×{slo.concurrency} "
              f"tokens, activations, overhead, 2 stream buffers). Missing: {paste(minimum - limit)}. {fix}")
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
                  f"share that small, or its and its co-tenants' decode steps there (all decoding at once), "
                  f"breaks its TPOT target or a neighbour's. Raise memoryBudget (more resident layers stream "
                  f"less), relax slo.tpotMs, or add a GPU")
    elif code == "HostMemoryFull":
        missing = ask.minimum.streamed_bytes - info["host_free"]
        reason = (f"{info['roomy']} slot(s) had room for its elastic minimum {fb(nbytes)}, but it would pin "
                  f"{fb(ask.minimum.streamed_bytes)} of host RAM where node {info['node']} had "
                  f"{fb(info['host_free'])} left of {fb(info['host'])}. Missing: {paste(missing)}. Add host RAM "
                  f"or a node, or make room (fewer swap members or streamed layers there)")
    elif code in ("ServedNameTaken", "MixedCompositions"):
        other = info["other"].model
        if code == "ServedNameTaken":
            names = sorted(set(ask.names) & set(info["other"].names))
            clash = (f"the worker there already serves the name {names[0]!r} for {other.ref}, and a worker serves "
                     "each name once")
            fix = ("change metadata.name or spec.servedNames of one of them, give one another spec.gpu.product, "
                   "or add a GPU")
        else:
            clash = (f"the GPU there runs a worker of composition {other.composition!r} (for {other.ref}), and one "
                     f"GPU takes one composition's worker")
            fix = f"set spec.compositionRef.name to {other.composition!r}, give one another spec.gpu.product, or add a GPU"
        reason = (f"{info['roomy']} slot(s) had room for its elastic minimum {fb(nbytes)}, but none may serve it: "
                  f"on {info['slot']} {clash}. Fix: {fix}")
    else:
        free = info["free"]
        reason = (f"needs {fb(nbytes)} on a {ask.profile.gpu_product} but the most any slot had left is {fb(free)} "
                  f"({info['slots']} slots). Missing: {paste(nbytes - free)}. Add a GPU, make room (remove a "
                  f"model or lower another's memoryBudget), or lower slo.contextTokens/concurrency")
    return _decision(ask, None, "refused", 0, nbytes=0, pred=None, reason=reason, code=code)


def refused_at_pool_limit(ask: Ask, pool: Pool, planned: int, free: int) -> Decision:
    """No GPU it may run on has room, and the cheapest pool that could add a node for it has no node left: the
    reason names the pool, its limit and the bytes missing."""
    nbytes = ask.minimum.footprint
    reason = (f"needs {fb(nbytes)} on a {ask.profile.gpu_product} but the most any GPU it may run on had left is "
              f"{fb(free)}, and pool {pool.name} could add a node for it but is at its limit: maxNodes "
              f"{pool.max_nodes} ({planned} node(s) planned). Missing: {paste(max(0, nbytes - free))}. Raise "
              f"maxNodes of pool {pool.name} in gpus.yaml (and the autoscaler's limit for "
              f"{pool.selector[0]}={pool.selector[1]}), make room (remove a model or lower another's memoryBudget), "
              f"or lower slo.contextTokens/concurrency")
    return _decision(ask, None, "refused", 0, nbytes=0, pred=None, reason=reason, code="PoolLimitReached")


def no_matching_gpu(model: ElasticModel, products: Iterable[str]) -> Decision:
    products = sorted(products)
    have = ", ".join(products) or "none"
    wanted = model.gpu_product or "any"
    reason = (f"no GPU of product {wanted} in the inventory (products: {have}); fix spec.gpu.product or add "
              f"such a node or pool (gpus.yaml, or nvidia.com/gpu.product node labels)")
    if model.gpu_product is None and products:
        reason = (f"no GPU product in the inventory (products: {have}) runs spec.weights.dtype {model.weight_dtype} "
                  "(contract.precision: bfloat16 and int4 need compute capability 8.0 or later); fix "
                  "spec.weights.dtype (int8 runs on every GPU) or add such a node or pool")
    return Decision(
        name=model.name, namespace=model.namespace, model=model.model, gpu_product=model.gpu_product,
        slot=None, mode="refused", resident_layers=0, total_layers=0, need_bytes=0,
        budget_bytes=model.budget_bytes, footprint_bytes=0, predicted=None, slo_met=None,
        reason=reason, weight_dtype=model.weight_dtype,
        reason_code="NoMatchingGPU",
    )


def _names(asks: list[Ask]) -> list[str]:
    return sorted(a.model.name for a in asks)



def _no_room_code(ask: Ask, states: list[SlotState], room: dict) -> tuple[str, dict]:
    """Why no slot takes it in the final plan, measured before slices grow (`room`: slot position -> (free
    bytes, free host bytes of its node)): NoCapacity when no slot has the bytes for its elastic minimum;
    else what stops it on those that have: a render-time rule (ServedNameTaken, MixedCompositions: every such
    slot's worker could not serve it), HostMemoryFull or LinkShareTooSmall."""
    roomy = [s for s in states if room[s.position][0] >= ask.minimum.footprint]
    best = max(states, key=lambda s: (room[s.position][0], -s.position), default=None)
    if not roomy:
        return "NoCapacity", {"free": room[best.position][0] if best else 0, "slots": len(states)}
    allowed = [s for s in roomy if rule_broken(s.members() + [ask]) is None]
    if not allowed:
        reason, _, other = rule_broken(roomy[0].members() + [ask]) or ("MixedCompositions", ask, ask)
        if other is ask:  # the rule broken is among the others: name the first of them that clashes with it
            other = next(a for a in roomy[0].members() if rule_broken([a, ask]) is not None)
        return reason, {"roomy": len(roomy), "slot": roomy[0].slot.id, "other": other}
    roomy = allowed
    hosted = [s for s in roomy if s.node.host_bytes is None or room[s.position][1] >= ask.minimum.streamed_bytes]
    if not hosted:
        node = roomy[0].node
        return "HostMemoryFull", {"roomy": len(roomy), "node": node.name, "host": node.host_bytes or 0,
                                  "host_free": room[roomy[0].position][1]}
    fewest = min(hosted, key=lambda s: (s.streamers, s.position))
    return "LinkShareTooSmall", {"roomy": len(roomy), "slot": fewest.slot.id, "streamers": fewest.streamers,
                                 "neighbours": _names(fewest.members())}



def _need_terms(ask: Ask) -> str:
    n = ask.need
    slo = ask.model.slo
    return (f"{fb(n.total)} (weights {fb(n.weights)} + KV {fb(n.kv_cache)} for {slo.context_tokens}×"
            f"{slo.concurrency} tokens + activations {fb(n.activation)} + overhead {fb(n.overhead)})")
