"""The executors: one thread per model (and, on CUDA, one stream per model) that runs the
policy's actions for that model and hands each step's tokens to the model's emitter
(worker/emitter.py), which detokenises them and delivers the events on a thread of its own.

Request handlers `submit` a Job (thread-safe; QueueFull when the model's queue is full)
and receive events through the Job's `sink` (called through its `post`, e.g. an event loop's
call_soon_threadsafe); cancelling a job (setting `job.cancelled`, as a disconnecting client
does) withdraws it from its queue, or frees its KV slot at the model's next step boundary, as
a stop string that ended it (`job.stopped`) does. Each model's thread seats newly admitted
jobs in its ModelEngine, runs one batched step, and retires finished, stopped and cancelled jobs. A swap
model's thread swaps itself in (evicting the drained active model) without holding up
the other models' threads. Models with a latency SLO get high-priority CUDA streams.

Liveness: `health()` reports a dead executor, an action (step or swap) running longer
than `stall_s`, or requests waiting while no model completed a step for `stall_s` plus
the minimum residency. `drain` stops admission for a graceful stop (SIGTERM).
Called by worker.runtime (add_model/start/stop/drain) and the API (submit, health).
"""
from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from engine.batch import Generation, ModelEngine
from .emitter import Emitter, RowOutput, StepOutput, deliver
from .errors import ModelUnavailable, QueueFull, WorkerError
from .events import ErrorEvent, Event, FinishEvent
from .job import Job
from .metrics import WorkerMetrics
from .policy import Idle, QueuePolicy, SwapIn

log = logging.getLogger(__name__)
DEFAULT_STALL_S = 60.0


@dataclass
class _Executor:
    model: str
    engine: ModelEngine
    priority: bool
    thread: threading.Thread | None = None
    seated: set = field(default_factory=set)  # jobs whose generation is seated in the engine
    busy_since: float | None = None  # start of the action in progress
    died: str | None = None
    retiring: Callable[[], None] | None = None  # set by remove_model: called once the model has no work
    emitter: Emitter | None = None  # turns its steps' tokens into events, on its own thread
    streams: dict = field(default_factory=dict)  # priority -> the model's CUDA stream


class Scheduler:
    def __init__(self, *, min_residency_s: float, max_queued: int, metrics: WorkerMetrics,
                 clock: Callable[[], float] = time.monotonic, stall_s: float = DEFAULT_STALL_S):
        self.policy: QueuePolicy[Job] = QueuePolicy(min_residency_s=min_residency_s, max_queued=max_queued)
        self.metrics = metrics
        self.clock = clock
        self.stall_s = stall_s
        self.executors: dict[str, _Executor] = {}
        self.swaps = 0
        self.last_step_at = clock()
        self._service_s: dict[str, float] = {}  # moving average of a request's time, for Retry-After
        self._cond = threading.Condition()
        self._started = False
        self._stopped = False
        self._draining = False

    @property
    def engines(self) -> dict[str, ModelEngine]:
        return {name: e.engine for name, e in self.executors.items()}

    def add_model(self, name: str, engine: ModelEngine, *, priority: bool = False) -> None:
        """Serve `name` with `engine`; its executor starts now if the scheduler runs."""
        executor = _Executor(name, engine, priority)
        with self._cond:
            self.executors[name] = executor
            self.policy.add_model(name, concurrency=engine.concurrency, swap=engine.residency.mode == "swap")
            if self._started:
                self._launch(executor)

    def remove_model(self, name: str, on_retired: Callable[[], None]) -> None:
        """Retire `name`: it admits nothing new; once its queued and running requests finished (and no
        swap-in runs), `on_retired` frees it on the executor's thread, then the policy forgets it, so a
        swap-in that follows finds its memory free."""
        with self._cond:
            self.executors[name].retiring = on_retired
            self._cond.notify_all()

    def retune(self, *, min_residency_s: float, max_queued: int) -> None:
        """New server settings (a changed config), from the next decision on."""
        with self._cond:
            self.policy.min_residency_s, self.policy.max_queued = min_residency_s, max_queued
            self._cond.notify_all()

    def set_priority(self, name: str, priority: bool) -> None:
        """A changed SLO: the model's next action runs on the stream of the new priority."""
        with self._cond:
            self.executors[name].priority = priority

    def submit(self, model: str, generation: Generation, sink: Callable[[Event], None],
               post: Callable[[Callable[[], None]], None] | None = None) -> Job:
        """Queue `generation`; its events go to `sink`, called through `post` (e.g. an event loop's
        call_soon_threadsafe: one call per step for all of that loop's jobs), or on the emitter's thread."""
        with self._cond:
            executor = self.executors.get(model)
            if executor is None or executor.retiring is not None:
                raise ModelUnavailable("ModelReconfiguring", f"model {model} is being reconfigured or removed; "
                                       "retry shortly", retry_after_s=1)
            if self._draining:
                raise ModelUnavailable("ShuttingDown", "the worker is shutting down and admits no new request; "
                                       "retry against another replica", retry_after_s=1)
            if not self.policy.has_room(model):
                queued = len(self.policy.queued[model])
                raise QueueFull(
                    "QueueFull",
                    f"model {model} already has {queued} queued requests (server.maxQueuedRequests); "
                    "retry after the Retry-After seconds or raise maxQueuedRequests",
                    retry_after_s=self._retry_after(model, queued),
                )
            job = Job(model, generation, sink, submitted_at=self.clock(), post=post, _on_cancel=self._cancel)
            self.policy.enqueue(model, job)
            self.metrics.queue_depth.labels(model).set(len(self.policy.queued[model]))
            self._cond.notify_all()
            return job

    def active_swap_model(self) -> str | None:
        with self._cond:
            return self.policy.active

    def start(self) -> None:
        with self._cond:
            self._started = True
            for executor in self.executors.values():
                self._launch(executor)

    def drain(self) -> None:
        """Admit nothing new (submit answers 503 ShuttingDown); running and queued requests go on."""
        with self._cond:
            self._draining = True

    def idle(self) -> bool:
        with self._cond:
            return not any(self.policy.has_work(m) for m in self.executors)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop every executor after its current action. Requests still queued or running get an error at
        once (a token their executor still delivers after it is ignored: the error ended the request)."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
            left = [j for m in self.executors for j in (*self.policy.queued[m], *self.policy.running[m])]
        error = WorkerError("ShuttingDown", "the worker stopped before this request finished; retry it")
        for job in left:
            deliver(job.post, [(job, [ErrorEvent(error)])])
        deadline = time.monotonic() + timeout_s
        for executor in list(self.executors.values()):
            if executor.thread is not None and executor.thread.is_alive():
                executor.thread.join(timeout=max(0.0, deadline - time.monotonic()))

    def health(self) -> tuple[bool, dict]:
        """(live, detail): not live when an executor died, one action runs past stall_s, or requests wait
        while no step completed for stall_s + the minimum residency."""
        now = self.clock()
        with self._cond:
            problems = {}
            for name, executor in self.executors.items():
                if executor.died:
                    problems[name] = f"executor died: {executor.died}"
                elif executor.busy_since is not None and now - executor.busy_since > self.stall_s:
                    problems[name] = f"one step or swap has run for {now - executor.busy_since:.0f}s"
            waiting = [m for m in self.executors if self.policy.has_work(m)]
            quiet = now - self.last_step_at
            if waiting and quiet > self.stall_s + self.policy.min_residency_s:
                for name in waiting:
                    problems.setdefault(name, f"requests wait but no model completed a step for {quiet:.0f}s")
        return not problems, {"live": not problems, "stalled": problems}

    # internals
    def _launch(self, executor: _Executor) -> None:
        executor.emitter = Emitter(executor.model, self.metrics, self._stopped_by_text)
        executor.thread = threading.Thread(target=self._run, args=(executor,), name=f"executor-{executor.model}",
                                           daemon=True)
        executor.thread.start()

    def _stopped_by_text(self, job: Job) -> None:
        """A stop string ended `job` (on the emitter's thread): its executor frees the slot at the next step."""
        with self._cond:
            self._cond.notify_all()

    def _cancel(self, job: Job) -> None:
        with self._cond:
            if self.policy.withdraw(job.model, job):
                self._account(job, "cancelled")
                self.metrics.queue_depth.labels(job.model).set(len(self.policy.queued[job.model]))
            self._cond.notify_all()

    def _retry_after(self, model: str, queued: int) -> int:
        per_request = self._service_s.get(model, 1.0)
        return max(1, math.ceil(per_request * queued / self.policy.concurrency[model]))

    def _run(self, executor: _Executor) -> None:
        try:
            self._loop(executor)
        except BaseException as exc:  # a bug in the executor itself: liveness must see it
            log.exception("executor of %s died", executor.model)
            executor.died = f"{type(exc).__name__}: {exc}"
        finally:
            executor.emitter.close()

    def _loop(self, executor: _Executor) -> None:
        model = executor.model
        while True:
            with self._cond:
                while True:
                    if self._stopped:
                        return
                    if executor.retiring is not None and not self.policy.has_work(model) \
                            and self.policy.swapping is None:
                        if model in self.policy.swap_group:
                            self.policy.swapping = model  # no swap-in until its memory is free
                        action = None
                        break
                    action = self.policy.next_action(model, self.clock())
                    if not isinstance(action, Idle):
                        break
                    self._cond.wait(timeout=action.timeout_s)
                if action is not None:
                    executor.busy_since = self.clock()
                    self.metrics.queue_depth.labels(model).set(len(self.policy.queued[model]))
            if action is None:
                try:
                    executor.retiring()  # outside the lock: freeing memory holds up no other model
                finally:
                    self._retire(executor)
                return
            try:
                with _stream_for(executor):
                    if isinstance(action, SwapIn):
                        self._swap(action)
                    else:
                        self._step(executor, action.jobs)
            finally:
                executor.busy_since = None

    def _retire(self, executor: _Executor) -> None:
        """Forget a drained model whose memory was freed."""
        with self._cond:
            if self.policy.swapping == executor.model:
                self.policy.swapping = None
            if self.executors.get(executor.model) is executor:
                self.policy.remove_model(executor.model)
                del self.executors[executor.model]
            self._cond.notify_all()

    def _swap(self, action: SwapIn) -> None:
        started = time.perf_counter()
        if action.evict is not None:
            evicted = self.executors[action.evict].engine
            evicted.deactivate()
        incoming = self.executors[action.model].engine
        try:
            incoming.activate()
        except Exception as exc:  # e.g. device memory taken by another process: fail the waiting requests
            incoming.deactivate()
            log.exception("swapping in %s failed", action.model)
            error = WorkerError("SwapFailed", f"swapping {action.model} onto the device failed: {exc}; "
                                "check /status and the device's free memory")
            with self._cond:
                failed = self.policy.swap_failed(action.model)
                self._cond.notify_all()
            for job in failed:
                self._account(job, "error")
                deliver(job.post, [(job, [ErrorEvent(error)])])
            return
        seconds = time.perf_counter() - started
        self.metrics.swaps.labels(action.model).inc()
        self.metrics.swap_in_seconds.labels(action.model).observe(seconds)
        log.info("swapped in %s (evicted %s) in %.3fs", action.model, action.evict, seconds)
        with self._cond:
            self.swaps += 1
            self.policy.activated(action.model, self.clock())
            self._cond.notify_all()

    def _step(self, executor: _Executor, jobs: tuple[Job, ...]) -> None:
        """Seat, step and retire; the step's tokens go to the emitter, which turns them into events."""
        engine = executor.engine
        retired: list[Job] = []
        rows: list[RowOutput] = []
        by_generation: dict[Generation, Job] = {}  # read once: other threads cancel or stop jobs meanwhile
        for job in jobs:
            if job.cancelled or job.stopped:
                engine.leave(job.generation)
                retired.append(job)
                continue
            if job not in executor.seated:
                engine.join(job.generation)
                executor.seated.add(job)
                job.started_at = self.clock()
                self.metrics.queue_wait_seconds.labels(job.model).observe(job.started_at - job.submitted_at)
            by_generation[job.generation] = job
        try:
            with self.metrics.busy(executor.model, engine.residency.device.type):
                results = engine.step()
        except Exception as exc:  # a failing forward pass fails the batch it ran
            log.exception("a step of %s failed", executor.model)
            self.metrics.failed_step(executor.model, exc)
            error = ErrorEvent(WorkerError("GenerationFailed", f"generation failed: {exc}"))
            for job in by_generation.values():
                engine.leave(job.generation)
                retired.append(job)
                rows.append(RowOutput(job, (), (), error))
            results = []
        for generation, tokens in results:
            if tokens is None:
                continue  # a prefill chunk that did not finish its prompt
            job = by_generation[generation]
            end = None
            if generation.done:
                end = FinishEvent(generation.finish_reason, len(generation.prompt_ids), len(generation.output_ids))
                retired.append(job)
            rows.append(RowOutput(job, tokens, generation.take_reported(), end))
        now = self.clock()
        with self._cond:
            if results:
                self.last_step_at = now
                self.policy.stepped(executor.model)
            for job in retired:
                executor.seated.discard(job)
                self.policy.finished(executor.model, job)
            if retired:
                self._cond.notify_all()
        if rows:
            executor.emitter.put(StepOutput(now, tuple(rows)))
        self._report_in_flight(executor)
        for job in retired:
            errored = any(r.job is job and isinstance(r.end, ErrorEvent) for r in rows)
            self._account(job, "cancelled" if job.cancelled else ("error" if errored else "ok"))

    def _report_in_flight(self, executor: _Executor) -> None:
        running = list(executor.seated)
        tokens = sum(len(j.generation.prompt_ids) + len(j.generation.output_ids) for j in running)
        self.metrics.in_flight(executor.model, len(running), tokens)

    def _account(self, job: Job, outcome: str) -> None:
        self.metrics.requests.labels(job.model, outcome).inc()
        self.metrics.tokens.labels(job.model, "prompt").inc(len(job.generation.prompt_ids))
        took = self.clock() - job.submitted_at
        previous = self._service_s.get(job.model, took)
        self._service_s[job.model] = 0.8 * previous + 0.2 * took


def _stream_for(executor: _Executor):
    """The model's own CUDA stream (high priority for SLO models) as the thread's current stream. Every
    step ends in a host read of its logits, so moving to the other priority's stream needs no ordering."""
    device = executor.engine.residency.device
    if device.type != "cuda":
        return contextlib.nullcontext()
    stream = executor.streams.get(executor.priority)
    if stream is None:  # lower numbers run first
        stream = executor.streams[executor.priority] = torch.cuda.Stream(device=device,
                                                                          priority=-1 if executor.priority else 0)
    return torch.cuda.stream(stream)
