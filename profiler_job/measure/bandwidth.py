"""Pinned host-to-device bandwidth and the time to copy one decoder layer, on CUDA.

Owns the copy benchmark: a pinned host buffer copied to the GPU, median of
`repeats`, GB/s = 1e9 bytes/s; and layer 0's tensors copied from pinned host
memory. A run without CUDA takes the bandwidth from measure.estimated and
leaves layerCopyMs out. Called by profiler_job.run (stage "bandwidth").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from profiler_job.measure.device import Device

PROBE_BYTES = 256 * 2**20


@dataclass(frozen=True)
class Bandwidth:
    gbps: float
    layer_copy_ms: float | None
    measured: bool
    derivation: dict[str, str]


def measure_bandwidth(layer: Any, device: Device, repeats: int) -> Bandwidth:
    import torch

    host = torch.empty(PROBE_BYTES, dtype=torch.uint8, pin_memory=True)
    target = torch.empty_like(host, device="cuda")
    ms = device.median_ms(lambda: target.copy_(host, non_blocking=True), repeats)
    sources = [t.detach().to("cpu").pin_memory() for t in layer.state_dict().values()]
    targets = [torch.empty_like(t, device="cuda") for t in sources]

    def copy_layer() -> None:
        for src, dst in zip(sources, targets):
            dst.copy_(src, non_blocking=True)

    layer_ms = device.median_ms(copy_layer, repeats)
    return Bandwidth(PROBE_BYTES / (ms / 1000.0) / 1e9, layer_ms, True, {
        "hostToDeviceGBps": f"measured: median of {repeats} pinned copies of {PROBE_BYTES} bytes to the GPU",
        "layerCopyMs": f"measured: median of {repeats} pinned copies of decoder layer 0's tensors to the GPU"})
