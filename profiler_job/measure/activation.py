"""Activation peaks on CUDA: a prefill chunk (bytes per token) and one decode step (bytes per sequence).

Each is the CUDA allocator's peak during the forward pass above what was
allocated before it, minus the KV cache the pass added (the planner counts the
cache separately). A run without CUDA takes these from measure.estimated.
Called by profiler_job.run (stages "prefill" and "decode").
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from profiler_job.measure.device import Device, forward, next_tokens
from profiler_job.measure.latency import DECODE_PROMPT_TOKENS


@dataclass(frozen=True)
class ActivationPeak:
    bytes: int       # per prefill token, or per decoding sequence
    measured: bool
    derivation: str


def prefill_peak(model: Any, device: Device, chunk_tokens: int, kv_bytes_per_token: int) -> ActivationPeak:
    ids = device.tokens(model.config.vocab_size, 1, chunk_tokens)
    _, peak = device.peak_above_baseline(lambda: forward(model, ids))
    activation = max(0, peak - kv_bytes_per_token * chunk_tokens)
    return ActivationPeak(math.ceil(activation / chunk_tokens), True,
                          f"measured: torch.cuda.max_memory_allocated during a {chunk_tokens}-token prefill, "
                          "minus the KV cache it wrote, per token")


def decode_peak(model: Any, device: Device, batch: int, kv_bytes_per_token: int) -> ActivationPeak:
    prompt = forward(model, device.tokens(model.config.vocab_size, batch, DECODE_PROMPT_TOKENS))
    step_ids = next_tokens(prompt)
    _, peak = device.peak_above_baseline(lambda: forward(model, step_ids, prompt.cache))
    activation = max(0, peak - kv_bytes_per_token * batch)
    return ActivationPeak(math.ceil(activation / batch), True,
                          f"measured: torch.cuda.max_memory_allocated during one decode step at batch {batch} "
                          f"after a {DECODE_PROMPT_TOKENS}-token prompt, minus the KV cache it appended, per sequence")
