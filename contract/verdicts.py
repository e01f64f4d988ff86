"""The verdicts document: what a worker applied or refused, per model, with the numbers.

Owns the Verdict shape and its one writer (`render_document`, called by the
worker) and one reader (`parse_document`, called by the controller), both
checked against schemas/verdicts.schema.json. The worker publishes the text into
a ConfigMap under contract.wire.VERDICTS_DATA_KEY; the controller turns what it
reads into Ready or Degraded. Pure.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import yaml

import schemas
from contract.wire import API_VERSION, VERDICTS_KIND


class InvalidVerdicts(ValueError):
    """A verdicts document that is not YAML or does not match schemas/verdicts.schema.json."""

    reason = "InvalidVerdicts"


@dataclass(frozen=True)
class Verdict:
    name: str
    namespace: str
    mode: str
    verdict: Literal["applied", "refused"]
    reason: str
    message: str
    need_bytes: int
    available_bytes: int
    missing_bytes: int
    resident_layers: int | None = None

    def as_dict(self) -> dict:
        """camelCase keys, as the schema names them; residentLayers only for elastic."""
        out = {"name": self.name, "namespace": self.namespace, "mode": self.mode, "verdict": self.verdict,
               "reason": self.reason, "message": self.message, "needBytes": self.need_bytes,
               "availableBytes": self.available_bytes, "missingBytes": self.missing_bytes}
        if self.mode == "elastic" and self.resident_layers is not None:
            out["residentLayers"] = self.resident_layers
        return out


@dataclass(frozen=True)
class VerdictsDocument:
    slot: str
    verdicts: tuple[Verdict, ...]
    device_uuid: str | None = None  # the GPU the device plugin gave the worker (a profiler beside it uses it)


def refused(name: str, namespace: str, mode: str, reason: str, message: str) -> Verdict:
    """A refusal that has no byte arithmetic (unreadable model, failed load)."""
    return Verdict(name=name, namespace=namespace, mode=mode, verdict="refused", reason=reason,
                   message=message, need_bytes=0, available_bytes=0, missing_bytes=0)


def render_document(slot: str, verdicts: list[Verdict], device_uuid: str | None = None) -> str:
    """The YAML text of one worker's verdicts: the slot, the GPU's UUID (on a GPU) and one entry per configured
    model, in config order."""
    doc = {"apiVersion": API_VERSION, "kind": VERDICTS_KIND, "slot": slot,
           **({"deviceUuid": device_uuid} if device_uuid else {}), "models": [v.as_dict() for v in verdicts]}
    schemas.validator("verdicts").validate(doc)
    return yaml.safe_dump(doc, sort_keys=False)


def parse_document(text: str) -> VerdictsDocument:
    """The verdicts `render_document` wrote; InvalidVerdicts names what is wrong."""
    try:
        doc = yaml.safe_load(text or "")
    except yaml.YAMLError as exc:
        raise InvalidVerdicts(f"not YAML: {exc}") from None
    errors = sorted(schemas.validator("verdicts").iter_errors(doc), key=lambda e: list(e.absolute_path))
    if errors:
        where = "/".join(str(p) for p in errors[0].absolute_path) or "(document)"
        raise InvalidVerdicts(f"not a WorkerVerdicts document (schemas/verdicts.schema.json): {where}: "
                              f"{errors[0].message}")
    return VerdictsDocument(doc["slot"], tuple(
        Verdict(name=e["name"], namespace=e["namespace"], mode=e["mode"], verdict=e["verdict"], reason=e["reason"],
                message=e["message"], need_bytes=e["needBytes"], available_bytes=e["availableBytes"],
                missing_bytes=e["missingBytes"], resident_layers=e.get("residentLayers"))
        for e in doc["models"]), doc.get("deviceUuid"))
