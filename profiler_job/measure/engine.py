"""The worker's engine, as the profiler drives it: a narrow session interface and its one implementation.

Owns the seam through which latency is measured: an `EngineSession` holds
`slots` sequences in the engine the worker serves with, prefills prompts the way
the worker does (chunked), runs one decode step of every running sequence, and
frees its KV cache on `close`. `worker_engine` opens one; it is the only place
the profiler reaches worker code (lazily, in the Job's process), so that a
profile predicts what the worker will do. Tests and benches pass another
`EngineFactory` through profiler_job.run.Adapters. Called by measure.latency.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from profiler_job.measure.device import Device


class EngineSession(Protocol):
    """Up to `slots` sequences of one model in the worker's engine."""

    def prefill(self, prompts: Sequence[Sequence[int]]) -> None:
        """Admit each prompt and run it through chunked prefill to its first token."""

    def decode_step(self) -> None:
        """One decode step: every running sequence gets its next token."""

    def outputs(self) -> list[list[int]]:
        """The tokens each running sequence produced so far (the check that the steps really decoded)."""

    def close(self) -> None:
        """Free every sequence's KV cache."""


EngineFactory = Callable[..., EngineSession]
"""(model, device: Device, *, slots: int, prefill_chunk_tokens: int) -> an open EngineSession."""

NEVER_STOPS = 1 << 30  # max_tokens of a measured sequence: the profiler decides when it ends


def worker_engine(model: Any, device: Device, *, slots: int, prefill_chunk_tokens: int) -> EngineSession:
    """A session in the worker's engine (worker.engine), greedy, with no end-of-text token."""
    return _WorkerEngineSession(model, device, slots, prefill_chunk_tokens)


class _WorkerEngineSession:
    """Today's worker engine: one `Generation` per sequence, stepped in turns by the executor; a decode
    step of the batch is one step of each running Generation, exactly as worker.scheduler runs them."""

    def __init__(self, model: Any, device: Device, slots: int, prefill_chunk_tokens: int):
        import torch

        from worker.engine import Generation
        from worker.sampling import SamplingParams

        self._model, self._device, self._slots = model, torch.device(device.type), slots
        self._new = lambda prompt: Generation(
            prompt_ids=list(prompt), params=SamplingParams(max_tokens=NEVER_STOPS, temperature=0),
            eos_ids=frozenset(), decode=_no_text, prefill_chunk=prefill_chunk_tokens)
        self._running: list = []

    def prefill(self, prompts: Sequence[Sequence[int]]) -> None:
        if len(self._running) + len(prompts) > self._slots:
            raise ValueError(f"{len(self._running)} running + {len(prompts)} new sequences exceed "
                             f"the session's {self._slots} slots")
        for prompt in prompts:
            generation = self._new(prompt)
            while not generation.output_ids:
                generation.step(self._model, self._device)
            self._running.append(generation)

    def decode_step(self) -> None:
        for generation in self._running:
            generation.step(self._model, self._device)

    def outputs(self) -> list[list[int]]:
        return [list(generation.output_ids) for generation in self._running]

    def close(self) -> None:
        for generation in self._running:
            generation.release()
        self._running.clear()


def _no_text(ids: list[int]) -> str:
    """The measured sequences are never detokenised: no text is produced, only steps timed."""
    return ""
