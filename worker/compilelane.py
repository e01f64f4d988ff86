"""Where a served model's grammars are compiled: threads with a known stack, a bounded queue, a deadline.

Owns the threads native grammar compilation runs on. The grammar library (llguidance) builds a grammar by
recursion on the native stack, so a thread's stack is what a schema's depth is measured against
(worker/schemabound.py bounds the depth; bench/grammar_stack.py measures the stack it needs): each lane
thread is started with STACK_BYTES of stack, whatever the process's default (8 MiB from glibc's ulimit,
128 KiB under musl; it is address space, only the pages used are memory). Each served model has its own
lane (worker/grammar.py), so a schema that compiles slowly holds up no other model's requests, and one
model's compiles wait in a queue of at most `queued` (beyond: 429 `GrammarQueueFull`).

A request waits for its compile at most `deadline_s` of compiling (`wait`): one still queued then is taken
out of the queue and answered 503 `GrammarCompilerBusy` (the lane was busy with other schemas: retry);
one that compiled longer is answered 400 `UnsupportedSchema` (limit "deadline"), and its compile runs to
its end on the lane (a native compile cannot be stopped), which keeps its result for the next request.
Called by worker/grammar.py.
"""
from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

from .errors import ModelUnavailable, QueueFull, SchemaRefused

T = TypeVar("T")
STACK_BYTES = 64 << 20
IDLE_S = 60.0  # a lane thread with nothing to compile for this long ends
_STACK_LOCK = threading.Lock()  # threading.stack_size is process-wide: set, start, restore under one lock


class CompileLane:
    """`threads` compile threads of STACK_BYTES of stack, started when there is work (each ends after IDLE_S
    without any), fed from one queue of at most `queued` jobs."""

    def __init__(self, name: str, *, threads: int = 2, queued: int = 8, stack_bytes: int = STACK_BYTES):
        self.name, self._threads, self._queued, self._stack_bytes = name, threads, queued, stack_bytes
        self._jobs: collections.deque[tuple[Future, Callable[[], object]]] = collections.deque()
        self._ready = threading.Condition()
        self._started = 0

    def submit(self, job: Callable[[], T]) -> Future:
        """Queue `job`; its Future carries `started_at` (time.monotonic()) once a thread runs it. QueueFull
        when `queued` jobs are waiting already."""
        future: Future = Future()
        future.started_at = None  # type: ignore[attr-defined]
        with self._ready:
            waiting = sum(1 for queued, _ in self._jobs if not queued.cancelled())
            if waiting >= self._queued:
                raise QueueFull("GrammarQueueFull", f"{waiting} grammars are waiting to compile for this model "
                                f"already ({self.name}); retry in a moment, or send a schema the worker has "
                                "compiled before (compiled grammars are kept)", retry_after_s=1)
            self._jobs.append((future, job))
            if self._started < self._threads:
                self._start_thread()
            self._ready.notify()
        return future

    def _start_thread(self) -> None:
        with _STACK_LOCK:
            previous = threading.stack_size(self._stack_bytes)
            try:
                threading.Thread(target=self._run, name=f"{self.name}-{self._started}", daemon=True).start()
            finally:
                threading.stack_size(previous)
        self._started += 1

    def _run(self) -> None:
        while True:
            with self._ready:
                idle_until = time.monotonic() + IDLE_S
                while not self._jobs:
                    left = idle_until - time.monotonic()
                    if left <= 0:  # idle: the thread ends (a removed model's lane goes with it); the next
                        self._started -= 1  # submit starts one again
                        return
                    self._ready.wait(left)
                future, job = self._jobs.popleft()
            if not future.set_running_or_notify_cancel():
                continue  # its request gave up while it waited
            future.started_at = time.monotonic()  # type: ignore[attr-defined]
            try:
                future.set_result(job())
            except BaseException as exc:  # noqa: BLE001 - the request's error, raised where it waits
                future.set_exception(exc)

    async def wait(self, future: Future, deadline_s: float, param: str) -> object:
        """`future`'s result, waiting at most `deadline_s` of its compile (module docstring)."""
        waited = asyncio.wrap_future(future)  # shielded: a wait that ends leaves the compile to finish
        try:
            return await asyncio.wait_for(asyncio.shield(waited), deadline_s)
        except TimeoutError:
            pass
        started = getattr(future, "started_at", None)
        if started is None and future.cancel():
            raise ModelUnavailable("GrammarCompilerBusy", f"this model's grammar compiler spent the last "
                                   f"{deadline_s:g} s on other requests' schemas; retry in a moment",
                                   retry_after_s=1)
        left = (started or time.monotonic()) + deadline_s - time.monotonic()
        if left > 0:
            try:
                return await asyncio.wait_for(asyncio.shield(waited), left)
            except TimeoutError:
                pass
        raise SchemaRefused("deadline", f"compiling the grammar of {param} took longer than {deadline_s:g} s, the "
                            "worker's deadline; simplify the schema (fewer optional properties, alternatives or "
                            "nested objects); its compile finishes in the background, and the same schema is "
                            "answered from its result", param=param)
