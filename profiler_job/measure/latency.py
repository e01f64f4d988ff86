"""Resident latency: prefill ms per 1,000 prompt tokens and decode ms per output token (batch 1).

Owns the timing protocol: a warm-up run, then the median of `repeats` runs,
device synchronised around each. Measured on whatever device runs the Job; the
derivation names it. Called by profiler_job.run (stages "prefill" and "decode").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from profiler_job.measure.device import Device, forward, next_tokens

DECODE_PROMPT_TOKENS = 16


@dataclass(frozen=True)
class Timing:
    ms: float
    derivation: str


def prefill_ms_per_1k(model: Any, device: Device, chunk_tokens: int, repeats: int) -> Timing:
    ids = device.tokens(model.config.vocab_size, 1, chunk_tokens)
    ms = device.median_ms(lambda: forward(model, ids), repeats)
    return Timing(ms * 1000.0 / chunk_tokens,
                  f"measured on {device.type}: median of {repeats} prefills of {chunk_tokens} tokens "
                  "after a warm-up, scaled to 1,000 tokens")


def decode_ms_per_token(model: Any, device: Device, repeats: int) -> Timing:
    """Each timed run is one decode step on a growing cache, as generation runs them."""
    state = {"out": forward(model, device.tokens(model.config.vocab_size, 1, DECODE_PROMPT_TOKENS))}

    def step() -> None:
        out = state["out"]
        state["out"] = forward(model, next_tokens(out), out.cache)

    ms = device.median_ms(step, repeats)
    return Timing(ms, f"measured on {device.type}: median of {repeats} single-token decode steps at batch 1 "
                      f"after a {DECODE_PROMPT_TOKENS}-token prompt and a warm-up step")
