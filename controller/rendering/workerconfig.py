"""The worker's configuration (data `worker.yaml` of its ConfigMap), built from decisions.

Owns the mapping from placed decisions to schemas/worker-config.schema.json:
the slot, where verdicts go, and one entry per served model (refused models are
never in it). Called by controller.rendering.compose, which validates every entry on its own
so that one bad model is reported alone.
"""
from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from jsonschema import Draft202012Validator

import schemas
from contract.footprint import terms_document
from contract.wire import API_VERSION, WORKER_CONFIG_KIND
from controller.types import Decision, ElasticModel, GpuSlot


def model_entry(model: ElasticModel, decision: Decision) -> dict:
    """One model's entry. A planned decision carries its profile's dtype and footprint terms, so the
    worker admits with exactly the arithmetic the plan used (contract.footprint)."""
    entry = {
        "name": model.name,
        "namespace": model.namespace,
        "model": model.model,
        "revision": model.revision,
        "mode": decision.mode,
        "budgetBytes": decision.budget_bytes,
        "residentLayers": decision.resident_layers,
        "contextTokens": model.slo.context_tokens,
        "concurrency": model.slo.concurrency,
    }
    if model.served_names:
        entry["servedNames"] = list(model.served_names)
    if decision.dtype is not None:
        entry["dtype"] = decision.dtype
    if model.weight_dtype != "auto":
        entry["weightDtype"] = model.weight_dtype
    if decision.terms is not None:
        entry["footprint"] = terms_document(decision.terms)
    slo = {key: value for key, value in (("ttftMs", model.slo.ttft_ms), ("tpotMs", model.slo.tpot_ms))
           if value is not None}
    if slo:
        entry["slo"] = slo  # the worker gives models with latency targets high-priority streams
    return entry


@lru_cache(maxsize=1)
def _entry_validator() -> Draft202012Validator:
    return Draft202012Validator(schemas.load("worker-config")["properties"]["models"]["items"])


_PROBE_SLOT = {"id": "probe", "product": "probe", "capacityBytes": 1}


def entry_problem(entry: dict) -> str | None:
    """Why one model entry breaks the worker-config schema, or None when it is valid."""
    if schemas.is_valid("worker-config")({"apiVersion": API_VERSION, "kind": WORKER_CONFIG_KIND, "slot": _PROBE_SLOT,
                                          "models": [entry]}):
        return None
    errors = sorted(_entry_validator().iter_errors(entry), key=lambda e: list(e.absolute_path))
    if not errors:
        return None
    where = "/".join(str(p) for p in errors[0].absolute_path) or "(entry)"
    return f"{where}: {errors[0].message}"


def worker_config(slot: GpuSlot, entries: Sequence[dict], verdicts: tuple[str, str]) -> dict:
    """The whole document; `entries` are valid model entries, sorted by the caller."""
    doc = {
        "apiVersion": API_VERSION,
        "kind": WORKER_CONFIG_KIND,
        "slot": {"id": slot.id, "product": slot.product, "capacityBytes": slot.usable_bytes},
        "verdicts": {"configMap": {"namespace": verdicts[0], "name": verdicts[1]}},
        "models": list(entries),
    }
    if not schemas.is_valid("worker-config")(doc):
        schemas.validator("worker-config").validate(doc)  # raises, explaining what is wrong
    return doc
