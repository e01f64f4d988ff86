"""Batch-size buckets: the batch sizes a model's decode step is prepared and measured at.

The worker captures one CUDA graph per bucket (engine/forward/graphs.py) and a
batch runs in the smallest bucket that holds it; the profiler measures one decode
step per bucket (profiler_job/measure/latency.py), so a profile's
`latency.decodeStepMs` holds the step times of exactly the graphs the worker
replays. Pure.
"""
from __future__ import annotations


def buckets(concurrency: int) -> list[int]:
    """1, 2, 4, ... below `concurrency`, then `concurrency` itself."""
    sizes, size = [], 1
    while size < concurrency:
        sizes.append(size)
        size *= 2
    return sizes + [concurrency]
