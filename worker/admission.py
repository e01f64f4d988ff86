"""Admission: pure arithmetic that decides, before anything loads, which models fit.

need(model) = weights on the device + streaming buffers (elastic) + KV cache for
contextTokens x concurrency + activation peak + runtime workspace. A model is
applied when its need fits both its budget and what is left of the slot; resident
and elastic models each take their need, the swap group takes the largest need of
its members (one of them is on the device at a time). Called by worker.runtime.
"""
from __future__ import annotations

from dataclasses import dataclass

from contract.quantity import format_bytes
from contract.verdicts import Verdict

from .config import ModelConfig
from .shape import ModelShape


@dataclass(frozen=True)
class Need:
    """Device bytes one model needs, by part."""

    weights: int
    buffers: int
    kv_cache: int
    activation: int
    workspace: int
    resident_layers: int | None = None  # elastic only

    @property
    def total(self) -> int:
        return self.weights + self.buffers + self.kv_cache + self.activation + self.workspace

    def explain(self) -> str:
        parts = [f"weights {format_bytes(self.weights)}"]
        if self.buffers:
            parts.append(f"2 streaming buffers {format_bytes(self.buffers)}")
        parts += [f"KV cache {format_bytes(self.kv_cache)}", f"activations {format_bytes(self.activation)}"]
        if self.workspace:
            parts.append(f"workspace {format_bytes(self.workspace)}")
        return " + ".join(parts)


def need_for(model: ModelConfig, shape: ModelShape, workspace_bytes: int, resident_layers: int | None = None) -> Need:
    """The need of `model` in its mode; elastic keeps `resident_layers` (default: the configured count)."""
    kv = shape.kv_bytes_per_token * model.context_tokens * model.concurrency
    activation = shape.activation_bytes(model.context_tokens)
    if model.mode != "elastic":
        return Need(shape.weight_bytes, 0, kv, activation, workspace_bytes)
    kept = min(shape.total_layers, model.resident_layers if resident_layers is None else resident_layers)
    streamed = shape.layer_buffer_bytes[kept:]
    weights = shape.embedding_bytes + shape.other_bytes + sum(shape.layer_bytes[:kept])
    return Need(weights, 2 * max(streamed, default=0), kv, activation, workspace_bytes, resident_layers=kept)


def most_resident_layers(model: ModelConfig, shape: ModelShape, limit: int, workspace_bytes: int) -> int:
    """Elastic without a configured count: the most decoder layers whose need still fits `limit` (0 if none)."""
    best = 0
    for kept in range(shape.total_layers + 1):
        if need_for(model, shape, workspace_bytes, kept).total <= limit:
            best = kept
    return best


def admit(models: list[tuple[ModelConfig, ModelShape]], available_bytes: int, *, slot: str,
          workspace_bytes: int = 0) -> list[Verdict]:
    """One verdict per model, in config order; swap models share one area sized by the largest need."""
    remaining = available_bytes
    swap_area = 0
    verdicts = []
    for model, shape in models:
        headroom = remaining + (swap_area if model.mode == "swap" else 0)
        layers = model.resident_layers
        if model.mode == "elastic" and layers is None:
            layers = most_resident_layers(model, shape, min(model.budget_bytes, headroom), workspace_bytes)
        need = need_for(model, shape, workspace_bytes, layers)
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


def _judge(model: ModelConfig, need: Need, headroom: int, slot: str) -> Verdict:
    layers = f" with {need.resident_layers} resident layers" if need.resident_layers is not None else ""
    fewer = ", or keep fewer resident layers" if need.resident_layers else ""
    common = dict(name=model.name, namespace=model.namespace, mode=model.mode, need_bytes=need.total,
                  resident_layers=need.resident_layers)
    if need.total > model.budget_bytes:
        return Verdict(**common, verdict="refused", reason="ExceedsBudget",
                       available_bytes=model.budget_bytes, missing_bytes=need.total - model.budget_bytes,
                       message=f"{model.mode}{layers} needs {format_bytes(need.total)} ({need.explain()}) but the "
                               f"budget is {format_bytes(model.budget_bytes)}; missing "
                               f"{format_bytes(need.total - model.budget_bytes)}: raise memoryBudget or lower "
                               f"slo.contextTokens or slo.concurrency{fewer}")
    if need.total > headroom:
        return Verdict(**common, verdict="refused", reason="InsufficientMemory",
                       available_bytes=max(0, headroom), missing_bytes=need.total - max(0, headroom),
                       message=f"{model.mode}{layers} needs {format_bytes(need.total)} ({need.explain()}) but slot "
                               f"{slot} has {format_bytes(max(0, headroom))} left after the models before it; "
                               f"missing {format_bytes(need.total - max(0, headroom))}: move a model to another "
                               "GPU, lower the budget of the others, or free device memory")
    return Verdict(**common, verdict="applied", reason="Applied",
                   available_bytes=min(model.budget_bytes, headroom), missing_bytes=0,
                   message=f"{model.mode}{layers}: needs {format_bytes(need.total)} ({need.explain()}) of "
                           f"{format_bytes(min(model.budget_bytes, headroom))} available")
