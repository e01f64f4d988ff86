"""One request's generation as the worker runs it: `Job`, what a request handler submits to the scheduler and
what each step's output hands to the emitter.

Owns the job's fields (its generation, its event sink and the thread that sink runs on, its timings, its
text so far) and its cancellation (setting `cancelled`, as a disconnecting client does, calls back into the
scheduler to withdraw it or free its slot). A module of its own below both of its users, so neither imports
the other for it: worker/scheduler.py (submits and steps jobs) and worker/emitter.py (turns their tokens
into events); worker/runtime.py builds them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from engine.batch import Generation
from engine.text import TextStream

from .events import Event


@dataclass(eq=False)
class Job:
    model: str
    generation: Generation
    sink: Callable[[Event], None]
    submitted_at: float
    post: Callable[[Callable[[], None]], None] | None = None  # runs a callable on the sink's thread (None: any)
    started_at: float | None = None  # when it joined its model's batch (the queue wait ends)
    first_token_at: float | None = None
    last_token_at: float | None = None
    text: TextStream | None = None  # the answer's text so far (the emitter's)
    stopped: bool = False  # a stop string ended it: its slot is freed at the next step
    _cancelled: bool = False
    _on_cancel: Callable[["Job"], None] = field(default=lambda job: None, repr=False)

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    @cancelled.setter
    def cancelled(self, value: bool) -> None:
        """Setting it (the client went away) withdraws the job from its queue or frees its slot."""
        if value and not self._cancelled:
            self._cancelled = True
            self._on_cancel(self)
