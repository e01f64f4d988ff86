"""The inference engine the worker serves with and the profiler measures through.

Owns the batched forward passes (forward/), the static KV slots and decode graphs, the device
sampler (sampling.py), the continuous batch (batch.py), how a model's weights occupy the
device (residency/, transfer.py) and every model's account of its device bytes (memory.py).
It imports only `contract` (the footprint constants and batching buckets) and torch/transformers;
the worker (worker/) and the profiler Job (profiler_job/measure/engine.py) sit on top of it.
"""
