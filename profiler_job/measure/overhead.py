"""Runtime overhead on CUDA: what a loaded, warmed-up model holds on the device beyond its weights.

torch.cuda.memory_allocated after the forward passes (caches released) minus
the weight bytes: non-persistent buffers such as rotary tables and library
workspaces. A run without CUDA takes it from measure.estimated.
Called by profiler_job.run after the decode stage.
"""
from __future__ import annotations

from dataclasses import dataclass

from profiler_job.measure.device import Device
from profiler_job.measure.weights import WeightBytes


@dataclass(frozen=True)
class Overhead:
    bytes: int
    derivation: str


def measure_overhead(weights: WeightBytes, device: Device) -> Overhead:
    return Overhead(max(0, device.allocated_bytes() - weights.total),
                    "measured: torch.cuda.memory_allocated after warm-up forward passes, minus the weight bytes")
