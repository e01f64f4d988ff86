"""The worker: admission, loading, and the state the API serves (verdicts, readiness, status).

`Worker.start` reads every model's shape, admits against the memory really available,
publishes the verdicts, then loads the applied models in a background thread (each
becomes servable as soon as it is loaded). Called by `python -m worker` and tests;
the API reads it through `lookup`, `submit`, `status` and `readiness`.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from contract.verdicts import Verdict, refused, render_document

from .admission import admit, need_for
from .config import ModelConfig, WorkerConfig
from .engine import Generation
from .sampling import SamplingParams
from .errors import ConfigError, InvalidRequest, ModelLoadError, ModelNotFound, ModelUnavailable, WorkerError
from .loader import load, resolve
from .memory import DeviceLedger, FreeBytesProbe, available_bytes, cuda_free_bytes, no_probe
from .metrics import PynvmlReader, WorkerMetrics
from .residency import Residency, make_residency
from .scheduler import Event, Job, Scheduler
from .shape import ModelShape, read_shape
from .verdicts import Publisher, PublishLoop

log = logging.getLogger(__name__)


@dataclass
class ServedModel:
    """A loaded model: its tokenizer (guarded: the executor decodes while handlers encode) and residency."""

    config: ModelConfig
    tokenizer: object
    residency: Residency
    eos_ids: frozenset[int]
    lock: threading.Lock = field(default_factory=threading.Lock)

    def encode(self, text: str) -> list[int]:
        with self.lock:
            return self.tokenizer.encode(text, add_special_tokens=True)

    def decode(self, ids: list[int]) -> str:
        with self.lock:
            return self.tokenizer.decode(ids, skip_special_tokens=True)

    def chat_prompt(self, messages: list[dict]) -> list[int]:
        if not getattr(self.tokenizer, "chat_template", None):
            raise InvalidRequest("NoChatTemplate", f"model {self.config.name} has no chat template; "
                                 "use /v1/completions or serve a model whose tokenizer defines one",
                                 param="messages")
        with self.lock:
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            return self.tokenizer.encode(text, add_special_tokens=False)


class Worker:
    def __init__(self, config: WorkerConfig, *, device: torch.device | None = None,
                 probe: FreeBytesProbe | None = None, publisher: Publisher | None = None,
                 metrics: WorkerMetrics | None = None, clock: Callable[[], float] = time.monotonic):
        self.config = config
        self.device = device or _pick_device(config.device)
        self.probe = probe or (cuda_free_bytes if self.device.type == "cuda" else no_probe)
        self.metrics = metrics or WorkerMetrics(known=[m.name for m in config.models],
                                                nvml=_nvml_reader(self.device))
        for model in config.models:
            self.metrics.budget_bytes.labels(model.name).set(model.budget_bytes)
        self.scheduler = Scheduler(min_residency_s=config.min_residency_ms / 1000,
                                   max_queued=config.max_queued_requests, metrics=self.metrics, clock=clock)
        self.started_at = int(time.time())
        self.available_bytes = 0
        self.verdicts: dict[str, Verdict] = {}
        self.served: dict[str, ServedModel] = {}
        self.shapes: dict[str, ModelShape] = {}
        self.directories: dict[str, Path] = {}
        self.ledgers: dict[str, DeviceLedger] = {}
        self._publish = PublishLoop(publisher, config.slot_id) if publisher else None
        self._lock = threading.Lock()
        self._loader = threading.Thread(target=self._load_admitted, name="worker-loader", daemon=True)
        self._loaded = threading.Event()

    # lifecycle
    def start(self) -> None:
        """Admit (synchronously), publish verdicts, start the executor, load applied models in the background."""
        for model in self.config.models:
            try:
                self.directories[model.name] = resolve(model)
                self.shapes[model.name] = read_shape(self.directories[model.name], model.dtype)
            except ModelLoadError as exc:
                self._set_verdict(refused(model.name, model.namespace, model.mode, exc.reason, exc.message))
        self.available_bytes = available_bytes(self.config.capacity_bytes, self.probe)
        readable = [(m, self.shapes[m.name]) for m in self.config.models if m.name in self.shapes]
        for verdict in admit(readable, self.available_bytes, slot=self.config.slot_id):
            self._set_verdict(verdict)
        self._publish_verdicts()
        self.scheduler.start()
        self._loader.start()

    def wait_loaded(self, timeout_s: float | None = None) -> bool:
        return self._loaded.wait(timeout_s)

    def stop(self) -> None:
        self.scheduler.stop()
        if self._publish:
            self._publish.stop()

    # serving
    def lookup(self, name: str) -> ServedModel:
        model = self.config.model(name)
        if model is None:
            raise ModelNotFound("ModelNotFound", f"model {name!r} is not served here; GET /v1/models lists "
                                "the served names (the ElasticModel names)", param="model")
        verdict = self.verdicts.get(name)
        if verdict is not None and verdict.verdict == "refused":
            raise ModelUnavailable(verdict.reason, f"model {name!r} was refused: {verdict.message}")
        served = self.served.get(name)
        if served is None:
            raise ModelUnavailable("ModelLoading", f"model {name!r} is still loading; retry shortly",
                                   retry_after_s=5)
        return served

    def generation(self, served: ServedModel, prompt_ids: list[int], *, max_tokens: int | None,
                   default_max_tokens: int | None, prompt_param: str, **sampling) -> Generation:
        """A Generation for a prompt, or InvalidRequest when prompt + max_tokens exceed contextTokens."""
        context = served.config.context_tokens
        if not prompt_ids:
            raise InvalidRequest("EmptyPrompt", "the prompt is empty; send at least one token", param=prompt_param)
        room = context - len(prompt_ids)
        if room < 1:
            raise InvalidRequest("ContextLengthExceeded", f"the prompt has {len(prompt_ids)} tokens but model "
                                 f"{served.config.name} serves a context of {context} tokens; shorten the prompt",
                                 param=prompt_param)
        wanted = max_tokens if max_tokens is not None else min(room, default_max_tokens or room)
        if len(prompt_ids) + wanted > context:
            raise InvalidRequest("ContextLengthExceeded", f"prompt ({len(prompt_ids)} tokens) + max_tokens "
                                 f"({wanted}) = {len(prompt_ids) + wanted} exceeds the context of {context} tokens "
                                 f"of model {served.config.name}; lower max_tokens to at most {room}",
                                 param="max_tokens")
        return Generation(prompt_ids=prompt_ids, params=SamplingParams(max_tokens=wanted, **sampling),
                          eos_ids=served.eos_ids, decode=served.decode)

    def submit(self, name: str, generation: Generation, sink: Callable[[Event], None]) -> Job:
        return self.scheduler.submit(name, generation, sink)

    # state
    def readiness(self) -> tuple[bool, dict]:
        """Ready when every applied model is loaded; refused models are listed, they do not block readiness."""
        with self._lock:
            applied = [n for n, v in self.verdicts.items() if v.verdict == "applied"]
            loading = [n for n in applied if n not in self.served]
            refused_models = {n: v.reason for n, v in self.verdicts.items() if v.verdict == "refused"}
        ready = self._loaded.is_set() and not loading
        return ready, {"ready": ready, "loading": loading, "serving": sorted(self.served),
                       "refused": refused_models}

    def status(self) -> dict:
        ready, _ = self.readiness()
        models = []
        for model in self.config.models:
            verdict = self.verdicts[model.name]
            ledger = self.ledgers.get(model.name)
            served = self.served.get(model.name)
            entry = verdict.as_dict()
            entry.update(
                state="refused" if verdict.verdict == "refused" else ("serving" if served else "loading"),
                budgetBytes=model.budget_bytes, contextTokens=model.context_tokens, concurrency=model.concurrency,
                deviceBytes=ledger.total_bytes if ledger else 0,
                peakDeviceBytes=ledger.peak_bytes if ledger else 0,
                onDevice=bool(served and served.residency.on_device),
            )
            if served and model.mode == "elastic":
                entry["deviceResidentLayers"] = len(served.residency.device_resident_layers())
            models.append(entry)
        return {"slot": self.config.slot_id, "product": self.config.product, "device": str(self.device),
                "capacityBytes": self.config.capacity_bytes, "availableBytes": self.available_bytes,
                "ready": ready, "swap": {"active": self.scheduler.active_swap_model(), "swaps": self.scheduler.swaps,
                                         "minResidencyMs": self.config.min_residency_ms},
                "models": models}

    # internals
    def _load_admitted(self) -> None:
        for model in self.config.models:
            if self.verdicts[model.name].verdict != "applied":
                continue
            try:
                self._load_one(model)
            except (WorkerError, RuntimeError) as exc:  # BudgetExceeded, LoadFailed, a CUDA out-of-memory
                log.exception("loading %s failed", model.ref)
                message = getattr(exc, "message", str(exc))
                self._set_verdict(refused(model.name, model.namespace, model.mode,
                                          getattr(exc, "reason", "LoadFailed"), message))
                self.ledgers.pop(model.name, None)
                self._publish_verdicts()
        self._loaded.set()

    def _load_one(self, model: ModelConfig) -> None:
        verdict = self.verdicts[model.name]
        need = need_for(model, self.shapes[model.name], verdict.resident_layers)
        ledger = DeviceLedger(model.name, model.budget_bytes, self.device)
        self.ledgers[model.name] = ledger
        ledger.reserve("kv-cache", need.kv_cache)
        ledger.reserve("activation", need.activation)
        ledger.reserve("overhead", need.overhead)
        tokenizer, host_model = load(self.directories[model.name], model.dtype)
        residency = make_residency(model.mode, host_model, ledger, self.device,
                                   resident_layers=verdict.resident_layers)
        residency.on_streamed_bytes = self.metrics.streamed_bytes.labels(model.name).inc
        residency.load()
        self.metrics.serve(model.name, model.mode, ledger,
                           kv_bytes_per_token=self.shapes[model.name].kv_bytes_per_token)
        eos = host_model.generation_config.eos_token_id if host_model.generation_config else None
        eos_ids = frozenset([eos] if isinstance(eos, int) else (eos or [])) | (
            {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set())
        served = ServedModel(model, tokenizer, residency, eos_ids)
        self.scheduler.add_model(model.name, residency, concurrency=model.concurrency)
        with self._lock:
            self.served[model.name] = served
        log.info("%s loaded (%s, %d device bytes)", model.ref, model.mode, ledger.total_bytes)

    def _set_verdict(self, verdict: Verdict) -> None:
        with self._lock:
            old = self.verdicts.get(verdict.name)
            self.verdicts[verdict.name] = verdict
        if old is not None:
            self.metrics.verdict.remove(old.name, old.namespace, old.mode, old.verdict, old.reason)
        self.metrics.missing_bytes.labels(verdict.name).set(verdict.missing_bytes)
        self.metrics.verdict.labels(verdict.name, verdict.namespace, verdict.mode, verdict.verdict,
                                    verdict.reason).set(1)
        log.log(logging.INFO if verdict.verdict == "applied" else logging.WARNING,
                "%s/%s %s: %s", verdict.namespace, verdict.name, verdict.verdict, verdict.message)

    def _publish_verdicts(self) -> None:
        if self._publish is not None:
            ordered = [self.verdicts[m.name] for m in self.config.models]
            self._publish.submit(render_document(self.config.slot_id, ordered))


def _nvml_reader(device: torch.device) -> PynvmlReader | None:
    """NVML for the worker's GPU (its metrics of other processes); None on CPU or without a driver."""
    if device.type != "cuda":
        return None
    uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    return PynvmlReader.open(device.index or 0, f"GPU-{uuid}" if uuid is not None else None)


def _pick_device(choice: str) -> torch.device:
    if choice == "cuda" and not torch.cuda.is_available():
        raise ConfigError("NoCudaDevice", "device: cuda is configured but torch sees no CUDA device; "
                          "check the GPU resource request and the NVIDIA runtime, or set device: auto")
    if choice in ("cuda", "auto") and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
