"""Admission: pure arithmetic that decides, before anything loads, which models fit.

A model's need is its footprint (contract.footprint, the arithmetic the planner
used): from the terms the controller rendered into the worker config, or, in a
hand-written config, terms estimated from the checkpoint by the same rules. A
checkpoint larger than the terms it was planned with is refused (ProfileMismatch)
rather than loaded into an OOM. A model is applied when its need fits both its
budget and what is left of the slot; resident and elastic models each take their
need, the swap group takes the largest need of its members (one of them is on the
device at a time). Called by worker.runtime.
"""
from __future__ import annotations

from contract.footprint import Footprint, Terms, describe, footprint, largest_elastic
from contract.quantity import format_bytes
from contract.verdicts import Verdict

from .config import ModelConfig
from .shape import ModelShape, estimated_terms


def terms_for(model: ModelConfig, shape: ModelShape) -> Terms:
    """The terms the model is admitted by: the planned ones, else the checkpoint's estimate."""
    return model.footprint if model.footprint is not None else estimated_terms(shape)


def need_for(model: ModelConfig, shape: ModelShape, resident_layers: int | None = None) -> Footprint:
    """The need of `model` in its mode; elastic keeps `resident_layers` (default: the configured count)."""
    terms = terms_for(model, shape)
    if model.mode != "elastic":
        return footprint(terms, model.context_tokens, model.concurrency)
    kept = model.resident_layers if resident_layers is None else resident_layers
    return footprint(terms, model.context_tokens, model.concurrency, kept)


def most_resident_layers(model: ModelConfig, shape: ModelShape, limit: int) -> int:
    """Elastic without a configured count: the most decoder layers whose need still fits `limit` (0 if none)."""
    found = largest_elastic(terms_for(model, shape), model.context_tokens, model.concurrency, limit)
    return 0 if found is None else found.resident_layers


def shape_mismatch(model: ModelConfig, shape: ModelShape) -> str | None:
    """Why the checkpoint does not match the terms it was planned with (more bytes than planned), or None."""
    planned = model.footprint
    if planned is None:
        return None
    if shape.total_layers != planned.total_layers:
        return (f"the checkpoint has {shape.total_layers} decoder layers, the plan assumed {planned.total_layers}")
    fixed = shape.embedding_bytes + shape.other_bytes
    if fixed > planned.fixed_bytes:
        return (f"embeddings, norm and head hold {fixed} bytes at {shape.dtype}, the plan assumed "
                f"{planned.fixed_bytes}")
    for i, (real, assumed) in enumerate(zip(shape.layer_bytes, planned.layer_bytes)):
        if real > assumed:
            return f"decoder layer {i} holds {real} bytes at {shape.dtype}, the plan assumed {assumed}"
    if shape.kv_bytes_per_token > planned.kv_bytes_per_token:
        return (f"the KV cache takes {shape.kv_bytes_per_token} bytes per token, the plan assumed "
                f"{planned.kv_bytes_per_token}")
    return None


def admit(models: list[tuple[ModelConfig, ModelShape]], available_bytes: int, *, slot: str) -> list[Verdict]:
    """One verdict per model, in config order; swap models share one area sized by the largest need."""
    remaining = available_bytes
    swap_area = 0
    verdicts = []
    for model, shape in models:
        headroom = remaining + (swap_area if model.mode == "swap" else 0)
        mismatch = shape_mismatch(model, shape)
        if mismatch is not None:
            verdicts.append(Verdict(
                name=model.name, namespace=model.namespace, mode=model.mode, verdict="refused",
                reason="ProfileMismatch", need_bytes=0, available_bytes=0, missing_bytes=0,
                message=f"{mismatch}: its profile under-counts it, so loading it could run out of memory; "
                        "re-profile the model (delete its profile so the profiler Job runs again) or fix "
                        "spec.model / the revision"))
            continue
        layers = model.resident_layers
        if model.mode == "elastic" and layers is None:
            layers = most_resident_layers(model, shape, min(model.budget_bytes, headroom))
        need = need_for(model, shape, layers)
        verdict = _judge(model, need, headroom, slot)
        verdicts.append(verdict)
        if verdict.verdict != "applied":
            continue
        if model.mode == "swap":
            remaining -= max(0, need.total - swap_area)
            swap_area = max(swap_area, need.total)
        else:
            remaining -= need.total
    return verdicts


def _judge(model: ModelConfig, need: Footprint, headroom: int, slot: str) -> Verdict:
    elastic = model.mode == "elastic"
    layers = f" with {need.resident_layers} resident layers" if elastic else ""
    fewer = ", or keep fewer resident layers" if elastic and need.resident_layers else ""
    common = dict(name=model.name, namespace=model.namespace, mode=model.mode, need_bytes=need.total,
                  resident_layers=need.resident_layers if elastic else None)
    if need.total > model.budget_bytes:
        return Verdict(**common, verdict="refused", reason="ExceedsBudget",
                       available_bytes=model.budget_bytes, missing_bytes=need.total - model.budget_bytes,
                       message=f"{model.mode}{layers} needs {format_bytes(need.total)} ({describe(need)}) but the "
                               f"budget is {format_bytes(model.budget_bytes)}; missing "
                               f"{format_bytes(need.total - model.budget_bytes)}: raise memoryBudget or lower "
                               f"slo.contextTokens or slo.concurrency{fewer}")
    if need.total > headroom:
        return Verdict(**common, verdict="refused", reason="InsufficientMemory",
                       available_bytes=max(0, headroom), missing_bytes=need.total - max(0, headroom),
                       message=f"{model.mode}{layers} needs {format_bytes(need.total)} ({describe(need)}) but slot "
                               f"{slot} has {format_bytes(max(0, headroom))} left after the models before it; "
                               f"missing {format_bytes(need.total - max(0, headroom))}: move a model to another "
                               "GPU, lower the budget of the others, or free device memory")
    return Verdict(**common, verdict="applied", reason="Applied",
                   available_bytes=min(model.budget_bytes, headroom), missing_bytes=0,
                   message=f"{model.mode}{layers}: needs {format_bytes(need.total)} ({describe(need)}) of "
                           f"{format_bytes(min(model.budget_bytes, headroom))} available")
