"""The scheduling policy, pure: per-model queues, the swap group's LRU with minimum residency,
drain before swap, round-robin steps. Time is passed in; nothing here touches a model.

Rules:
- Every model has its own FIFO queue (bounded by maxQueuedRequests) and at most
  `concurrency` running requests (its KV cache was admitted for that many).
- Models outside the swap group always run. In the swap group one model is active.
- When other group members wait, the active model keeps admitting new requests only
  until it has been active for minResidency; then it drains (its running requests
  finish, no new ones start) and the least recently active waiting model swaps in.
  A model is never evicted before minResidency, so swaps <= 1 + elapsed / minResidency.
- Running requests take one step each in turn, across all runnable models.
Called by worker.scheduler's executor thread, under its lock.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Generic, TypeVar

Job = TypeVar("Job")


@dataclass(frozen=True)
class Step(Generic[Job]):
    model: str
    job: Job


@dataclass(frozen=True)
class SwapIn:
    model: str
    evict: str | None


@dataclass(frozen=True)
class Idle:
    timeout_s: float | None  # None: until something is submitted


class QueuePolicy(Generic[Job]):
    def __init__(self, *, min_residency_s: float, max_queued: int):
        self.min_residency_s = min_residency_s
        self.max_queued = max_queued
        self.queued: dict[str, deque[Job]] = {}
        self.running: dict[str, list[Job]] = {}
        self.concurrency: dict[str, int] = {}
        self.swap_group: list[str] = []
        self.active: str | None = None
        self.active_since = -math.inf
        self.last_active: dict[str, float] = {}
        self._turn = 0

    def add_model(self, model: str, *, concurrency: int, swap: bool) -> None:
        self.queued[model] = deque()
        self.running[model] = []
        self.concurrency[model] = concurrency
        if swap:
            self.swap_group.append(model)
            self.last_active[model] = -math.inf

    def has_room(self, model: str) -> bool:
        return len(self.queued[model]) < self.max_queued

    def enqueue(self, model: str, job: Job) -> None:
        """Queue `job`; the caller checked `has_room` under the same lock."""
        self.queued[model].append(job)

    def finished(self, model: str, job: Job) -> None:
        self.running[model].remove(job)

    def activated(self, model: str, now: float) -> None:
        if self.active is not None:
            self.last_active[self.active] = now
        self.active, self.active_since = model, now

    def swap_failed(self, model: str) -> list[Job]:
        """`model` could not be brought onto the device: nothing is active; its queued jobs are returned to fail."""
        self.active, self.active_since = None, -math.inf
        failed = list(self.queued[model])
        self.queued[model].clear()
        return failed

    def draining(self, now: float) -> bool:
        """The active swap model stops admitting: it served its minimum residency and others wait."""
        return (self.active is not None and now - self.active_since >= self.min_residency_s
                and bool(self._waiting()))

    def next_action(self, now: float) -> Step[Job] | SwapIn | Idle:
        draining = self.draining(now)
        for model, queue in self.queued.items():
            if model in self.swap_group and (model != self.active or draining):
                continue
            while queue and len(self.running[model]) < self.concurrency[model]:
                self.running[model].append(queue.popleft())
        waiting = self._waiting()
        if waiting and (self.active is None or (draining and not self.running[self.active])):
            choice = min(waiting, key=lambda m: self.last_active[m])
            return SwapIn(choice, evict=self.active)
        runnable = [(m, job) for m, jobs in self.running.items() for job in jobs]
        if runnable:
            self._turn += 1
            return Step(*runnable[self._turn % len(runnable)])
        if waiting:
            return Idle(max(0.0, self.active_since + self.min_residency_s - now))
        return Idle(None)

    def _waiting(self) -> list[str]:
        return [m for m in self.swap_group if m != self.active and self.queued[m]]
