"""What a run without CUDA cannot measure, taken from contract.estimate for the named GPU product.

Owns the CPU fallback: activation peaks, runtime overhead and host-to-device
bandwidth come from the estimator the controller uses for its shipped profiles
(published config facts and the GPU catalog), so a CPU profile and an estimated
profile never disagree. Weights, KV cache and latency are still measured by the
other modules. Called by profiler_job.run when the device is the CPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from profiler_job.errors import InvalidArguments, UnsupportedArchitecture
from profiler_job.gpu import GpuIdentity, normalize_product
from profiler_job.measure.activation import ActivationPeak
from profiler_job.measure.bandwidth import Bandwidth
from profiler_job.measure.overhead import Overhead

NOT_MEASURED = "not measured (no CUDA device), from contract.estimate: "


@dataclass(frozen=True)
class CpuEstimate:
    prefill: ActivationPeak
    decode: ActivationPeak
    overhead: Overhead
    bandwidth: Bandwidth
    architecture: dict


def cpu_identity(product: str) -> GpuIdentity:
    """The GPU a CPU run estimates for: --gpu-product, which must be in the GPU catalog."""
    from contract.gpu_catalog import UnknownGpuError, gpu_spec

    name = normalize_product(product)
    try:
        spec = gpu_spec(name)
    except UnknownGpuError as exc:
        raise InvalidArguments(f"a CPU run estimates for --gpu-product from the GPU catalog: {exc.args[0]}") from exc
    return GpuIdentity(name, memory_bytes=spec.memory_bytes, hbm_gbps=spec.hbm_gbps,
                       source=f"--gpu-product (CPU run); memory and bandwidth from the {spec.datasheet}")


def estimate_for_cpu_run(model: Any, model_id: str, dtype: str, gpu: GpuIdentity, weights: str = "auto") -> CpuEstimate:
    from contract.estimate import UnsupportedArchitectureError, architecture_from_config, estimate_profile
    from contract.gpu_catalog import gpu_spec

    try:
        architecture = architecture_from_config(model.config.to_dict())
    except UnsupportedArchitectureError as exc:
        raise UnsupportedArchitecture(f"a CPU run estimates activations from the architecture: {exc}") from exc
    doc = estimate_profile(architecture, model_id, gpu_spec(gpu.product), dtype, weights_dtype=weights)
    why = doc["derivation"]
    return CpuEstimate(
        prefill=ActivationPeak(doc["activation"]["prefillBytesPerToken"], False,
                               NOT_MEASURED + why["activation.prefillBytesPerToken"]),
        decode=ActivationPeak(doc["activation"]["decodeBytesPerSequence"], False,
                              NOT_MEASURED + why["activation.decodeBytesPerSequence"]),
        overhead=Overhead(doc["runtimeOverheadBytes"], NOT_MEASURED + why["runtimeOverheadBytes"]),
        bandwidth=Bandwidth(doc["hostToDeviceGBps"], None, False,
                            {"hostToDeviceGBps": NOT_MEASURED + why["hostToDeviceGBps"]}),
        architecture=architecture,
    )
