"""Decisions to and from their documented, stable JSON form (camelCase, as status.assigned).

Owns the wire shape of Decision, Pending and InputError. Called by the CLI
(`plan -o json|yaml`), by compose (decisions/<ns>/<name>.yaml) and by the loader
of previous decisions. docs/plan-json.md documents the shape.
"""
from __future__ import annotations

from dataclasses import asdict

from contract.wire import API_VERSION, SOURCE_ANNOTATION
from controller.types import DEFAULT_COMPOSITION, Decision, ElasticModel, InputError, Pending, Plan, Predicted


def model_to_doc(m: ElasticModel) -> dict:
    """An ElasticModel as the document it was parsed from (budget in bytes), so it can be read back
    as the model's last good spec when its file later breaks."""
    spec: dict = {"model": m.model, "memoryBudget": m.budget_bytes}
    if m.revision != "main":
        spec["revision"] = m.revision
    if m.has_slo:
        slo = {"contextTokens": m.slo.context_tokens, "concurrency": m.slo.concurrency}
        slo.update({k: v for k, v in (("ttftMs", m.slo.ttft_ms), ("tpotMs", m.slo.tpot_ms)) if v is not None})
        spec["slo"] = slo
    if m.gpu_product is not None:
        spec["gpu"] = {"product": m.gpu_product}
    if m.composition != DEFAULT_COMPOSITION:
        spec["compositionRef"] = {"name": m.composition}
    if m.served_names:
        spec["servedNames"] = list(m.served_names)
    if m.weight_dtype != "auto":
        spec["weights"] = {"dtype": m.weight_dtype}
    metadata: dict = {"name": m.name, "namespace": m.namespace}
    if m.source is not None:
        metadata["annotations"] = {SOURCE_ANNOTATION: m.source.file}
    return {"apiVersion": API_VERSION, "kind": "ElasticModel", "metadata": metadata, "spec": spec}


def decision_to_dict(d: Decision) -> dict:
    """A decision as its record under decisions/ and status.assigned hold it: `gpu.pool` only on a pool's node
    and `weightDtype` only when not auto, so a record written before either existed reads back unchanged and an
    upgrade rewrites no record (plan_to_dict shows `gpu.pool` always)."""
    return {
        "name": d.name,
        "namespace": d.namespace,
        "model": d.model,
        "gpu": {"product": d.gpu_product, "slot": d.slot} | ({"pool": d.pool} if d.pool is not None else {}),
        "mode": d.mode,
        "residentLayers": d.resident_layers,
        "totalLayers": d.total_layers,
        "needBytes": d.need_bytes,
        "budgetBytes": d.budget_bytes,
        "footprintBytes": d.footprint_bytes,
        "predicted": None if d.predicted is None else {
            "ttftMs": d.predicted.ttft_ms,
            "tpotMs": d.predicted.tpot_ms,
            "swapInMs": d.predicted.swap_in_ms,
            "linkShareGBps": d.predicted.link_share_gbps,
            "aloneTtftMs": d.predicted.alone_ttft_ms,
            "aloneTpotMs": d.predicted.alone_tpot_ms,
        },
        "estimated": d.estimated,
        "hostBytes": d.host_bytes,
        "sloMet": d.slo_met,
        "reason": d.reason,
        "reasonCode": d.reason_code,
        "profile": d.profile,
    } | ({"weightDtype": d.weight_dtype} if d.weight_dtype != "auto" else {})


def decision_from_dict(doc: dict) -> Decision:
    predicted = doc.get("predicted")
    gpu = doc.get("gpu") or {}
    return Decision(
        name=doc["name"],
        namespace=doc["namespace"],
        model=doc["model"],
        gpu_product=gpu.get("product"),
        slot=gpu.get("slot"),
        mode=doc["mode"],
        resident_layers=int(doc["residentLayers"]),
        total_layers=int(doc["totalLayers"]),
        need_bytes=int(doc["needBytes"]),
        budget_bytes=int(doc["budgetBytes"]),
        footprint_bytes=int(doc.get("footprintBytes", 0)),
        predicted=None if predicted is None else Predicted(
            ttft_ms=predicted["ttftMs"], tpot_ms=predicted["tpotMs"], swap_in_ms=predicted.get("swapInMs"),
            link_share_gbps=predicted.get("linkShareGBps"), alone_ttft_ms=predicted.get("aloneTtftMs"),
            alone_tpot_ms=predicted.get("aloneTpotMs"),
        ),
        estimated=bool(doc.get("estimated", False)),
        host_bytes=int(doc.get("hostBytes", 0)),
        slo_met=doc.get("sloMet"),
        reason=doc.get("reason", ""),
        reason_code=doc.get("reasonCode", ""),
        profile=doc.get("profile"),
        weight_dtype=doc.get("weightDtype", "auto"),
        pool=gpu.get("pool"),
    )


def pending_to_dict(p: Pending) -> dict:
    return {
        "name": p.name,
        "namespace": p.namespace,
        "model": p.model,
        "gpu": {"product": p.gpu_product},
        "revision": p.revision,
        "reason": p.reason,
        "reasonCode": p.reason_code,
    } | ({"weightDtype": p.weight_dtype} if p.weight_dtype != "auto" else {})


def error_to_dict(e: InputError) -> dict:
    return {k: v for k, v in asdict(e).items()}


def _plan_decision(d: Decision) -> dict:
    """A decision in `plan -o json`: its record, with `gpu.pool` null on a fixed node (docs/plan-json.md)."""
    doc = decision_to_dict(d)
    return doc | {"gpu": {**doc["gpu"], "pool": d.pool}}


def assigned_patch(d: Decision) -> dict:
    """`status.assigned` as a merge-patch: the optional fields null where the decision has none, so a value the
    last decision had (a pool, a weight dtype) is deleted rather than kept under merge-patch."""
    doc = _plan_decision(d)
    return doc | {"weightDtype": doc.get("weightDtype")}


def plan_to_dict(plan: Plan, errors: tuple[InputError, ...] = (), capacity: dict | None = None) -> dict:
    """The `gpushare plan -o json` document; `capacity`: the GPUs it keeps and their cost
    (controller.planning.bill.capacity_doc)."""
    doc = {
        "apiVersion": API_VERSION,
        "kind": "Plan",
        "decisions": [_plan_decision(d) for d in plan.decisions],
        "pending": [pending_to_dict(p) for p in plan.pending],
        "errors": [error_to_dict(e) for e in errors],
    }
    if capacity is not None:
        doc["capacity"] = capacity
    return doc
