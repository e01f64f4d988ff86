"""What a request hears from its model's executor: text that became final (with the log-probabilities of
its tokens when asked), the finish, or an error. Made by worker/emitter.py and worker/scheduler.py,
read by the API (worker/api.py, worker/responses.py) and tests.
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.sampling import Choice

from .errors import WorkerError


@dataclass(frozen=True)
class TokenEvent:
    """Text that became final, and the sampler's Choices (with log-probabilities) of the tokens sampled
    since the previous TokenEvent, when the request asked for logprobs."""

    text: str
    choices: tuple[Choice, ...] = ()


@dataclass(frozen=True)
class FinishEvent:
    reason: str
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class ErrorEvent:
    error: WorkerError


Event = TokenEvent | FinishEvent | ErrorEvent
