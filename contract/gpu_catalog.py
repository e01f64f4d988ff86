"""Published facts about the GPU products gpushare ships estimated profiles for.

Owns one small table: memory, HBM bandwidth, dense half-precision tensor FLOPS,
the pinned host->device copy rate and the CUDA compute capability (Hopper 9.0, Ada 8.9,
Turing 7.5: contract.precision's rules) of NVIDIA-H200, NVIDIA-L4 and Tesla-T4,
keyed by the product name NVIDIA GPU Feature Discovery puts in the
`nvidia.com/gpu.product` label. Called by contract.estimate (estimated
profiles) and the controller's validation of spec.weights. Measured profiles (profiler_job) replace every number here.
"""
from __future__ import annotations

from dataclasses import dataclass

MIB = 2**20


@dataclass(frozen=True)
class GpuSpec:
    product: str                 # nvidia.com/gpu.product
    memory_bytes: int            # nvidia.com/gpu.memory (MiB) x 2^20: what the driver reports
    hbm_gbps: float              # device memory bandwidth, GB/s (1e9 bytes/s)
    dense_half_tflops: float     # peak dense (no sparsity) tensor-core TFLOPS in half_dtype
    half_dtype: str              # the 16-bit float type its tensor cores run: bfloat16, or float16 before Ampere
    pcie: str                    # host link and its theoretical rate
    pinned_h2d_gbps: float       # pinned cudaMemcpyAsync host->device rate, GB/s
    datasheet: str               # where memory, bandwidth and FLOPS come from
    compute_capability: tuple[int, int] | None = None  # CUDA (major, minor): what contract.precision allows on it


CATALOG: dict[str, GpuSpec] = {
    # NVIDIA H200 Tensor Core GPU datasheet (SXM): 141 GB HBM3e, 4.8 TB/s,
    # BF16 tensor 1,979 TFLOPS *with sparsity* -> 989.5 dense. nvidia-smi / GFD report 143771 MiB.
    # Host link PCIe Gen5 x16 (63 GB/s per direction); pinned copies reach about 55 GB/s.
    "NVIDIA-H200": GpuSpec(
        product="NVIDIA-H200", memory_bytes=143771 * MIB, hbm_gbps=4800.0, dense_half_tflops=989.5,
        half_dtype="bfloat16", pcie="PCIe Gen5 x16 (63 GB/s per direction)", pinned_h2d_gbps=55.0,
        datasheet="NVIDIA H200 Tensor Core GPU datasheet (SXM)", compute_capability=(9, 0),
    ),
    # NVIDIA L4 Tensor Core GPU datasheet: 24 GB GDDR6, 300 GB/s, BF16/FP16 tensor 242 TFLOPS
    # *with sparsity* -> 121 dense. nvidia-smi / GFD report 23034 MiB.
    # Host link PCIe Gen4 x16 (31.5 GB/s per direction); pinned copies reach about 25 GB/s.
    "NVIDIA-L4": GpuSpec(
        product="NVIDIA-L4", memory_bytes=23034 * MIB, hbm_gbps=300.0, dense_half_tflops=121.0,
        half_dtype="bfloat16", pcie="PCIe Gen4 x16 (31.5 GB/s per direction)", pinned_h2d_gbps=25.0,
        datasheet="NVIDIA L4 Tensor Core GPU datasheet", compute_capability=(8, 9),
    ),
    # NVIDIA T4 datasheet: 16 GB GDDR6, 320 GB/s, mixed-precision FP16 tensor 65 TFLOPS (Turing: no
    # sparsity, no bfloat16). nvidia-smi / GFD report 15360 MiB.
    # Host link PCIe Gen3 x16 (15.75 GB/s per direction); pinned copies reach about 12 GB/s.
    "Tesla-T4": GpuSpec(
        product="Tesla-T4", memory_bytes=15360 * MIB, hbm_gbps=320.0, dense_half_tflops=65.0,
        half_dtype="float16", pcie="PCIe Gen3 x16 (15.75 GB/s per direction)", pinned_h2d_gbps=12.0,
        datasheet="NVIDIA T4 Tensor Core GPU datasheet", compute_capability=(7, 5),
    ),
}


class UnknownGpuError(KeyError):
    """A GPU product with no published facts in CATALOG."""

    reason = "UnknownGpuProduct"


def gpu_spec(product: str) -> GpuSpec:
    """The catalog entry for `product`; raises UnknownGpuError naming the known products."""
    try:
        return CATALOG[product]
    except KeyError:
        raise UnknownGpuError(
            f"no published facts for GPU product {product!r}; known: {', '.join(sorted(CATALOG))}. "
            "Fix: run the profiler Job on that GPU (a measured profile needs no catalog entry)"
        ) from None


def capability_of(product: str | None) -> tuple[int, int] | None:
    """The CUDA compute capability of a catalog product; None for a product the catalog does not know."""
    spec = CATALOG.get(product) if product else None
    return spec.compute_capability if spec else None


def gpu_uuid(raw: object) -> str:
    """A device's UUID as NVML and NVIDIA_VISIBLE_DEVICES name it ("GPU-..." or "MIG-..."), from torch's
    device properties (which omit the prefix). The worker publishes it; the profiler looks its GPU up by it."""
    text = str(raw)
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"
