"""The worker config (schemas/worker-config.schema.json): load, validate, and expose typed values.

Called by `python -m worker` and by tests. The controller renders this document into
a ConfigMap; nothing here invents a field the schema does not define.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import yaml
from jsonschema.exceptions import best_match

import schemas
from contract.footprint import Terms, terms_from_document
from contract.swapturn import MIN_RESIDENCY_MS

from .errors import ConfigError

Mode = Literal["resident", "swap", "elastic"]


@dataclass(frozen=True)
class ModelConfig:
    name: str
    namespace: str
    model: str
    mode: Mode
    budget_bytes: int
    context_tokens: int
    concurrency: int
    resident_layers: int | None = None
    revision: str | None = None
    dtype: str = "auto"
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    footprint: Terms | None = None  # the controller's planned terms; None: estimate from the checkpoint
    served_names: tuple[str, ...] = ()  # aliases: more names requests may use for this model
    weight_dtype: str = "auto"  # spec.weights.dtype: auto, bfloat16, float16, int8 or int4 (contract.precision)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def latency_slo(self) -> bool:
        """Whether the model has a latency target (its executor's stream gets priority)."""
        return self.ttft_ms is not None or self.tpot_ms is not None


@dataclass(frozen=True)
class VerdictTarget:
    namespace: str
    name: str


@dataclass(frozen=True)
class WorkerConfig:
    slot_id: str
    product: str
    capacity_bytes: int
    device: Literal["auto", "cuda", "cpu"] = "auto"
    max_queued_requests: int = 64
    min_residency_ms: int = MIN_RESIDENCY_MS
    max_request_bytes: int = 4 << 20
    sse_keepalive_ms: int = 10_000
    intra_op_threads: int | None = None  # server.intraOpThreads; None: worker.threads chooses
    verdicts: VerdictTarget | None = None
    models: tuple[ModelConfig, ...] = field(default_factory=tuple)

    def model(self, name: str) -> ModelConfig | None:
        return next((m for m in self.models if m.name == name or name in m.served_names), None)


def parse_config(document: object, *, source: str = "<config>") -> WorkerConfig:
    """A validated WorkerConfig from a parsed YAML/JSON document; ConfigError names the bad field."""
    error = best_match(schemas.validator("worker-config").iter_errors(document))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(document)"
        raise ConfigError(
            "InvalidConfig",
            f"{source}: field {where}: {error.message}; fix the worker config to match "
            "schemas/worker-config.schema.json (the controller renders it; see docs/worker.md)",
        )
    assert isinstance(document, dict)
    names = [n for m in document["models"] for n in dict.fromkeys((m["name"], *m.get("servedNames", ())))]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(
            "DuplicateModelName",
            f"{source}: models {duplicates} appear more than once; served model names must be unique per worker",
        )
    server = document.get("server", {})
    target = document.get("verdicts", {}).get("configMap")
    slot = document["slot"]
    return WorkerConfig(
        slot_id=slot["id"],
        product=slot["product"],
        capacity_bytes=slot["capacityBytes"],
        device=document.get("device", "auto"),
        max_queued_requests=server.get("maxQueuedRequests", 64),
        min_residency_ms=server.get("minResidencyMs", MIN_RESIDENCY_MS),
        max_request_bytes=server.get("maxRequestBytes", 4 << 20),
        sse_keepalive_ms=server.get("sseKeepAliveMs", 10_000),
        intra_op_threads=server.get("intraOpThreads"),
        verdicts=VerdictTarget(target["namespace"], target["name"]) if target else None,
        models=tuple(
            ModelConfig(
                name=m["name"], namespace=m["namespace"], model=m["model"], mode=m["mode"],
                budget_bytes=m["budgetBytes"], context_tokens=m["contextTokens"],
                concurrency=m["concurrency"], resident_layers=m.get("residentLayers"),
                revision=m.get("revision"), dtype=m.get("dtype", "auto"),
                ttft_ms=m.get("slo", {}).get("ttftMs"), tpot_ms=m.get("slo", {}).get("tpotMs"),
                footprint=terms_from_document(m["footprint"]) if "footprint" in m else None,
                served_names=tuple(m.get("servedNames", ())),
                weight_dtype=m.get("weightDtype", "auto"),
            )
            for m in document["models"]
        ),
    )


def load_config(path: str | Path) -> WorkerConfig:
    """Read and validate the worker config file at `path`."""
    path = Path(path)
    try:
        document = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError("ConfigUnreadable", f"cannot read worker config {path}: {exc.strerror}; "
                          "check the --config path and the ConfigMap mount") from exc
    except yaml.YAMLError as exc:
        raise ConfigError("InvalidConfig", f"{path} is not valid YAML: {exc}; fix the file") from exc
    return parse_config(document, source=str(path))
