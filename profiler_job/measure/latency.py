"""Latency through the worker's engine: prefill ms per 1,000 prompt tokens, decode step ms per batch size.

Owns the timing protocol (a warm-up, then the median of `repeats` runs, device
synchronised around each). A decode step is measured at each batch bucket of
the declared concurrency (contract.batching: 1, the powers of two below it, and
it), the sizes the worker captures its decode graphs for, with KV slots of the
declared context, as the worker allocates them. Every forward runs in the
worker's engine through an `EngineSession` (measure.engine), so the numbers are
the worker's. `latency.decodeMsPerToken` is the step at batch 1. Measured on
whatever device runs the Job; the derivation names it. Called by
profiler_job.run (stages "prefill" and "decode").
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from contract.batching import buckets
from profiler_job.measure.device import WARMUP_RUNS, Device
from profiler_job.measure.engine import EngineFactory

DECODE_PROMPT_TOKENS = 16


@dataclass(frozen=True)
class Timing:
    ms: float
    derivation: str


@dataclass(frozen=True)
class DecodeSteps:
    """Median ms of one decode step of the whole batch, per batch size (ascending; batch 1 first)."""

    ms_by_batch: tuple[tuple[int, float], ...]
    repeats: int
    context_tokens: int
    device: str

    @property
    def per_token(self) -> Timing:
        """decodeMsPerToken: the step at batch 1."""
        return Timing(self.ms_by_batch[0][1],
                      f"measured on {self.device} through the worker's engine: median of {self.repeats} decode "
                      f"steps at batch 1 after a {DECODE_PROMPT_TOKENS}-token prompt and a warm-up step, KV slots "
                      f"of {self.context_tokens} tokens")

    def derivation(self) -> str:
        batches = ", ".join(str(batch) for batch, _ in self.ms_by_batch)
        return (f"measured on {self.device} through the worker's engine: per batch size ({batches}), that many "
                f"sequences prefilled with {DECODE_PROMPT_TOKENS}-token prompts into KV slots of "
                f"{self.context_tokens} tokens, then the median of {self.repeats} decode steps of the whole batch "
                "after a warm-up step")


def prefill_ms_per_1k(model: Any, device: Device, engine: EngineFactory, context_tokens: int, chunk_tokens: int,
                      repeats: int) -> Timing:
    """One prompt of `chunk_tokens` prefilled in a fresh one-slot session per run (one prefill chunk)."""
    ids = device.tokens(model.config.vocab_size, 1, chunk_tokens)[0].tolist()
    times = []
    for run in range(WARMUP_RUNS + repeats):
        session = engine(model, device, slots=1, context_tokens=max(context_tokens, chunk_tokens + 1),
                         prefill_chunk_tokens=chunk_tokens)
        try:
            ms = device.elapsed_ms(lambda: session.prefill([ids]))
        finally:
            session.close()
        if run >= WARMUP_RUNS:
            times.append(ms)
    return Timing(statistics.median(times) * 1000.0 / chunk_tokens,
                  f"measured on {device.type} through the worker's engine: median of {repeats} prefills of one "
                  f"{chunk_tokens}-token prompt after a warm-up, scaled to 1,000 tokens")


def decode_step_ms(model: Any, device: Device, engine: EngineFactory, concurrency: int, context_tokens: int,
                   chunk_tokens: int, repeats: int) -> DecodeSteps:
    """The median decode step at each bucket of `concurrency`, every sequence in KV slots of `context_tokens`."""
    context = max(context_tokens, DECODE_PROMPT_TOKENS + 2 * (WARMUP_RUNS + repeats) + 1)
    return DecodeSteps(tuple((batch, _step_ms(model, device, engine, batch, context, chunk_tokens, repeats))
                             for batch in buckets(concurrency)), repeats, context, device.type)


def _step_ms(model: Any, device: Device, engine: EngineFactory, batch: int, context_tokens: int, chunk_tokens: int,
             repeats: int) -> float:
    prompts = device.tokens(model.config.vocab_size, batch, DECODE_PROMPT_TOKENS).tolist()
    session = engine(model, device, slots=batch, context_tokens=context_tokens, prefill_chunk_tokens=chunk_tokens)
    try:
        session.prefill(prompts)
        before = [len(tokens) for tokens in session.outputs()]
        ms = device.median_ms(session.decode_step, repeats)
        grown = [len(tokens) - had for tokens, had in zip(session.outputs(), before)]
    finally:
        session.close()
    steps = WARMUP_RUNS + repeats
    if len(before) != batch or grown != [steps] * batch:
        raise RuntimeError(f"{steps} decode steps of an engine session with {batch} sequences gave {grown} new tokens "
                           "per sequence; its decode step does not advance the whole batch (an engine bug)")
    return ms
