"""The device measurements run on (CUDA or CPU): forward passes, timing and peak-memory helpers.

Owns the only code that synchronises the device, reads the CUDA allocator
statistics and runs the model's forward pass (with the KV cache and only the
last position's logits, as generation does). Called by the kv, activation,
latency and bandwidth measurements.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from contract.hf_compat import cache_kwargs, returned_cache

WARMUP_RUNS = 1


@dataclass(frozen=True)
class Device:
    type: str  # "cuda" or "cpu"

    @property
    def is_cuda(self) -> bool:
        return self.type == "cuda"

    def sync(self) -> None:
        if self.is_cuda:
            import torch
            torch.cuda.synchronize()

    def tokens(self, vocab_size: int, batch: int, length: int, seed: int = 0) -> Any:
        """Random token ids of shape [batch, length] on this device (fixed seed: repeatable runs)."""
        import torch
        generator = torch.Generator().manual_seed(seed)
        return torch.randint(0, vocab_size, (batch, length), generator=generator).to(self.type)

    def median_ms(self, fn: Callable[[], Any], repeats: int) -> float:
        """Median wall time of `fn` in ms over `repeats` runs, after a warm-up run, device synchronised."""
        for _ in range(WARMUP_RUNS):
            fn()
        return statistics.median(self.elapsed_ms(fn) for _ in range(repeats))

    def elapsed_ms(self, fn: Callable[[], Any]) -> float:
        """Wall time of one call of `fn` in ms, the device synchronised before and after."""
        self.sync()
        start = time.perf_counter()
        fn()
        self.sync()
        return (time.perf_counter() - start) * 1000.0

    def peak_above_baseline(self, fn: Callable[[], Any]) -> tuple[Any, int]:
        """(fn's result, the CUDA allocator's peak bytes during fn above what was allocated before it)."""
        import torch
        self.sync()
        torch.cuda.empty_cache()
        baseline = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        result = fn()
        self.sync()
        return result, torch.cuda.max_memory_allocated() - baseline

    def allocated_bytes(self) -> int:
        import torch
        self.sync()
        return torch.cuda.memory_allocated()


@dataclass(frozen=True)
class Forward:
    """What one forward pass gave: the last position's logits [batch, 1, vocab] and the KV cache it extended."""

    logits: Any
    cache: Any


def forward(model: Any, ids: Any, cache: Any = None) -> Forward:
    """One inference forward with the KV cache, keeping only the last position's logits (as generate does).

    The cache goes in and comes out under the name this transformers release uses (contract.hf_compat)."""
    import torch
    with torch.inference_mode():
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1, **cache_kwargs(model, cache))
    return Forward(out.logits, returned_cache(out))


def next_tokens(output: Any) -> Any:
    """Greedy next token per sequence, shape [batch, 1]."""
    return output.logits[:, -1:, :].argmax(dim=-1)


def dtype_bytes(model: Any) -> int:
    return next(model.parameters()).element_size()
