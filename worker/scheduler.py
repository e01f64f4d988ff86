"""The executor: one thread that owns the device, runs the policy's actions and delivers tokens.

Request handlers `submit` a Job (thread-safe; QueueFull when the model's queue is
full) and receive events through the Job's `sink`. The thread swaps swap-group
models in and out, steps generations one forward pass at a time, and records
metrics. Called by worker.runtime (add_model/start/stop) and the API (submit).
"""
from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Callable

from .engine import Generation
from .errors import QueueFull, WorkerError
from .metrics import WorkerMetrics
from .policy import Idle, QueuePolicy, Step, SwapIn
from .residency import Residency

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TokenEvent:
    text: str


@dataclass(frozen=True)
class FinishEvent:
    reason: str
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class ErrorEvent:
    error: WorkerError


Event = TokenEvent | FinishEvent | ErrorEvent


@dataclass(eq=False)
class Job:
    model: str
    generation: Generation
    sink: Callable[[Event], None]
    submitted_at: float
    cancelled: bool = False
    started_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None


class Scheduler:
    def __init__(self, *, min_residency_s: float, max_queued: int, metrics: WorkerMetrics,
                 clock: Callable[[], float] = time.monotonic):
        self.policy: QueuePolicy[Job] = QueuePolicy(min_residency_s=min_residency_s, max_queued=max_queued)
        self.metrics = metrics
        self.clock = clock
        self.residencies: dict[str, Residency] = {}
        self.swaps = 0
        self._service_s: dict[str, float] = {}  # moving average of a request's time, for Retry-After
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="worker-executor", daemon=True)

    def add_model(self, name: str, residency: Residency, *, concurrency: int) -> None:
        with self._cond:
            self.residencies[name] = residency
            self.policy.add_model(name, concurrency=concurrency, swap=residency.mode == "swap")
            self._cond.notify()

    def submit(self, model: str, generation: Generation, sink: Callable[[Event], None]) -> Job:
        with self._cond:
            if not self.policy.has_room(model):
                queued = len(self.policy.queued[model])
                raise QueueFull(
                    "QueueFull",
                    f"model {model} already has {queued} queued requests (server.maxQueuedRequests); "
                    "retry after the Retry-After seconds or raise maxQueuedRequests",
                    retry_after_s=self._retry_after(model, queued),
                )
            job = Job(model, generation, sink, submitted_at=self.clock())
            self.policy.enqueue(model, job)
            self.metrics.queue_depth.labels(model).set(len(self.policy.queued[model]))
            self._cond.notify()
            return job

    def active_swap_model(self) -> str | None:
        with self._cond:
            return self.policy.active

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _retry_after(self, model: str, queued: int) -> int:
        per_request = self._service_s.get(model, 1.0)
        return max(1, math.ceil(per_request * queued / self.policy.concurrency[model]))

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._stopped:
                    return
                action = self.policy.next_action(self.clock())
                if isinstance(action, Idle):
                    self._cond.wait(timeout=action.timeout_s)
                    continue
                for name, queue in self.policy.queued.items():
                    self.metrics.queue_depth.labels(name).set(len(queue))
            if isinstance(action, SwapIn):
                self._swap(action)
            else:
                self._step(action)

    def _swap(self, action: SwapIn) -> None:
        started = time.perf_counter()
        if action.evict is not None:
            evicted = self.residencies[action.evict]
            evicted.deactivate()
        incoming = self.residencies[action.model]
        try:
            incoming.activate()
        except Exception as exc:  # e.g. device memory taken by another process: fail the waiting requests
            incoming.deactivate()
            log.exception("swapping in %s failed", action.model)
            error = WorkerError("SwapFailed", f"swapping {action.model} onto the device failed: {exc}; "
                                "check /status and the device's free memory")
            with self._cond:
                failed = self.policy.swap_failed(action.model)
            for job in failed:
                _deliver(job, ErrorEvent(error))
            return
        seconds = time.perf_counter() - started
        self.metrics.swaps.labels(action.model).inc()
        self.metrics.swap_in_seconds.labels(action.model).observe(seconds)
        log.info("swapped in %s (evicted %s) in %.3fs", action.model, action.evict, seconds)
        with self._cond:
            self.swaps += 1
            self.policy.activated(action.model, self.clock())

    def _step(self, action: Step[Job]) -> None:
        job = action.job
        residency = self.residencies[action.model]
        events: list[Event] = []
        if not job.cancelled:
            if job.started_at is None:
                job.started_at = self.clock()
                self.metrics.queue_wait_seconds.labels(job.model).observe(job.started_at - job.submitted_at)
            try:
                with self.metrics.busy(action.model, residency.device.type):
                    delta = job.generation.step(residency.model, residency.device)
            except Exception as exc:  # a failing forward pass fails this request only
                log.exception("generation failed for %s", action.model)
                self.metrics.failed_step(action.model, exc)
                events.append(ErrorEvent(WorkerError("GenerationFailed", f"generation failed: {exc}")))
            else:
                if delta is not None:
                    self._observe_token(job)
                    if delta:
                        events.append(TokenEvent(delta))
                if job.generation.done:
                    events.append(FinishEvent(job.generation.finish_reason, len(job.generation.prompt_ids),
                                              len(job.generation.output_ids)))
        ended = job.cancelled or any(not isinstance(e, TokenEvent) for e in events)
        if ended:
            job.generation.release()
            self._account_finished(job, events)
            with self._cond:
                self.policy.finished(action.model, job)
        self._report_in_flight(action.model)
        for event in events:
            _deliver(job, event)

    def _report_in_flight(self, model: str) -> None:
        with self._cond:
            running = [j for j in self.policy.running[model] if j.started_at is not None]
        tokens = sum(len(j.generation.prompt_ids) + len(j.generation.output_ids) for j in running)
        self.metrics.in_flight(model, len(running), tokens)

    def _observe_token(self, job: Job) -> None:
        now = self.clock()
        if job.first_token_at is None:
            job.first_token_at = now
            self.metrics.ttft_seconds.labels(job.model).observe(now - job.submitted_at)
        else:
            self.metrics.tpot_seconds.labels(job.model).observe(now - job.last_token_at)
        job.last_token_at = now
        self.metrics.tokens.labels(job.model, "completion").inc()

    def _account_finished(self, job: Job, events: list[Event]) -> None:
        outcome = "cancelled" if job.cancelled else ("error" if any(isinstance(e, ErrorEvent) for e in events)
                                                     else "ok")
        self.metrics.requests.labels(job.model, outcome).inc()
        self.metrics.tokens.labels(job.model, "prompt").inc(len(job.generation.prompt_ids))
        took = self.clock() - job.submitted_at
        previous = self._service_s.get(job.model, took)
        self._service_s[job.model] = 0.8 * previous + 0.2 * took


def _deliver(job: Job, event: Event) -> None:
    """Hand `event` to the request; a sink that fails (its event loop closed) cancels the job."""
    try:
        job.sink(event)
    except RuntimeError:
        job.cancelled = True
