"""The profile document: assembled from the measurements, validated against schemas/profile.schema.json.

Owns the mapping from measurement results to the profile's fields, the rule
for `source` (measured only when weights, KV cache, activations and latency were
all measured on the GPU the profile names), and validation. Pure: no I/O.
Called by profiler_job.run; publish serialises what it returns.
"""
from __future__ import annotations

from dataclasses import dataclass

import schemas
from contract.precision import AUTO
from contract.wire import API_VERSION, PROFILE_KIND
from profiler_job.errors import InvalidProfile
from profiler_job.gpu import GpuIdentity
from profiler_job.measure.activation import ActivationPeak
from profiler_job.measure.bandwidth import Bandwidth
from profiler_job.measure.kv import KvResult
from profiler_job.measure.latency import DecodeSteps, Timing
from profiler_job.measure.overhead import Overhead
from profiler_job.measure.weights import WeightBytes


@dataclass(frozen=True)
class Measurements:
    weights: WeightBytes
    kv: KvResult
    prefill_activation: ActivationPeak
    prefill_chunk_tokens: int
    decode_activation: ActivationPeak
    prefill_latency: Timing
    decode_steps: DecodeSteps
    overhead: Overhead
    bandwidth: Bandwidth
    on_gpu: bool  # activations, latency and overhead came from the GPU the profile names
    architecture: dict | None = None  # the config facts a CPU run's estimates were computed from


def build_profile(*, model: str, revision: str, dtype: str, gpu: GpuIdentity, method: str, version: str,
                  m: Measurements, weights: str = AUTO) -> dict:
    """`weights`: the spec.weights.dtype the profile is for (weights.dtype; absent for auto)."""
    w = m.weights
    doc = {
        "apiVersion": API_VERSION,
        "kind": PROFILE_KIND,
        "model": model,
        "revision": revision,
        "gpu": _gpu(gpu),
        "dtype": dtype,
        "source": "measured" if m.on_gpu else "estimated",
        "method": method,
        "profilerVersion": version,
        "weights": {
            "totalBytes": w.total, "embeddingBytes": w.embedding, "layerBytes": list(w.layers),
            "finalNormBytes": w.final_norm, "headBytes": w.head, "tiedEmbeddings": w.tied,
        },
        "kvCache": {"bytesPerToken": m.kv.bytes_per_token},
        "activation": {
            "prefillBytesPerToken": m.prefill_activation.bytes,
            "prefillChunkTokens": m.prefill_chunk_tokens,
            "decodeBytesPerSequence": m.decode_activation.bytes,
        },
        "runtimeOverheadBytes": m.overhead.bytes,
        "latency": {
            "decodeMsPerToken": m.decode_steps.per_token.ms,
            "prefillMsPer1kTokens": m.prefill_latency.ms,
            "decodeStepMs": [{"batch": batch, "ms": ms} for batch, ms in m.decode_steps.ms_by_batch],
        },
        "hostToDeviceGBps": m.bandwidth.gbps,
        "derivation": {
            "gpu": f"from {gpu.source}",
            **w.derivation(),
            **m.kv.derivation,
            "activation.prefillBytesPerToken": m.prefill_activation.derivation,
            "activation.prefillChunkTokens": "set: min(--context-tokens, the prefill chunk every gpushare program uses)",
            "activation.decodeBytesPerSequence": m.decode_activation.derivation,
            "runtimeOverheadBytes": m.overhead.derivation,
            "latency.prefillMsPer1kTokens": m.prefill_latency.derivation,
            "latency.decodeMsPerToken": m.decode_steps.per_token.derivation,
            "latency.decodeStepMs": m.decode_steps.derivation(),
            **m.bandwidth.derivation,
        },
    }
    if weights != AUTO:
        doc["weights"]["dtype"] = weights
    if m.bandwidth.layer_copy_ms is not None:
        doc["layerCopyMs"] = m.bandwidth.layer_copy_ms
    if m.architecture is not None:
        doc["architecture"] = m.architecture
    validate_profile(doc)
    return doc


def _gpu(gpu: GpuIdentity) -> dict:
    doc: dict = {"product": gpu.product}
    for key, value in (("memoryBytes", gpu.memory_bytes), ("hbmGBps", gpu.hbm_gbps),
                       ("driverVersion", gpu.driver_version), ("cudaVersion", gpu.cuda_version)):
        if value is not None:
            doc[key] = value
    return doc


def validate_profile(doc: dict) -> None:
    errors = sorted(schemas.validator("profile").iter_errors(doc), key=lambda e: list(e.absolute_path))
    if errors:
        where = "; ".join(f"{'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in errors[:5])
        raise InvalidProfile(f"the profile does not validate against schemas/profile.schema.json ({where}); "
                             "this is a profiler bug, report it with the model id")
