"""One profiling run: choose the device, load the model, measure stage by stage, assemble the profile.

Owns the order of the stages and the adapters a run needs (Hub download, loader, CUDA probe,
GPU identity, Kubernetes API, the worker's engine the latency is measured
through), so tests and the bench can swap them.
Called by profiler_job.cli (`profile_model`), bench/profile_gpu.py and bench/worker_gpu.py
(`measure_model`, on a model it built itself).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from contract.gpu_catalog import capability_of
from profiler_job import __version__
from profiler_job.args import PROFILE_DTYPES, Options
from profiler_job.errors import InvalidArguments, NoGPU, OutOfMemory, UnsupportedArchitecture
from profiler_job.gpu import GpuIdentity, current_identity
from profiler_job.load import Download, FromPretrained, load_model, transformers_from_pretrained
from profiler_job.measure.activation import decode_peak, prefill_peak
from profiler_job.measure.bandwidth import measure_bandwidth
from profiler_job.measure.device import Device
from profiler_job.measure.engine import EngineFactory, worker_engine
from profiler_job.measure.estimated import cpu_identity, estimate_for_cpu_run
from profiler_job.measure.kv import measure_kv
from profiler_job.measure.latency import decode_step_ms, prefill_ms_per_1k
from profiler_job.measure.overhead import measure_overhead
from profiler_job.measure.weights import measure_weights
from profiler_job.precision import apply_precision
from profiler_job.profile import Measurements, build_profile
from profiler_job.progress import Progress
from profiler_job.publish import default_core_api
from profiler_job.structure import find_parts


def _cuda_available() -> bool:
    import torch
    return torch.cuda.is_available()


def _cuda_capability() -> tuple[int, int]:
    import torch
    return tuple(torch.cuda.get_device_capability())


def memory_fraction(max_bytes: int | None, free_bytes: int, total_bytes: int) -> float:
    """The share of the device the run may allocate: the smaller of `max_bytes` (what the plan leaves beside the
    workers) and what the driver reports free now (running workers' memory is never taken)."""
    allowed = free_bytes if max_bytes is None else min(max_bytes, free_bytes)
    return max(0.0, min(1.0, allowed / total_bytes))


def _limit_device_memory(max_bytes: int | None) -> float:
    """Caps torch's allocator on the current device (set_per_process_memory_fraction): an allocation past the
    cap raises out of memory in this process, never in a neighbouring worker. Returns the fraction set."""
    import torch

    free, total = torch.cuda.mem_get_info()
    fraction = memory_fraction(max_bytes, free, total)
    torch.cuda.set_per_process_memory_fraction(fraction)
    return fraction


@dataclass(frozen=True)
class Adapters:
    """The I/O a run does, replaceable in tests."""

    from_pretrained: FromPretrained = transformers_from_pretrained
    download: Download | None = None  # None: huggingface_hub's snapshot_download (contract.hub)
    cuda_available: Callable[[], bool] = _cuda_available
    gpu_identity: Callable[[str | None], GpuIdentity] = current_identity
    core_api: Callable[[], Any] = default_core_api
    engine: EngineFactory = worker_engine
    limit_device_memory: Callable[[int | None], float] = _limit_device_memory
    cuda_capability: Callable[[], tuple[int, int]] = _cuda_capability  # what contract.precision's rule is given


def choose_device(options: Options, cuda_available: bool) -> Device:
    if cuda_available:
        return Device("cuda")
    if options.require_gpu:
        raise NoGPU("--require-gpu is set but no CUDA device is visible; schedule the Job on a GPU node "
                    "(nvidia.com/gpu resource limit, NVIDIA runtime class) or drop --require-gpu")
    if options.gpu_product is None:
        raise InvalidArguments("no CUDA device is visible, so the GPU product is unknown; pass --gpu-product NAME "
                               "(a product of the GPU catalog) for an estimated CPU profile, or run on a GPU node")
    return Device("cpu")


def profile_model(options: Options, adapters: Adapters, progress: Progress) -> dict:
    device = choose_device(options, adapters.cuda_available())
    identity = (adapters.gpu_identity(options.gpu_product) if device.is_cuda
                else cpu_identity(options.gpu_product))
    if device.is_cuda:
        adapters.limit_device_memory(options.max_gpu_memory_bytes)
    with progress.stage("load") as log:
        model = load_model(options.model, revision=options.revision, dtype=options.dtype,
                           trust_remote_code=options.trust_remote_code, device=device.type,
                           from_pretrained=adapters.from_pretrained, download=adapters.download, report=progress.note)
        # the GPU's own capability, or on a CPU run the catalog's for the product the profile is for
        capability = adapters.cuda_capability() if device.is_cuda else capability_of(identity.product)
        precision = apply_precision(model, weights=options.weights, dtype=options.dtype, capability=capability,
                                    product=identity.product, device=device.type)
        log.update(model=options.model, device=device.type, gpuProduct=identity.product, dtype=precision.compute,
                   weights=precision.weights)
    return measure_model(model, options, device, identity, progress, engine=adapters.engine)


def measure_model(model: Any, options: Options, device: Device, identity: GpuIdentity, progress: Progress, *,
                  engine: EngineFactory = worker_engine) -> dict:
    """The validated profile of a loaded model; running out of device memory is OutOfMemory, with the fix."""
    import torch

    try:
        return _measure(model, options, device, identity, progress, engine)
    except torch.OutOfMemoryError as exc:
        raise OutOfMemory(
            f"measuring {options.model} ran out of GPU memory ({str(exc).splitlines()[0]}); lower "
            f"--context-tokens (a prefill chunk of {options.chunk_tokens}) or --concurrency ({options.concurrency})") from exc


def _measure(model: Any, options: Options, device: Device, identity: GpuIdentity, progress: Progress,
             engine: EngineFactory) -> dict:
    import torch
    import transformers

    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    if dtype not in PROFILE_DTYPES:
        raise UnsupportedArchitecture(f"{options.model} loaded with {dtype} weights; profiles cover "
                                      f"{', '.join(PROFILE_DTYPES)}: pass --dtype")
    with progress.stage("weights") as log:
        parts = find_parts(model)
        weights = measure_weights(model, parts)
        log.update(totalBytes=weights.total, layers=len(weights.layers), tiedEmbeddings=weights.tied)
    with progress.stage("kv") as log:
        kv = measure_kv(model, device)
        log.update(bytesPerToken=kv.bytes_per_token)
    estimate = (None if device.is_cuda
                else estimate_for_cpu_run(model, options.model, dtype, identity, options.weights))
    chunk = options.chunk_tokens
    with progress.stage("prefill") as log:
        prefill_activation = estimate.prefill if estimate else prefill_peak(model, device, chunk, kv.bytes_per_token)
        prefill_latency = prefill_ms_per_1k(model, device, engine, options.context_tokens, chunk, options.repeats)
        log.update(bytesPerToken=prefill_activation.bytes, msPer1kTokens=round(prefill_latency.ms, 3))
    with progress.stage("decode") as log:
        decode_activation = estimate.decode if estimate else decode_peak(model, device, options.concurrency,
                                                                          kv.bytes_per_token)
        decode_steps = decode_step_ms(model, device, engine, options.concurrency, options.context_tokens, chunk,
                                      options.repeats)
        overhead = estimate.overhead if estimate else measure_overhead(weights, device)
        log.update(bytesPerSequence=decode_activation.bytes,
                   stepMs={batch: round(ms, 3) for batch, ms in decode_steps.ms_by_batch})
    with progress.stage("bandwidth") as log:
        bandwidth = (estimate.bandwidth if estimate
                     else measure_bandwidth(model.get_submodule(parts.layers_prefix)[0], device, options.repeats))
        log.update(hostToDeviceGBps=round(bandwidth.gbps, 2), measured=bandwidth.measured)
    method = (f"profiler_job {__version__} on {device.type} ({identity.product}); torch {torch.__version__}, "
              f"transformers {transformers.__version__}")
    return build_profile(model=options.model, revision=options.revision, dtype=dtype, weights=options.weights,
                         gpu=identity, method=method,
                         version=__version__, m=Measurements(
                             weights=weights, kv=kv, prefill_activation=prefill_activation,
                             prefill_chunk_tokens=chunk, decode_activation=decode_activation,
                             prefill_latency=prefill_latency, decode_steps=decode_steps,
                             overhead=overhead, bandwidth=bandwidth, on_gpu=device.is_cuda,
                             architecture=estimate.architecture if estimate else None))
