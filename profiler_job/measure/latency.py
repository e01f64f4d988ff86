"""Latency through the worker's engine: prefill ms per 1,000 prompt tokens, decode step ms per batch size.

Owns the timing protocol (a warm-up, then the median of `repeats` runs, device
synchronised around each) and the batch sizes a decode step is measured at:
1, the powers of two below the declared concurrency, and the concurrency
(`decode_batches`). Every forward runs in the worker's engine through an
`EngineSession` (measure.engine), so the numbers are the worker's.
`latency.decodeMsPerToken` is the step at batch 1. Measured on whatever device
runs the Job; the derivation names it. Called by profiler_job.run (stages
"prefill" and "decode") and bench/worker_gpu.py.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

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
    device: str

    @property
    def per_token(self) -> Timing:
        """decodeMsPerToken: the step at batch 1."""
        return Timing(self.ms_by_batch[0][1],
                      f"measured on {self.device} through the worker's engine: median of {self.repeats} decode "
                      f"steps at batch 1 after a {DECODE_PROMPT_TOKENS}-token prompt and a warm-up step")

    def derivation(self) -> str:
        batches = ", ".join(str(batch) for batch, _ in self.ms_by_batch)
        return (f"measured on {self.device} through the worker's engine: per batch size ({batches}), that many "
                f"sequences prefilled with {DECODE_PROMPT_TOKENS}-token prompts, then the median of {self.repeats} "
                "decode steps of the whole batch after a warm-up step")


def decode_batches(concurrency: int) -> tuple[int, ...]:
    """1, 2, 4, ... below `concurrency`, then `concurrency` itself: the batch sizes decode is measured at."""
    batches, batch = [], 1
    while batch < concurrency:
        batches.append(batch)
        batch *= 2
    return (*batches, concurrency)


def prefill_ms_per_1k(model: Any, device: Device, engine: EngineFactory, chunk_tokens: int,
                      repeats: int) -> Timing:
    """One prompt of `chunk_tokens` prefilled in a fresh session per run (one prefill chunk)."""
    ids = device.tokens(model.config.vocab_size, 1, chunk_tokens)[0].tolist()
    times = []
    for run in range(WARMUP_RUNS + repeats):
        session = engine(model, device, slots=1, prefill_chunk_tokens=chunk_tokens)
        try:
            ms = device.elapsed_ms(lambda: session.prefill([ids]))
        finally:
            session.close()
        if run >= WARMUP_RUNS:
            times.append(ms)
    return Timing(statistics.median(times) * 1000.0 / chunk_tokens,
                  f"measured on {device.type} through the worker's engine: median of {repeats} prefills of one "
                  f"{chunk_tokens}-token prompt after a warm-up, scaled to 1,000 tokens")


def decode_step_ms(model: Any, device: Device, engine: EngineFactory, concurrency: int, chunk_tokens: int,
                   repeats: int) -> DecodeSteps:
    return DecodeSteps(tuple((batch, _step_ms(model, device, engine, batch, chunk_tokens, repeats))
                             for batch in decode_batches(concurrency)), repeats, device.type)


def _step_ms(model: Any, device: Device, engine: EngineFactory, batch: int, chunk_tokens: int, repeats: int) -> float:
    prompts = device.tokens(model.config.vocab_size, batch, DECODE_PROMPT_TOKENS).tolist()
    session = engine(model, device, slots=batch, prefill_chunk_tokens=chunk_tokens)
    try:
        session.prefill(prompts)
        ms = device.median_ms(session.decode_step, repeats)
        produced = [len(tokens) for tokens in session.outputs()]
    finally:
        session.close()
    expected = 1 + WARMUP_RUNS + repeats  # the prefill's token, then one per step
    if produced != [expected] * batch:
        raise RuntimeError(f"the engine session decoded {produced} tokens per sequence, not {expected} for each of "
                           f"{batch} sequences; its decode step does not advance the whole batch (an engine bug)")
    return ms
