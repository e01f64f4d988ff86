"""The scheduling policy, pure: per-model queues and batches, and the swap group's LRU with
minimum residency, drain before swap, and a progress guarantee. Time is passed in; nothing
here touches a model.

Rules:
- Every model has its own FIFO queue (bounded by maxQueuedRequests) and a running batch of at
  most `concurrency` requests (its KV slots). Queued requests join the batch at step boundaries.
- Each model is asked for its own next action by its own executor thread: models outside the
  swap group always run; in the swap group one model is active and one swap-in at a time runs.
- When other group members wait, the active model keeps admitting new requests until it has
  been active for minResidency AND has completed at least one step since its swap-in (or had
  nothing to run); then it drains (its running requests finish, no new ones join) and the least
  recently active waiting model swaps in. So every swap-in serves at least one step, whatever
  minResidency (0 included), swaps <= 1 + elapsed / minResidency, and a swap is followed by at
  least one finished batch before the next.
Called by worker.scheduler's executor threads, under the scheduler's lock.
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
    jobs: tuple  # the running batch after admission


@dataclass(frozen=True)
class SwapIn:
    model: str
    evict: str | None


@dataclass(frozen=True)
class Idle:
    timeout_s: float | None  # None: until something changes


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
        self.served_since_active = False
        self.swapping: str | None = None
        self.last_active: dict[str, float] = {}

    def add_model(self, model: str, *, concurrency: int, swap: bool) -> None:
        self.queued[model] = deque()
        self.running[model] = []
        self.concurrency[model] = concurrency
        if swap:
            self.swap_group.append(model)
            self.last_active[model] = -math.inf

    def remove_model(self, model: str) -> None:
        """Forget `model` (its executor retired with nothing queued or running); an active swap model
        leaves the device free for the next."""
        del self.queued[model], self.running[model], self.concurrency[model]
        if model in self.swap_group:
            self.swap_group.remove(model)
            del self.last_active[model]
            if self.active == model:
                self.active, self.active_since = None, -math.inf

    def has_room(self, model: str) -> bool:
        return len(self.queued[model]) < self.max_queued

    def enqueue(self, model: str, job: Job) -> None:
        """Queue `job`; the caller checked `has_room` under the same lock."""
        self.queued[model].append(job)

    def withdraw(self, model: str, job: Job) -> bool:
        """Remove a job that is still queued (cancelled before it ran); False when it is not queued."""
        try:
            self.queued[model].remove(job)
        except ValueError:
            return False
        return True

    def finished(self, model: str, job: Job) -> None:
        self.running[model].remove(job)

    def stepped(self, model: str) -> None:
        """`model` completed a step."""
        if model == self.active:
            self.served_since_active = True

    def activated(self, model: str, now: float) -> None:
        if self.active is not None:
            self.last_active[self.active] = now
        self.active, self.active_since = model, now
        self.swapping, self.served_since_active = None, False

    def swap_failed(self, model: str) -> list[Job]:
        """`model` could not be brought onto the device: nothing is active; its queued jobs are returned to fail."""
        self.active, self.active_since, self.swapping = None, -math.inf, None
        failed = list(self.queued[model])
        self.queued[model].clear()
        return failed

    def draining(self, now: float) -> bool:
        """The active swap model stops admitting: others wait, it served its minimum residency and at
        least one step since its swap-in (or has nothing to run)."""
        if self.active is None or not self._waiting() or now - self.active_since < self.min_residency_s:
            return False
        idle = not self.running[self.active] and not self.queued[self.active]
        return self.served_since_active or idle

    def next_action(self, model: str, now: float) -> Step[Job] | SwapIn | Idle:
        """What `model`'s executor does next; admits queued jobs into its batch when it may."""
        swap = model in self.swap_group
        if swap and model != self.active:
            if self.swapping is None and self._swap_choice(now) == model:
                self.swapping = model
                return SwapIn(model, evict=self.active)
            return Idle(self._residency_left(now))
        if not (swap and self.draining(now)):
            queue, running = self.queued[model], self.running[model]
            while queue and len(running) < self.concurrency[model]:
                running.append(queue.popleft())
        if self.running[model]:
            return Step(model, tuple(self.running[model]))
        return Idle(self._residency_left(now) if swap else None)

    def has_work(self, model: str) -> bool:
        return bool(self.queued[model] or self.running[model])

    def _swap_choice(self, now: float) -> str | None:
        waiting = self._waiting()
        if not waiting or self.swapping is not None:
            return None
        if self.active is None or (self.draining(now) and not self.running[self.active]):
            return min(waiting, key=lambda m: self.last_active[m])
        return None

    def _residency_left(self, now: float) -> float | None:
        """Seconds until the active model's minimum residency ends, when others wait for it (else None)."""
        if self.active is None or not self._waiting():
            return None
        left = self.active_since + self.min_residency_s - now
        return left if left > 0 else None

    def _waiting(self) -> list[str]:
        return [m for m in self.swap_group if m != self.active and self.queued[m]]
