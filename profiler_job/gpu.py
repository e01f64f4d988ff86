"""Which GPU this Job runs on: NVML product name (as GPU Feature Discovery labels it), memory, driver, CUDA.

Owns the NVML adapter and the product-name normalisation that makes a profile's
`gpu.product` equal the node label `nvidia.com/gpu.product`. Called by
profiler_job.run; `normalize_product` is pure and tested on its own.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from contract.gpu_catalog import gpu_uuid
from profiler_job.errors import InvalidArguments

_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
_NOT_LABEL_CHAR = re.compile(r"[^A-Za-z0-9._-]")
MAX_LABEL_VALUE = 63


@dataclass(frozen=True)
class GpuIdentity:
    product: str
    memory_bytes: int | None = None
    driver_version: str | None = None
    cuda_version: str | None = None
    source: str = "NVML"
    hbm_gbps: float | None = None  # datasheet figure, only on CPU runs (contract.gpu_catalog)


def normalize_product(name: str) -> str:
    """NVML name -> label value, as GFD does: "NVIDIA H200" -> "NVIDIA-H200", "Tesla T4" -> "Tesla-T4".

    GFD joins the words of the name with "-"; characters a label value cannot hold
    also become "-", and the result is cut to 63 characters.
    """
    joined = "-".join(name.split())
    value = _NOT_LABEL_CHAR.sub("-", joined)[:MAX_LABEL_VALUE].strip("-._")
    if not _LABEL_VALUE.match(value):
        raise InvalidArguments(f"GPU product {name!r} gives no valid label value; pass --gpu-product NAME")
    return value


def cuda_version_text(version: int) -> str:
    """NVML's integer CUDA driver version (12040) as "12.4"."""
    return f"{version // 1000}.{version % 1000 // 10}"


def nvml_identity(uuid: str) -> GpuIdentity:
    """The identity of the GPU with this UUID ("GPU-..."; torch's device properties give it) through NVML."""
    import pynvml

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        return GpuIdentity(
            product=normalize_product(_text(pynvml.nvmlDeviceGetName(handle))),
            memory_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
            driver_version=_text(pynvml.nvmlSystemGetDriverVersion()),
            cuda_version=cuda_version_text(pynvml.nvmlSystemGetCudaDriverVersion()),
        )
    finally:
        pynvml.nvmlShutdown()


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def current_identity(override: str | None) -> GpuIdentity:
    """The GPU torch will use, named through NVML; `--gpu-product` wins when given. Needs CUDA."""
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    found = nvml_identity(gpu_uuid(props.uuid))
    if override is None:
        return found
    return GpuIdentity(normalize_product(override), found.memory_bytes, found.driver_version, found.cuda_version,
                       source=f"--gpu-product (NVML reports {found.product}); NVML for memory and versions")
