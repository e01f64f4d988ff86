"""Prometheus metrics of one worker, on its own registry (served at /metrics).

Owns every metric name and label of the worker, and keeps labels bounded: a
`model` label only ever carries a name from the worker's config (`known`);
requests naming anything else are counted in one unlabelled series. Names follow
Prometheus conventions (base units in the name, `_total` on counters, histograms
with explicit buckets); docs/worker.md lists each one.

Updated by the scheduler (requests, tokens, queue wait, TTFT, TPOT, swaps, GPU
busy time, sequences in flight, out-of-memory steps), residency (streamed bytes), the API (rejected
requests) and the runtime (`serve` registers a loaded model's ledger, verdicts).
Device bytes are read from each model's ledger when Prometheus scrapes, and
memory of other processes on the GPU from NVML (absent when NVML is).
"""
from __future__ import annotations

import os
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
PREFIX = "gpushare_worker_"


class Ledger(Protocol):
    """What the metrics read of a model's device ledger (engine.memory.DeviceLedger)."""

    placed_bytes: int
    total_bytes: int
    peak_bytes: int

    def reserved(self, label: str) -> int: ...


@dataclass
class _Served:
    mode: str
    ledger: Ledger
    kv_bytes_per_token: int
    kv_reserved_bytes: int  # the admitted KV cache (contextTokens x concurrency), whichever forward holds it
    busy: "BusyClock"
    tokens_in_flight: int = 0


class BusyClock:
    """Seconds a model kept the device busy: CUDA events around its steps, or wall time on CPU.

    On CUDA the start and end events are recorded on the current stream (the executor enters
    the model's own stream before `step`, so the events bracket that model's kernels) and read once
    the end event has completed (`drain`, never blocking), so the executor never waits
    for the device to measure it.
    """

    def __init__(self, add: Callable[[float], None]):
        self._add = add
        self._pending: deque = deque()
        self._lock = threading.Lock()

    @contextmanager
    def step(self, device_type: str) -> Iterator[None]:
        if device_type != "cuda":
            started = time.perf_counter()
            try:
                yield
            finally:
                self._add(time.perf_counter() - started)
            return
        import torch

        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        try:
            yield
        finally:
            end.record()
            with self._lock:
                self._pending.append((start, end))
            self.drain()

    def drain(self) -> None:
        """Add the time of every finished step recorded so far."""
        with self._lock:
            while self._pending and self._pending[0][1].query():
                start, end = self._pending.popleft()
                self._add(start.elapsed_time(end) / 1000.0)


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None, *, known: Iterable[str] = (),
                 nvml: "NvmlReader | None" = None):
        self.registry = registry or CollectorRegistry()
        self.known = frozenset(known)
        self._served: dict[str, _Served] = {}
        self._lock = threading.Lock()
        r = self.registry
        r.register(_ScrapeTime(self))
        self.requests = Counter(PREFIX + "requests", "Finished requests by outcome (ok, error, cancelled).",
                                ["model", "outcome"], registry=r)
        self.rejected = Counter(PREFIX + "rejected_requests",
                                "Requests to a configured model answered with an error before queueing, by HTTP "
                                "status and reason.", ["model", "status", "reason"], registry=r)
        self.unknown_model = Counter(PREFIX + "unknown_model_requests",
                                     "Requests naming a model this worker is not configured with (one series, "
                                     "whatever the name).", registry=r)
        self.tokens = Counter(PREFIX + "tokens", "Tokens processed, by kind (prompt, completion).",
                              ["model", "kind"], registry=r)
        self.ttft_seconds = Histogram(PREFIX + "ttft_seconds", "Time from request to its first token.",
                                      ["model"], buckets=_LATENCY_BUCKETS, registry=r)
        self.tpot_seconds = Histogram(PREFIX + "tpot_seconds", "Time between consecutive output tokens.",
                                      ["model"], buckets=_LATENCY_BUCKETS, registry=r)
        self.queue_wait_seconds = Histogram(PREFIX + "queue_wait_seconds",
                                            "Time a request waited in its model's queue before its first step.",
                                            ["model"], buckets=_QUEUE_BUCKETS, registry=r)
        self.gpu_busy_seconds = Counter(PREFIX + "gpu_busy_seconds",
                                        "Device time of the model's steps (CUDA events; wall time on CPU); "
                                        "rate() of it is the model's share of the GPU.", ["model"], registry=r)
        self.swaps = Counter(PREFIX + "swaps", "Swap-ins of a swap-group model.", ["model"], registry=r)
        self.swap_in_seconds = Histogram(PREFIX + "swap_in_seconds",
                                         "Time to bring a swap model onto the device.", ["model"],
                                         buckets=_LATENCY_BUCKETS, registry=r)
        self.streamed_bytes = Counter(PREFIX + "streamed_bytes", "Elastic layer bytes copied host to device.",
                                      ["model"], registry=r)
        self.queue_depth = Gauge(PREFIX + "queue_depth", "Requests queued for a model, not yet running.",
                                 ["model"], registry=r)
        self.sequences_in_flight = Gauge(PREFIX + "sequences_in_flight",
                                         "Sequences of the model being generated now (holding KV cache).",
                                         ["model"], registry=r)
        self.verdict = Gauge(PREFIX + "verdict", "1 for the model's current verdict (applied or refused).",
                             ["model", "namespace", "mode", "verdict", "reason"], registry=r)
        self.out_of_memory = Counter(PREFIX + "out_of_memory", "Steps that ran out of device memory (the "
                                     "request failed; the right-sizing loop upsizes on it).", ["model"], registry=r)
        self.budget_bytes = Gauge(PREFIX + "budget_bytes", "The model's budget in the worker's config (what the "
                                  "right-sizing loop compares its last change with).", ["model"], registry=r)
        self.missing_bytes = Gauge(PREFIX + "missing_bytes", "Bytes a refused model lacked at admission (0 when "
                                   "applied).", ["model"], registry=r)
        self.slo_seconds = Gauge(PREFIX + "slo_seconds", "The model's latency SLO from its ElasticModel (kind: ttft, "
                                 "tpot), beside the measured ttft_seconds and tpot_seconds.", ["model", "kind"],
                                 registry=r)
        self.grammar_refusals = Counter(PREFIX + "grammar_refusals", "response_format and tools schemas refused "
                                        "(400 UnsupportedSchema), by the bound they passed: depth, expanded, width, "
                                        "ref, tools, library, deadline (docs/limits.md).", ["model", "limit"],
                                        registry=r)
        self.grammar_compile_seconds = Histogram(PREFIX + "grammar_compile_seconds", "Time to check and compile "
                                                 "one grammar on its model's compile lane.", ["model"],
                                                 buckets=_LATENCY_BUCKETS, registry=r)
        self.grammar_lookups = Counter(PREFIX + "grammar_lookups", "Structured-output requests by whether their "
                                       "grammar was kept from an earlier request (kept) or had to be compiled "
                                       "(compiled).", ["model", "result"], registry=r)
        if nvml is not None:
            r.register(_NvmlCollector(nvml))

    # registration of served models
    def serve(self, name: str, mode: str, ledger: Ledger, *, kv_bytes_per_token: int, kv_reserved_bytes: int) -> None:
        """A loaded model: its device bytes are read from `ledger` at every scrape."""
        busy = BusyClock(self.gpu_busy_seconds.labels(name).inc)
        with self._lock:
            self._served[name] = _Served(mode, ledger, kv_bytes_per_token, kv_reserved_bytes, busy)
        self.gpu_busy_seconds.labels(name)
        self.sequences_in_flight.labels(name).set(0)

    # updates from the API
    def reject(self, model: str, status: int, reason: str) -> None:
        """A request answered with an error. Configured models (and "" when the request named none) are
        labelled; any other name counts in one unlabelled series, so clients cannot grow /metrics."""
        if model in self.known or not model:
            self.rejected.labels(model, str(status), reason).inc()
        else:
            self.unknown_model.inc()

    def grammar_refused(self, model: str, limit: str) -> None:
        """A schema refused with 400 UnsupportedSchema (worker.errors.SchemaRefused), labelled as `reject`."""
        if model in self.known or not model:
            self.grammar_refusals.labels(model, limit).inc()

    # updates from the grammars (worker.grammar.GrammarMetrics)
    def grammar_lookup(self, model: str, kept: bool) -> None:
        self.grammar_lookups.labels(model, "kept" if kept else "compiled").inc()

    def grammar_compiled(self, model: str, seconds: float) -> None:
        self.grammar_compile_seconds.labels(model).observe(seconds)

    # updates from the executor
    def busy(self, model: str, device_type: str):
        """Context manager around one step of `model` on the device: adds its device time."""
        served = self._served.get(model)
        if served is None:
            return _nothing()
        return served.busy.step(device_type)

    def failed_step(self, model: str, error: BaseException) -> None:
        """A step raised: counted as out of memory when it was one (torch.OutOfMemoryError or the allocator's
        "out of memory" message)."""
        if type(error).__name__ == "OutOfMemoryError" or "out of memory" in str(error).lower():
            self.out_of_memory.labels(model).inc()

    def in_flight(self, model: str, sequences: int, tokens: int) -> None:
        """The model's running sequences and the tokens their KV caches hold now."""
        self.sequences_in_flight.labels(model).set(sequences)
        served = self._served.get(model)
        if served is not None:
            served.tokens_in_flight = tokens

    # read at scrape time
    def device_families(self) -> list[GaugeMetricFamily]:
        with self._lock:
            served = dict(self._served)
        total = GaugeMetricFamily(PREFIX + "device_bytes", "Device bytes a model holds now (placed tensors plus "
                                  "KV-cache and activation reservations).", labels=["model", "mode"])
        weights = GaugeMetricFamily(PREFIX + "weight_device_bytes", "Device bytes of the model's placed tensors "
                                    "(weights, and elastic streaming buffers).", labels=["model"])
        kv_reserved = GaugeMetricFamily(PREFIX + "kv_reserved_bytes", "Device bytes reserved for the model's KV "
                                        "cache (contextTokens x concurrency).", labels=["model"])
        kv_used = GaugeMetricFamily(PREFIX + "kv_used_bytes", "KV-cache bytes the model's running sequences hold "
                                    "now (their tokens x KV bytes per token).", labels=["model"])
        peak = GaugeMetricFamily(PREFIX + "peak_device_bytes", "Most device bytes the model has held since it "
                                 "loaded.", labels=["model"])
        for name, s in sorted(served.items()):
            s.busy.drain()
            total.add_metric([name, s.mode], s.ledger.total_bytes)
            weights.add_metric([name], s.ledger.placed_bytes)
            kv_reserved.add_metric([name], s.kv_reserved_bytes)
            kv_used.add_metric([name], min(s.tokens_in_flight * s.kv_bytes_per_token, s.kv_reserved_bytes))
            peak.add_metric([name], s.ledger.peak_bytes)
        return [total, weights, kv_reserved, kv_used, peak]


@contextmanager
def _nothing() -> Iterator[None]:
    yield


class _ScrapeTime(Collector):
    """Device bytes per served model, read from the ledgers when Prometheus scrapes."""

    def __init__(self, metrics: WorkerMetrics):
        self._metrics = metrics

    def collect(self):
        return self._metrics.device_families()

    def describe(self):
        return []


# NVML: memory on this GPU held by processes other than this worker.

@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_bytes: int


class NvmlReader(Protocol):
    def processes(self) -> list[GpuProcess]: ...

    def memory(self) -> tuple[int, int]: ...  # (used, total) bytes of the device


class PynvmlReader:
    """The worker's GPU through pynvml (nvidia-ml-py), found by UUID (else by index)."""

    def __init__(self, pynvml, handle):
        self._nvml, self._handle = pynvml, handle

    @classmethod
    def open(cls, device_index: int, uuid: str | None = None) -> "PynvmlReader | None":
        """A reader, or None when NVML or its driver is absent (the NVML metrics are then absent too)."""
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = (pynvml.nvmlDeviceGetHandleByUUID(uuid) if uuid
                      else pynvml.nvmlDeviceGetHandleByIndex(device_index))
        except Exception:  # ImportError, NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded, ...
            return None
        return cls(pynvml, handle)

    def processes(self) -> list[GpuProcess]:
        found = (self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle)
                 + self._nvml.nvmlDeviceGetGraphicsRunningProcesses(self._handle))
        return [GpuProcess(p.pid, int(p.usedGpuMemory or 0)) for p in found]

    def memory(self) -> tuple[int, int]:
        info = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
        return int(info.used), int(info.total)


class _NvmlCollector(Collector):
    def __init__(self, reader: NvmlReader, pid: int | None = None):
        self._reader = reader
        self._pid = os.getpid() if pid is None else pid

    def collect(self):
        try:
            processes = self._reader.processes()
            used, total = self._reader.memory()
        except Exception:  # a transient NVML error: skip these series for this scrape
            return []
        own = sum(p.used_bytes for p in processes if p.pid == self._pid)
        others = [p for p in processes if p.pid != self._pid]
        families = [
            GaugeMetricFamily(PREFIX + "nvml_process_device_bytes", "Device bytes NVML reports for this worker "
                              "process.", value=own),
            GaugeMetricFamily(PREFIX + "nvml_other_processes_device_bytes", "Device bytes NVML reports for other "
                              "processes on this GPU (outside gpushare's accounting).",
                              value=sum(p.used_bytes for p in others)),
            GaugeMetricFamily(PREFIX + "nvml_other_processes", "Other processes holding memory on this GPU.",
                              value=len(others)),
            GaugeMetricFamily(PREFIX + "nvml_device_used_bytes", "Device bytes in use on this GPU (all "
                              "processes and the driver).", value=used),
            GaugeMetricFamily(PREFIX + "nvml_device_total_bytes", "Total device bytes of this GPU.", value=total),
        ]
        return families

    def describe(self):
        return []
