"""The consumer side of one model's steps: turns each step's tokens into request events on a thread
of its own, so that detokenising, stop strings and the hand-off to the HTTP event loop never hold up
the next step.

worker/scheduler.py's executor puts one `StepOutput` per step (every row's new tokens, reported
log-probabilities and finish) and goes on stepping. The Emitter detokenises each request's tokens
(engine/text.py), ends a request whose stop string matched (its FinishEvent counts the tokens up to
that string; its later tokens are dropped, and `on_stopped` frees its slot at the next step), records
time-to-first-token and time-per-token, and hands every event of the step to its consumers with one
`post` per consumer (for the API: one `call_soon_threadsafe` on its event loop per step, not per
token). Called by worker/scheduler.py only.
"""
from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

from engine.text import TextStream

from .errors import WorkerError
from .events import ErrorEvent, Event, FinishEvent, TokenEvent
from .job import Job
from .metrics import WorkerMetrics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RowOutput:
    job: Job
    tokens: tuple[int, ...]  # the tokens this step added to the answer
    reported: tuple  # the sampler's Choices for them, when the request asked for logprobs
    end: Event | None = None  # the engine's FinishEvent, or an ErrorEvent


@dataclass(frozen=True)
class StepOutput:
    at: float  # the clock when the step ended
    rows: tuple[RowOutput, ...]


class Emitter:
    def __init__(self, model: str, metrics: WorkerMetrics, on_stopped: Callable[[Job], None]):
        self.model, self.on_stopped = model, on_stopped
        self._ttft, self._tpot = metrics.ttft_seconds.labels(model), metrics.tpot_seconds.labels(model)
        self._completion_tokens = metrics.tokens.labels(model, "completion")
        self._queue: queue.SimpleQueue[StepOutput | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"emitter-{model}", daemon=True)
        self._thread.start()

    def put(self, output: StepOutput) -> None:
        self._queue.put(output)

    def close(self) -> None:
        """Finish what was put, then end the thread."""
        self._queue.put(None)

    def _run(self) -> None:
        while (output := self._queue.get()) is not None:
            deliveries: dict = {}  # post -> [(job, events)]
            for row in output.rows:
                try:
                    events = self._events(row, output.at)
                except Exception as exc:  # a bug turning tokens into text: fail that request, not the model
                    log.exception("emitting the tokens of a %s request failed", self.model)
                    row.job.stopped = True
                    self.on_stopped(row.job)
                    events = [ErrorEvent(WorkerError("GenerationFailed", f"detokenising failed: {exc}"))]
                if events:
                    deliveries.setdefault(row.job.post, []).append((row.job, events))
            for post, items in deliveries.items():
                deliver(post, items)

    def _events(self, row: RowOutput, at: float) -> list[Event]:
        job = row.job
        if job.stopped:
            return []  # its stop string matched in an earlier step: what came after is not part of it
        if isinstance(row.end, ErrorEvent):
            return [row.end]
        generation = job.generation
        if job.text is None:
            job.text = TextStream(generation.decode, generation.params.stop)
        self._observe(job, at)
        stream = job.text
        text = stream.feed(row.tokens, done=row.end is not None)
        events: list[Event] = [TokenEvent(text, row.reported)] if text or row.reported else []
        if stream.stopped:
            job.stopped = True
            self.on_stopped(job)
            events.append(FinishEvent("stop", len(generation.prompt_ids), stream.tokens))
        elif row.end is not None:
            events.append(row.end)
        return events

    def _observe(self, job: Job, at: float) -> None:
        if job.first_token_at is None:
            job.first_token_at = at
            self._ttft.observe(at - job.submitted_at)
        else:
            self._tpot.observe(at - job.last_token_at)
        job.last_token_at = at
        self._completion_tokens.inc()


def deliver(post: Callable[[Callable[[], None]], None] | None, items: list[tuple[Job, list[Event]]]) -> None:
    """Hand each job its events, on its consumer's thread through `post` (None: here); a consumer that is
    gone (its event loop closed) cancels its jobs."""
    def run() -> None:
        for job, events in items:
            for event in events:
                job.sink(event)

    try:
        if post is None:
            run()
        else:
            post(run)
    except RuntimeError:
        for job, _ in items:
            job.cancelled = True
