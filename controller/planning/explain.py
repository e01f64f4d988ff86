"""`gpushare explain NAME`: one decision's arithmetic in plain words.

Owns the wording only: every number comes from controller.planning.cost (the same functions
the planner uses), so the explanation cannot drift from the decision. Called by the CLI.
"""
from __future__ import annotations

from controller.planning import cost
from controller.planning.neighbours import neighbour_lines
from contract.quantity import format_bytes as fb
from contract.quantity import paste_quantity as paste
from controller.types import Decision, ElasticModel, Inputs, Plan


class ModelNotFound(LookupError):
    reason = "ModelNotFound"


def find_model(inputs: Inputs, name: str, namespace: str | None) -> ElasticModel:
    matches = [m for m in inputs.models if m.name == name and namespace in (None, m.namespace)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        known = ", ".join(sorted(m.ref for m in inputs.models)) or "none"
        raise ModelNotFound(f"no valid ElasticModel named {name!r} (known: {known}); "
                            "run `gpushare validate` to see models that failed to load")
    raise ModelNotFound(f"{name!r} exists in several namespaces ({', '.join(sorted(m.namespace for m in matches))}); "
                        "pass --namespace")


def explain(inputs: Inputs, result: Plan, name: str, namespace: str | None = None) -> str:
    model = find_model(inputs, name, namespace)
    header = f"{model.ref}: {model.model}, memoryBudget {fb(model.budget_bytes)} ({model.budget_bytes} bytes)"
    pending = next((p for p in result.pending if p.key == model.key), None)
    if pending is not None:
        return f"{header}\nMode: none yet ({pending.reason_code})\n{pending.reason}.\n"
    decision = next(d for d in result.decisions if d.key == model.key)
    wanted = model.profile_key(decision.gpu_product)
    profile = next((p for p in inputs.profiles if p.key == wanted), None)
    if profile is None:
        return f"{header}\nMode: {decision.mode} ({decision.reason_code})\n{decision.reason}\n"
    return "\n".join([header, *_body(model, decision, profile, inputs, result)]) + "\n"


def _body(model: ElasticModel, d: Decision, profile, inputs: Inputs, result: Plan) -> list[str]:
    slo = model.slo
    n = cost.need(profile, slo)
    slot = next((s for s in inputs.slots if s.id == d.slot), None)
    usable = slot.usable_bytes if slot else max((s.usable_bytes for s in inputs.slots if s.product == d.gpu_product),
                                                default=0)
    limit = min(model.budget_bytes, usable)
    minimum = cost.elastic_slice_at(profile, slo, 0).footprint
    lines = [
        f"GPU: {d.gpu_product}, slot {d.slot or '-'} (usable {fb(usable)}); profile {d.profile} ({profile.source}); "
        f"decoder weights {profile.stored_dtype}, computed in {profile.dtype}",
        f"Mode: {d.mode} ({d.reason_code})",
        "",
        "need = weights + KV cache + activation peak + runtime overhead",
        f"     = {fb(n.weights)} + {fb(n.kv_cache)} ({profile.kv_bytes_per_token} B/token × {slo.context_tokens} "
        f"tokens × {slo.concurrency}) + {fb(n.activation)} + {fb(n.overhead)} = {fb(n.total)} ({n.total} bytes)",
        f"limit = min(budget {fb(model.budget_bytes)}, slot usable {fb(usable)}) = {fb(limit)}",
        f"elastic minimum (every layer streamed) = {fb(minimum)} ({minimum} bytes)",
        "",
        "Why this mode: " + d.reason,
    ]
    lines += _why_not(d, n.total, limit, minimum)
    estimated = " (estimated profile, not measured)" if d.estimated else ""
    if d.predicted is not None:
        swap = f", swap-in {d.predicted.swap_in_ms:g} ms" if d.predicted.swap_in_ms is not None else ""
        lines.append(f"Predicted{estimated}: TTFT {d.predicted.ttft_ms:g} ms (prompt of {slo.context_tokens} tokens), "
                     f"TPOT {d.predicted.tpot_ms:g} ms at concurrency {slo.concurrency}{swap}")
    if d.slo_met is not None:
        targets = ", ".join(f"{k} {v:g} ms" for k, v in (("TTFT", slo.ttft_ms), ("TPOT", slo.tpot_ms)) if v)
        verdict = "met" if d.slo_met else "missed"
        lines.append(f"SLO ({targets}): {verdict}{' by an estimate only' if d.estimated else ''}")
    lines += neighbour_lines(inputs, result, d, profile)
    lines += ["", "What budget would change it:"] + _what_if(d, profile, model, n.total, minimum, usable)
    return lines


def _why_not(d: Decision, need_total: int, limit: int, minimum: int) -> list[str]:
    fits = need_total <= limit
    out = []
    if d.mode != "resident":
        out.append("Not resident: " + ("the slot cannot hold it beside the models placed before it"
                                        if fits else f"need {fb(need_total)} > limit {fb(limit)}"))
    if d.mode != "swap":
        out.append("Not swap: " + ("it fits beside the others without waiting its turn" if d.mode == "resident"
                                    else f"swap needs the whole model on the GPU in turn: {fb(need_total)} > "
                                         f"{fb(limit)}" if not fits else "no slot had room for a swap area"))
    if d.mode != "elastic":
        if d.reason_code == "NoCapacity":
            why = f"its elastic minimum {fb(minimum)} is more than any slot has free"
        elif d.reason_code == "LinkShareTooSmall":
            why = ("where its elastic minimum fits, its share of the host→device link or the co-tenants' decode "
                   "steps would break a TPOT target")
        elif d.reason_code == "HostMemoryFull":
            why = "where its elastic minimum fits, the node's host RAM cannot pin its streamed layers"
        elif fits:
            why = "need ≤ limit: streaming would only slow it down"
        else:
            why = f"even the elastic minimum {fb(minimum)} > limit {fb(limit)}"
        out.append("Not elastic: " + why)
    return out


def _what_if(d: Decision, profile, model: ElasticModel, need_total: int, minimum: int, usable: int) -> list[str]:
    layer = max(profile.layer_bytes)
    if d.mode in ("resident", "swap"):
        return [f"- it needs memoryBudget {paste(need_total)} or more to stay whole; with less it runs elastic, "
                "streaming layers",
                f"- it needs memoryBudget {paste(minimum)} or more to run at all; with less it is refused"]
    if d.reason_code == "ExceedsFreeSpace":
        return ["- no budget: it already covers the need; it streams because the slot has no room for it whole",
                f"- it runs whole once its slot has {fb(need_total)} free for it (fewer or smaller models there)"]
    if d.mode == "elastic":
        out = [f"- each further {fb(layer)} keeps one more of the {d.total_layers - d.resident_layers} "
               f"streamed layers resident"]
        if need_total <= usable:
            out.append(f"- at memoryBudget {paste(need_total)} or more it fits whole: resident or swap")
        else:
            out.append(f"- it can never run whole on this GPU (need {fb(need_total)} > usable {fb(usable)})")
        return out
    if d.reason_code == "BudgetBelowElasticMinimum":
        if minimum > usable:
            return [f"- no budget: even streaming every layer needs {fb(minimum)}, more than the {fb(usable)} "
                    f"a {d.gpu_product} has; lower slo.contextTokens/concurrency or choose a larger GPU"]
        whole = (f"- at memoryBudget {paste(need_total)} or more it fits whole" if need_total <= usable
                 else f"- it can never run whole on this GPU (need {fb(need_total)} > usable {fb(usable)})")
        return [f"- at memoryBudget {paste(minimum)} or more it runs elastic", whole]
    if d.reason_code in ("LinkShareTooSmall", "HostMemoryFull"):
        return ["- see the neighbours above: a larger budget helps only where it keeps enough layers resident"]
    return ["- no budget alone: the GPUs of its product are full; add capacity or remove a model"]
