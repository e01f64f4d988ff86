"""The worker: admission, loading, and the state the API serves (verdicts, readiness, status).

`Worker.start` reads every model's shape (fetching its files first when they are not in the
cache), admits against the memory really available, publishes the verdicts, then loads the
applied models in a background thread, smallest first (`start_in_background` runs all of it
off the caller's thread, so the API serves health from the first second); each model serves
(its own executor thread starts) as soon as it is loaded, without waiting for its neighbours. Called by `python -m worker` and tests; the API reads it
through `lookup`, `submit`, `status`, `model_state`, `readiness` and `health`.
"""
from __future__ import annotations

import gc
import logging
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import torch

from contract.gpu_catalog import gpu_uuid
from contract.verdicts import Verdict, refused, render_document

from .admission import admit, need_for
from .config import ModelConfig, WorkerConfig
from engine.batch import Generation, ModelEngine
from engine.sampling import SamplingParams, TokenConstraint
from .grammar import Grammars
from .errors import ConfigError, InvalidRequest, ModelLoadError, ModelNotFound, ModelUnavailable
from .loader import load, resolve
from engine.memory import DeviceLedger, FreeBytesProbe, available_bytes, cuda_free_bytes, no_probe
from .metrics import PynvmlReader, WorkerMetrics
from .prompts import PromptEncoder
from .reconfigure import ConfigDiff, diff
from engine.quantize import device_capability
from engine.residency import Residency, make_residency
from .events import Event
from .job import Job
from .scheduler import DEFAULT_STALL_S, Scheduler
from .shape import ModelShape, read_shape
from .verdicts import Publisher, PublishLoop

log = logging.getLogger(__name__)


@dataclass
class ServedModel:
    """A loaded model: its tokenizer (guarded: the executor decodes while handlers encode with their own
    copy, `prompts`), its vocabulary size, its residency and its engine."""

    config: ModelConfig
    tokenizer: object
    residency: Residency
    engine: ModelEngine
    eos_ids: frozenset[int]
    vocab_size: int
    lock: threading.Lock = field(default_factory=threading.Lock)
    prompts: PromptEncoder = field(init=False)
    grammars: Grammars = field(init=False)

    def __post_init__(self) -> None:
        self.prompts = PromptEncoder(self.tokenizer, self.config.name, self.vocab_size)
        self.grammars = Grammars(self.prompts, self.vocab_size, self.eos_ids)

    def decode(self, ids: list[int]) -> str:
        with self.lock:
            return self.tokenizer.decode(ids, skip_special_tokens=True)


class Worker:
    def __init__(self, config: WorkerConfig, *, device: torch.device | None = None,
                 probe: FreeBytesProbe | None = None, publisher: Publisher | None = None,
                 metrics: WorkerMetrics | None = None, clock: Callable[[], float] = time.monotonic,
                 stall_s: float = DEFAULT_STALL_S):
        self.config = config
        self.device = device or _pick_device(config.device)
        self.probe = probe or (cuda_free_bytes if self.device.type == "cuda" else no_probe)
        self.metrics = metrics or WorkerMetrics(known=[m.name for m in config.models],
                                                nvml=_nvml_reader(self.device))
        for model in config.models:
            self.metrics.budget_bytes.labels(model.name).set(model.budget_bytes)
            for kind, ms in (("ttft", model.ttft_ms), ("tpot", model.tpot_ms)):
                if ms is not None:
                    self.metrics.slo_seconds.labels(model.name, kind).set(ms / 1000)
        self.scheduler = Scheduler(min_residency_s=config.min_residency_ms / 1000,
                                   max_queued=config.max_queued_requests, metrics=self.metrics, clock=clock,
                                   stall_s=stall_s)
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
        self._loader_died: str | None = None
        self._apply_lock = threading.Lock()

    # lifecycle
    def start(self) -> None:
        """Admit (synchronously), publish verdicts, start the executor, load applied models in the background."""
        self.shapes.update(self._read_shapes(self.config.models))
        self.available_bytes = available_bytes(self.config.capacity_bytes, self.probe)
        readable = [(m, self.shapes[m.name]) for m in self.config.models if m.name in self.shapes]
        for verdict in admit(readable, self.available_bytes, slot=self.config.slot_id):
            self._set_verdict(verdict)
        self._publish_verdicts()
        self.scheduler.start()
        self._loader.start()

    def start_in_background(self) -> None:
        """`start` on its own thread, for `python -m worker`: the API answers /healthz from the process's first
        seconds while the models are fetched (a download may take hours), read and admitted, so the pod's
        startup probe never depends on the models; each model is `loading` until then. A failure there fails
        liveness, as a loader that died does."""
        def run() -> None:
            try:
                self.start()
            except BaseException as exc:  # a bug while starting: liveness must see it
                log.exception("starting the worker failed")
                self._loader_died = f"{type(exc).__name__}: {exc}"
                self._loaded.set()

        threading.Thread(target=run, name="worker-start", daemon=True).start()

    def wait_loaded(self, timeout_s: float | None = None) -> bool:
        return self._loaded.wait(timeout_s)

    def drain(self, timeout_s: float) -> bool:
        """Graceful stop, first half: admit nothing new and wait up to `timeout_s` for the requests in
        flight to finish. True when they all did."""
        self.scheduler.drain()
        deadline = time.monotonic() + timeout_s
        while not self.scheduler.idle():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def apply(self, new: WorkerConfig, *, drain_timeout_s: float = 600.0) -> ConfigDiff:
        """Apply a changed config in place (worker/reconfigure.py says what changes): unchanged models keep
        serving untouched; retuned ones get their new budget and priority; re-laid-out and removed ones
        drain and free their memory; re-laid-out and added ones are admitted against what the others leave
        and load. A model that no longer fits is refused alone (a re-laid-out one keeps its old layout
        serving). Returns the diff; a slot or device change is not applied (it needs a restart)."""
        with self._apply_lock:
            self._loaded.wait()
            change = diff(self.config, new)
            if change.restart_needed:
                log.error("config change not applied: %s", change.restart_needed)
                return change
            self.scheduler.retune(min_residency_s=new.min_residency_ms / 1000, max_queued=new.max_queued_requests)
            staying = {m.name for m in new.models if m.name in change.unchanged} | {m.name for m in change.retuned}
            serving_verdicts = {name: self.verdicts[name] for name in self.served}
            incoming = self._read_shapes([*change.relaid, *change.added])
            order = [m for m in new.models if m.name in staying] + [m for m in new.models if m.name in incoming]
            verdicts = {v.name: v for v in admit([(m, self.shapes[m.name] if m.name in staying else incoming[m.name])
                                                  for m in order], self.available_bytes, slot=new.slot_id)}
            kept_old: dict[str, ModelConfig] = {}
            to_load: list[ModelConfig] = []
            for model in change.retuned:
                if verdicts[model.name].verdict != "applied":
                    kept_old[model.name] = self.config.model(model.name)
                elif not self._retune(model, verdicts[model.name]):
                    incoming[model.name] = self.shapes[model.name]
                    to_load.append(model)
            for model in change.relaid:
                if model.name in incoming and verdicts[model.name].verdict == "applied":
                    to_load.append(model)
                elif model.name in self.served:
                    kept_old[model.name] = self.config.model(model.name)
            to_load += [m for m in change.added if m.name in incoming and verdicts[m.name].verdict == "applied"]
            stuck = self._retire([*change.removed, *(m.name for m in to_load if m.name in self.served)],
                                 drain_timeout_s)
            to_load = [m for m in to_load if m.name not in stuck]
            effective = tuple(kept_old.get(m.name, m) for m in new.models)
            for name in kept_old.keys() - verdicts.keys():  # its new files are unreadable: the old layout serves on
                refusal = self.verdicts[name]
                self._set_verdict(replace(serving_verdicts[name], message=f"{refusal.reason}: {refusal.message}; it "
                                                                          "keeps serving its previous configuration"))
            for name, verdict in verdicts.items():  # before the new config lists them: /status reads both
                if name in kept_old:
                    self._set_verdict(replace(verdict, message=f"{verdict.message}; it keeps serving its "
                                                               "previous configuration"))
                elif name in incoming:
                    self._set_verdict(verdict)
            for model in effective:
                self.metrics.budget_bytes.labels(model.name).set(model.budget_bytes)
            with self._lock:
                self.config = replace(new, models=effective)
                gone = [self.verdicts.pop(name) for name in change.removed if name in self.verdicts]
            for old in gone:
                self.metrics.verdict.remove(old.name, old.namespace, old.mode, old.verdict, old.reason)
            for model in sorted(to_load, key=lambda m: incoming[m.name].weight_bytes):
                self.shapes[model.name] = incoming[model.name]
                self._load_guarded(model)
            self._publish_verdicts()
            log.info("config applied in place: %s", change.summary())
            return change

    def stop(self, timeout_s: float = 10.0) -> None:
        self.scheduler.stop(timeout_s)
        if self._publish:
            self._publish.stop()

    # serving
    def lookup_config(self, name: str, allows: Callable[[str, str], bool] | None = None) -> ModelConfig:
        """The configured model `name`, or ModelNotFound (also when `allows(namespace, name)` denies it: a model
        the caller may not reach is answered exactly as an unknown one, worker.auth)."""
        model = self.config.model(name)
        if model is None or (allows is not None and not allows(model.namespace, model.name)):
            raise ModelNotFound("ModelNotFound", f"model {name!r} is not served here; GET /v1/models lists "
                                "the served names (the ElasticModel names)", param="model")
        return model

    def lookup(self, name: str, allows: Callable[[str, str], bool] | None = None) -> ServedModel:
        """The model `name` ready to serve, or ModelNotFound / ModelUnavailable (refused or loading)."""
        name = self.lookup_config(name, allows).name  # a spec.servedNames alias serves as the model it names
        verdict = self.verdicts.get(name)
        if verdict is not None and verdict.verdict == "refused":
            raise ModelUnavailable(verdict.reason, f"model {name!r} was refused: {verdict.message}")
        served = self.served.get(name)
        if served is None:
            raise ModelUnavailable("ModelLoading", f"model {name!r} is still loading; retry shortly",
                                   retry_after_s=5)
        return served

    def generation(self, served: ServedModel, prompt_ids: list[int], *, max_tokens: int | None,
                   default_max_tokens: int | None, prompt_param: str, constraint: TokenConstraint | None = None,
                   **sampling) -> Generation:
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
                          eos_ids=served.eos_ids, decode=served.decode, constraint=constraint)

    def submit(self, name: str, generation: Generation, sink: Callable[[Event], None],
               post: Callable[[Callable[[], None]], None] | None = None) -> Job:
        return self.scheduler.submit(name, generation, sink, post)

    # state
    def model_state(self, name: str) -> str:
        """loading, serving or refused (`name` may be a served-name alias)."""
        name = self._canonical(name)
        with self._lock:
            verdict = self.verdicts.get(name)
            if verdict is not None and verdict.verdict == "refused":
                return "refused"
            return "serving" if name in self.served else "loading"

    def readiness(self, model: str | None = None) -> tuple[bool, dict]:
        """Per model: ready while it serves. The worker: ready as soon as one model serves (each model
        serves once loaded, its neighbours still loading get 503 ModelLoading), or once loading ended
        with nothing to serve. Refused models are listed; they never block readiness."""
        with self._lock:
            applied = [n for n, v in self.verdicts.items() if v.verdict == "applied"]
            loading = [n for n in applied if n not in self.served]
            refused_models = {n: v.reason for n, v in self.verdicts.items() if v.verdict == "refused"}
            serving = sorted(self.served)
        if model is not None:
            ready = self._canonical(model) in serving
        else:
            ready = bool(serving) or (self._loaded.is_set() and not loading)
        return ready, {"ready": ready, "loading": loading, "serving": serving, "refused": refused_models}

    def _canonical(self, name: str) -> str:
        """The model's own name for `name` (itself, or the model a served-name alias names)."""
        model = self.config.model(name)
        return model.name if model is not None else name

    def health(self) -> tuple[bool, dict]:
        """Liveness: the executors make progress (worker.scheduler.Scheduler.health) and the loader lives."""
        live, detail = self.scheduler.health()
        if self._loader_died:
            live, detail = False, {**detail, "live": False, "loader": self._loader_died}
        return live, detail

    def status(self) -> dict:
        ready, _ = self.readiness()
        models = []
        for model in self.config.models:
            verdict = self.verdicts.get(model.name)  # None: not admitted yet (its files are being fetched)
            ledger = self.ledgers.get(model.name)
            served = self.served.get(model.name)
            entry = verdict.as_dict() if verdict else {"name": model.name, "namespace": model.namespace,
                                                       "mode": model.mode}
            entry.update(
                state="refused" if verdict and verdict.verdict == "refused" else ("serving" if served else "loading"),
                budgetBytes=model.budget_bytes, contextTokens=model.context_tokens, concurrency=model.concurrency,
                deviceBytes=ledger.total_bytes if ledger else 0,
                peakDeviceBytes=ledger.peak_bytes if ledger else 0,
                onDevice=bool(served and served.residency.on_device),
            )
            shape = self.shapes.get(model.name)
            if shape is not None:  # the precision it loads in (contract.precision): compute dtype, weights
                entry.update(dtype=shape.dtype, weightDtype=shape.stored_dtype)
            if served:
                entry["forward"] = served.engine.path
                if served.engine.fallback:
                    entry["fallback"] = f"runs one sequence at a time (no batched forward): {served.engine.fallback}"
                entry["running"] = len(served.engine.seated)
            if served and model.mode == "elastic":
                entry["deviceResidentLayers"] = len(served.residency.device_resident_layers())
            models.append(entry)
        return {"slot": self.config.slot_id, "product": self.config.product, "device": str(self.device),
                "intraOpThreads": torch.get_num_threads(),
                "capacityBytes": self.config.capacity_bytes, "availableBytes": self.available_bytes,
                "ready": ready, "swap": {"active": self.scheduler.active_swap_model(), "swaps": self.scheduler.swaps,
                                         "minResidencyMs": self.config.min_residency_ms},
                "models": models}

    # internals
    def _load_admitted(self) -> None:
        try:
            self._load_smallest_first()
        except BaseException as exc:  # a bug while loading: liveness must see it
            log.exception("the loader died")
            self._loader_died = f"{type(exc).__name__}: {exc}"
        finally:
            self._loaded.set()

    def _load_smallest_first(self) -> None:
        applied = [m for m in self.config.models if self.verdicts[m.name].verdict == "applied"]
        for model in sorted(applied, key=lambda m: self.shapes[m.name].weight_bytes):
            self._load_guarded(model)

    def _load_guarded(self, model: ModelConfig) -> None:
        """Load one admitted model; a failure refuses it alone."""
        try:
            self._load_one(model)
        except Exception as exc:  # noqa: BLE001 - BudgetExceeded, ModelUnreadable, a CUDA out-of-memory, a bug
            log.exception("loading %s failed", model.ref)
            message = getattr(exc, "message", str(exc))
            self._set_verdict(refused(model.name, model.namespace, model.mode,
                                      getattr(exc, "reason", "LoadFailed"), message))
            self.ledgers.pop(model.name, None)
            self._publish_verdicts()

    def _read_shapes(self, models) -> dict[str, ModelShape]:
        """Shapes of the models to (re)load, read from their files; an unreadable one is refused alone."""
        shapes = {}
        for model in models:
            try:
                self.directories[model.name] = resolve(model)
                shapes[model.name] = read_shape(self.directories[model.name], model.dtype, model.weight_dtype,
                                                device_capability(self.device))
            except ModelLoadError as exc:
                self._set_verdict(refused(model.name, model.namespace, model.mode, exc.reason, exc.message))
            except Exception as exc:  # noqa: BLE001 - whatever one model's files do, it alone is refused
                log.exception("reading %s failed", model.ref)
                self._set_verdict(refused(model.name, model.namespace, model.mode, "ModelUnreadable",
                                          f"reading {model.model} failed: {type(exc).__name__}: {exc}; check the "
                                          "model's files (config.json, safetensors weights)"))
        return shapes

    def _retune(self, model: ModelConfig, verdict: Verdict) -> bool:
        """Budget or SLO change without moving a byte; False when the model must be re-laid-out instead."""
        served = self.served.get(model.name)
        current = self.verdicts.get(model.name)
        if served is None or current is None or verdict.resident_layers != current.resident_layers:
            return False
        self.ledgers[model.name].budget_bytes = model.budget_bytes
        self.scheduler.set_priority(model.name, model.latency_slo)
        served.config = model
        self._set_verdict(verdict)
        return True

    def _retire(self, names: list[str], timeout_s: float) -> set[str]:
        """Drain `names` (their requests finish; new ones get 503), then free their device memory: on the
        model's executor thread, before the scheduler forgets it (a swap-in waits for that)."""
        done = {name: threading.Event() for name in names if name in self.served}
        for name, event in done.items():
            self.scheduler.remove_model(name, on_retired=lambda name=name, event=event: (self._free(name),
                                                                                          event.set()))
        stuck = set()
        for name, event in done.items():
            if not event.wait(timeout_s):
                log.warning("%s still had requests after %.0fs of draining; it is not reloaded", name, timeout_s)
                stuck.add(name)
        if done:
            gc.collect()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()  # a retired model's cached blocks belong to its own stream
        return stuck

    def _free(self, name: str) -> None:
        with self._lock:
            served = self.served.pop(name)
        served.engine.deactivate()
        served.residency.unload()
        self.ledgers.pop(name, None)

    def _load_one(self, model: ModelConfig) -> None:
        verdict = self.verdicts[model.name]
        need = need_for(model, self.shapes[model.name], verdict.resident_layers)
        ledger = DeviceLedger(model.name, model.budget_bytes, self.device)
        self.ledgers[model.name] = ledger
        ledger.reserve("activation", need.activation)
        ledger.reserve("overhead", need.overhead)
        shape = self.shapes[model.name]
        tokenizer, host_model = load(self.directories[model.name], shape.dtype, shape.weights, self.device)
        residency = make_residency(model.mode, host_model, ledger, self.device,
                                   resident_layers=verdict.resident_layers)
        residency.on_streamed_bytes = self.metrics.streamed_bytes.labels(model.name).inc
        residency.load()
        engine = ModelEngine(residency, concurrency=model.concurrency, context_tokens=model.context_tokens,
                             kv_bytes=need.kv_cache, prefill_chunk=need.prefill_chunk_tokens)
        self.metrics.serve(model.name, model.mode, ledger, kv_reserved_bytes=need.kv_cache,
                           kv_bytes_per_token=self.shapes[model.name].kv_bytes_per_token)
        eos = host_model.generation_config.eos_token_id if host_model.generation_config else None
        eos_ids = frozenset([eos] if isinstance(eos, int) else (eos or [])) | (
            {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set())
        served = ServedModel(model, tokenizer, residency, engine, eos_ids,
                             host_model.get_input_embeddings().num_embeddings)
        self.scheduler.add_model(model.name, engine, priority=model.latency_slo)
        with self._lock:
            self.served[model.name] = served
        log.info("%s loaded (%s, %s forward, %d device bytes)", model.ref, model.mode, engine.path,
                 ledger.total_bytes)

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
            self._publish.submit(render_document(self.config.slot_id, ordered, _device_uuid(self.device)))


def _nvml_reader(device: torch.device) -> PynvmlReader | None:
    """NVML for the worker's GPU (its metrics of other processes); None on CPU or without a driver."""
    if device.type != "cuda":
        return None
    uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    return PynvmlReader.open(device.index or 0, f"GPU-{uuid}" if uuid is not None else None)


def _device_uuid(device: torch.device) -> str | None:
    """The UUID of the worker's GPU (published beside its verdicts); None on CPU."""
    if device.type != "cuda":
        return None
    return gpu_uuid(torch.cuda.get_device_properties(device).uuid)


def _pick_device(choice: str) -> torch.device:
    if choice == "cuda" and not torch.cuda.is_available():
        raise ConfigError("NoCudaDevice", "device: cuda is configured but torch sees no CUDA device; "
                          "check the GPU resource request and the NVIDIA runtime, or set device: auto")
    if choice in ("cuda", "auto") and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
