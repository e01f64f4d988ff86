"""Who stands in a model's way: the neighbours behind a refused or degraded decision, and what admits it.

Owns the reading of a finished plan from one model's point of view: on the slot it runs on (or,
refused, the slot that came closest), which neighbours hold the bytes, the link or the node's host
RAM it lacks, and the smallest change (theirs or its own) that would give it the better mode. Pure;
every number from the decisions and controller.planning.cost. Called by controller.planning.explain.
"""
from __future__ import annotations

from controller.planning import cost
from controller.planning.occupancy import device_bytes
from contract.quantity import format_bytes as fb
from contract.quantity import paste_quantity as paste
from controller.types import Decision, GpuSlot, Inputs, Plan, Profile


def neighbour_lines(inputs: Inputs, result: Plan, d: Decision, profile: Profile) -> list[str]:
    """Lines for `explain`: host RAM and link share where it streams or swaps, then, when it is refused,
    streams for lack of room, swaps, or misses an SLO, the neighbours that caused it and what admits it."""
    model = next(m for m in inputs.models if m.key == d.key)
    slots = [s for s in inputs.slots if s.product == d.gpu_product]
    placed = [o for o in result.decisions if o.slot is not None and o.mode != "refused"]
    lines = _resources(d, profile, slots, placed)
    degraded = d.mode == "refused" or d.reason_code == "ExceedsFreeSpace" or d.mode == "swap" or d.slo_met is False
    if not degraded or d.reason_code in ("BudgetBelowElasticMinimum", "NoMatchingGPU") or not slots:
        return lines
    slot = next((s for s in slots if s.id == d.slot), None) or _closest(slots, placed, d)
    others = sorted((o for o in placed if o.slot == slot.id and o.key != d.key),
                    key=lambda o: (-o.footprint_bytes, o.namespace, o.name))
    lines += ["", f"Neighbours on {slot.id}: " + (", ".join(
        f"{o.namespace}/{o.name} ({o.mode}, {fb(o.footprint_bytes)})" for o in others) or "none")]
    want = d.need_bytes if d.mode != "refused" else cost.elastic_slice_at(profile, model.slo, 0).footprint
    mine = d.footprint_bytes if d.mode in ("resident", "elastic") else 0
    # elastic neighbours grew into room nobody else could take; a model placed would have had it back
    grown = sum(o.footprint_bytes - _minimum(o, inputs) for o in others if o.mode == "elastic")
    free = slot.usable_bytes - device_bytes(others) - (0 if d.mode == "swap" else mine) + grown
    missing = want - free - (mine if d.mode != "swap" else 0)
    target = "run resident" if d.mode != "refused" else "be placed (elastic minimum)"
    if d.reason_code == "LinkShareTooSmall":
        lines += _link_advice(model, profile, slot, placed)
    elif d.reason_code == "HostMemoryFull":
        lines += _host_advice(slot, placed, inputs, want)
    elif missing > 0:
        lines.append(f"To {target} it needs {fb(want)} on {slot.id}, where {fb(max(free + mine, 0))} is left to it "
                     f"(elastic neighbours at their minimum): {missing} bytes short.")
        lines += _room_advice(others, missing, inputs)
        partners = [o for o in others if o.mode == "swap"]
        if d.mode == "swap" and len(partners) == 1:
            o = partners[0]
            lines.append(f"- or its one swap partner {o.namespace}/{o.name} moves to another GPU: it then runs "
                         f"resident in the area it shares now")
        if d.mode != "refused":
            lines.append(f"- or its own: a need below {fb(free + mine)} (lower slo.contextTokens/concurrency)")
        else:
            lines.append("- or its own: lower slo.contextTokens/concurrency (a smaller KV cache lowers the minimum),"
                         " or add a GPU")
    if d.slo_met is False and d.predicted is not None:
        lines += _slo_advice(d, placed, slot)
    if d.slo_met is False or (d.mode == "refused" and model.has_slo):
        lines += slo_alternatives(inputs, result, d, model)
    return lines


def slo_alternatives(inputs: Inputs, result: Plan, d: Decision, model) -> list[str]:
    """Which GPU would have met its SLO, and why it is where it is: on each other slot of a product it may
    run on (its spec.gpu.product, else any it has a profile for), its whole need beside the models placed
    there, its TPOT its own step plus theirs (all decoding at once, the verdict's figure)."""
    placed = [o for o in result.decisions if o.slot is not None and o.mode != "refused"]
    profiles = {p.key: p for p in inputs.profiles}
    lines = []
    for slot in sorted(inputs.slots, key=lambda s: s.id):
        profile = profiles.get(model.profile_key(slot.product))
        if slot.id == d.slot or profile is None or model.gpu_product not in (None, slot.product):
            continue
        there = [o for o in placed if o.slot == slot.id and o.key != d.key]
        steps = sum(_step(o, inputs) for o in there)
        predicted = cost.predict_resident(profile, model.slo, steps)
        if cost.missed(model.slo, predicted):
            continue
        need = cost.need(profile, model.slo).total
        free = slot.usable_bytes - device_bytes(there)
        at = f"{slot.id} ({slot.product}) would have met it: TPOT {predicted.tpot_ms:g} ms, TTFT {predicted.ttft_ms:g} ms"
        if need > min(model.budget_bytes, slot.usable_bytes):
            why = f"its need {fb(need)} is over its budget or that GPU, so it would stream there"
        elif need > free:
            why = (f"it needs {fb(need)} there and {fb(max(free, 0))} is left beside "
                   + (", ".join(f"{o.namespace}/{o.name}" for o in there) or "nothing") +
                   ": moving it there would refuse or stream a model this plan places")
        elif any(o.slo_met and _step(o, inputs) for o in there):
            why = "its step added to the neighbours' there would make one of them miss its own target"
        else:
            why = ("it keeps its slot and mode from the last plan (the stability rule: a model whose own inputs did "
                   "not change is moved only to admit another; edit it, or remove its decision, to re-place it)")
        lines.append(f"- {at}; not chosen: {why}")
    if not lines:
        return ["", "SLO: no other GPU of a product it may run on would have met it beside the models there"]
    return ["", "SLO: where it would have met its targets, and why it is not there:"] + lines


def _step(o: Decision, inputs: Inputs) -> float:
    """A placed neighbour's decode step at its concurrency (0 without its model or profile)."""
    model = next((m for m in inputs.models if m.key == o.key), None)
    profile = next((p for p in inputs.profiles if model is not None and p.key == model.profile_key(o.gpu_product)), None)
    return 0.0 if model is None or profile is None else cost.decode_step_ms(profile, model.slo.concurrency)


def _resources(d: Decision, profile: Profile, slots: list[GpuSlot], placed: list[Decision]) -> list[str]:
    slot = next((s for s in slots if s.id == d.slot), None)
    if slot is None:
        return []
    node_pinned = sum(o.host_bytes for o in placed if any(s.id == o.slot and s.node == slot.node for s in slots))
    host = (f"{fb(slot.host_memory_bytes)}" if slot.host_memory_bytes else "unknown (not planned: add hostMemory to "
            "gpus.yaml, or the node reports no memory)")
    lines = [f"Host RAM: pins {fb(d.host_bytes)}; node {slot.node} pins {fb(node_pinned)} of {host}"]
    if d.predicted is not None and d.predicted.link_share_gbps is not None:
        sharing = sorted(f"{o.namespace}/{o.name}" for o in placed if o.slot == d.slot and o.mode == "elastic")
        group = [o for o in placed if o.slot == d.slot and o.mode == "swap"]
        lines.append(f"Link: streams at {d.predicted.link_share_gbps:g} GB/s, its share of the "
                     f"{profile.host_to_device_gbps:g} GB/s host→device link with the elastic models "
                     f"{', '.join(sharing) or 'none'}" + ("; a swap-in takes a share too while it runs" if group
                                                          else ""))
    return lines


def _minimum(o: Decision, inputs: Inputs) -> int:
    """An elastic neighbour's elastic minimum (its footprint when nothing is left to grow into)."""
    model = next((m for m in inputs.models if m.key == o.key), None)
    profile = next((p for p in inputs.profiles if model is not None and p.key == model.profile_key(o.gpu_product)), None)
    if model is None or profile is None:
        return o.footprint_bytes
    return cost.elastic_slice_at(profile, model.slo, 0).footprint


def _closest(slots: list[GpuSlot], placed: list[Decision], d: Decision) -> GpuSlot:
    """The slot with the most room left: the one a refused model came closest on."""
    return max(slots, key=lambda s: (s.usable_bytes - device_bytes(o for o in placed if o.slot == s.id), s.id))


def _room_advice(others: list[Decision], missing: int, inputs: Inputs) -> list[str]:
    """The single neighbour whose leaving covers the shortfall (the smallest such), else the fewest largest.
    An elastic neighbour frees its minimum (what it grew beyond that is already counted as room)."""
    frees = {o.key: o.footprint_bytes if o.mode == "resident" else _minimum(o, inputs)
             for o in others if o.mode in ("resident", "elastic")}
    movable = sorted((o for o in others if o.key in frees), key=lambda o: (-frees[o.key], o.namespace, o.name))
    single = [o for o in movable if frees[o.key] >= missing]
    if single:
        o = min(single, key=lambda o: (frees[o.key], o.namespace, o.name))
        shrink = (f" or runs elastic (a memoryBudget at least {missing} bytes below its need)"
                  if o.mode == "resident" else "")
        return [f"- it fits if {o.namespace}/{o.name} ({o.mode}, {fb(o.footprint_bytes)}) moves to another GPU{shrink}"]
    chosen, total = [], 0
    for o in movable:
        if total >= missing:
            break
        chosen.append(o)
        total += frees[o.key]
    if total < missing:
        return ["- no neighbour alone frees enough: add a GPU of this product"]
    return ["- it fits if " + " and ".join(f"{o.namespace}/{o.name} ({fb(o.footprint_bytes)})" for o in chosen)
            + " move to another GPU"]


def _link_advice(model, profile: Profile, slot: GpuSlot, placed: list[Decision]) -> list[str]:
    streaming = [o for o in placed if o.slot == slot.id and o.mode == "elastic"]
    n = len({o.key for o in streaming if o.mode == "elastic"}) + 1
    out = [f"The link of {slot.id} would be shared {n} ways: "
           f"{cost.link_share_gbps(profile, n):g} GB/s each (streaming there: "
           f"{', '.join(sorted(f'{o.namespace}/{o.name}' for o in streaming)) or 'none'})."]
    piece = cost.smallest_slice_meeting(profile, model.slo, slot.usable_bytes, n)
    if model.slo.tpot_ms is not None and piece is not None:
        out.append(f"- its own: memoryBudget {paste(piece.footprint)} keeps "
                   f"{piece.resident_layers} layers resident, so it streams little enough for TPOT "
                   f"{model.slo.tpot_ms:g} ms at that share")
    if model.slo.tpot_ms is not None:
        full = cost.elastic_slice_at(profile, model.slo, 0)
        out.append(f"- or relax slo.tpotMs to {cost.copy_ms(full.streamed_bytes, profile, n):.0f} ms")
    out.append("- or move a streaming neighbour to another GPU, or add a GPU")
    if model.slo.tpot_ms is not None:
        step = cost.decode_step_ms(profile, model.slo.concurrency)
        out.append(f"- its TPOT also counts its own decode step ({step:.1f} ms) and the co-tenants' there, all "
                   f"decoding at once: a GPU with fewer or smaller co-tenants admits it")
    return out


def _host_advice(slot: GpuSlot, placed: list[Decision], inputs: Inputs, want_bytes: int) -> list[str]:
    node_slots = {s.id for s in inputs.slots if s.node == slot.node}
    pinning = sorted((o for o in placed if o.slot in node_slots and o.host_bytes),
                     key=lambda o: (-o.host_bytes, o.namespace, o.name))
    return [f"Host RAM of node {slot.node} is held by: " + (", ".join(
        f"{o.namespace}/{o.name} ({o.mode}, {fb(o.host_bytes)})" for o in pinning) or "none"),
        "- it fits when one of them leaves the node, streams less (a larger memoryBudget keeps more layers "
        "resident) or the node gets more host RAM (hostMemory)"]


def _slo_advice(d: Decision, placed: list[Decision], slot: GpuSlot) -> list[str]:
    busy = sorted((o for o in placed if o.slot == slot.id and o.key != d.key),
                  key=lambda o: (-o.need_bytes, o.namespace, o.name))
    if not busy:
        return []
    return ["SLO: its TPOT counts the co-tenants' decode steps; the largest there: " + ", ".join(
        f"{o.namespace}/{o.name} ({o.mode})" for o in busy[:3]) + "; fewer or smaller co-tenants on its GPU, or "
        "a GPU of its own, shorten it"]
