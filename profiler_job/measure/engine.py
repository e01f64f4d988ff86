"""The engine the worker serves with, as the profiler drives it: a narrow session interface and its one
implementation.

Owns the seam through which latency is measured: an `EngineSession` holds
`slots` sequences in the engine package (engine/, the one the worker serves with),
prefills prompts the way the worker does (chunked), runs one decode step of every
running sequence, and frees its KV cache on `close`. `worker_engine` opens one; it
is the only place the profiler reaches the engine (lazily, in the Job's process), so
that a profile predicts what the worker will do. Tests and benches pass another
`EngineFactory` through profiler_job.run.Adapters. Called by measure.latency. (The profiler's one other
use of the engine is its quantizer, in profiler_job.precision.)
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
"""(model, device: Device, *, slots: int, context_tokens: int, prefill_chunk_tokens: int) -> an open
EngineSession whose KV slots hold `context_tokens` tokens each."""

NEVER_STOPS = 1 << 30  # max_tokens of a measured sequence: the profiler decides when it ends
UNBOUNDED_BYTES = 1 << 62  # the session's ledger: the profiler measures, it has no budget to enforce


def worker_engine(model: Any, device: Device, *, slots: int, context_tokens: int,
                  prefill_chunk_tokens: int) -> EngineSession:
    """A session in the worker's engine (engine.batch.ModelEngine), greedy, with no end-of-text token."""
    return _WorkerEngineSession(model, device, slots, context_tokens, prefill_chunk_tokens)


class _WorkerEngineSession:
    """A `ModelEngine` over the model as the profiler loaded it: the worker's forward (its own batched
    decoder for Llama, Qwen2 and Mistral, transformers' modules otherwise), static KV slots and, on CUDA,
    the decode graphs per batch bucket, all as a resident model in the worker runs them."""

    def __init__(self, model: Any, device: Device, slots: int, context_tokens: int, prefill_chunk_tokens: int):
        import torch

        from engine.batch import Generation, ModelEngine
        from engine.memory import DeviceLedger
        from engine.residency.resident import ResidentResidency
        from engine.sampling import SamplingParams

        where = torch.device("cuda", torch.cuda.current_device()) if device.is_cuda else torch.device("cpu")
        # The weights already lie where the profiler loaded them; the residency packs each decoder layer as the
        # worker's does (one allocation per layer: the merged projections the engine reads), layer by layer.
        residency = ResidentResidency(model, DeviceLedger("profiler", UNBOUNDED_BYTES, where), where, pin=False)
        residency.load()
        self._engine = ModelEngine(residency, concurrency=slots, context_tokens=context_tokens, kv_bytes=0,
                                   prefill_chunk=prefill_chunk_tokens)
        self._new = lambda prompt: Generation(prompt_ids=list(prompt), eos_ids=frozenset(), decode=_no_text,
                                              params=SamplingParams(max_tokens=NEVER_STOPS, temperature=0))
        self._running: list = []

    def prefill(self, prompts: Sequence[Sequence[int]]) -> None:
        joined = [self._new(prompt) for prompt in prompts]
        for generation in joined:
            self._engine.join(generation)
        self._running.extend(joined)
        while any(not generation.output_ids for generation in joined):
            self._engine.step()

    def decode_step(self) -> None:
        self._engine.step()

    def outputs(self) -> list[list[int]]:
        return [list(generation.output_ids) for generation in self._running]

    def close(self) -> None:
        self._engine.deactivate()  # every sequence leaves; the KV slots and graphs are dropped
        self._running.clear()


def _no_text(ids: list[int]) -> str:
    """The measured sequences are never detokenised: no text is produced, only steps timed."""
    return ""
