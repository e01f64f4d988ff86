"""What a model costs on a GPU: need, the elastic slice, and predicted latencies.

Owns the arithmetic of DESIGN.md's decision rules for ONE model and ONE profile,
with no knowledge of other models or slots. Called by the planner (controller.planning.plan)
and by `gpushare explain`, which prints the same terms.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from controller.types import SLO, Predicted, Profile

GB = 1e9  # bandwidths are in GB/s = 1e9 bytes per second


@dataclass(frozen=True)
class Need:
    """need(m) = weights + KV cache + activation peak + runtime overhead."""

    weights: int
    kv_cache: int
    activation: int
    overhead: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.activation + self.overhead


@dataclass(frozen=True)
class ElasticSlice:
    """The bytes an elastic model keeps on the GPU: embeddings, head, norm, the first
    `resident_layers` decoder layers, two streaming buffers, KV cache, activations, overhead."""

    resident_layers: int
    total_layers: int
    footprint: int
    buffer_bytes: int
    streamed_bytes: int


def need(profile: Profile, slo: SLO) -> Need:
    kv = profile.kv_bytes_per_token * slo.context_tokens * slo.concurrency
    prefill_peak = profile.prefill_activation_bytes_per_token * min(slo.context_tokens, profile.prefill_chunk_tokens)
    decode_peak = profile.decode_activation_bytes_per_sequence * slo.concurrency
    return Need(
        weights=profile.weight_bytes,
        kv_cache=kv,
        activation=max(prefill_peak, decode_peak),
        overhead=profile.runtime_overhead_bytes,
    )


def elastic_slice_at(profile: Profile, slo: SLO, resident_layers: int) -> ElasticSlice:
    """The elastic footprint when the first `resident_layers` layers stay on the GPU."""
    layers = profile.layer_bytes
    streamed = layers[resident_layers:]
    buffers = 2 * max(streamed) if streamed else 0
    n = need(profile, slo)
    fixed = profile.embedding_bytes + profile.final_norm_bytes + profile.head_bytes
    footprint = fixed + sum(layers[:resident_layers]) + buffers + n.kv_cache + n.activation + n.overhead
    return ElasticSlice(resident_layers, len(layers), footprint, buffers, sum(streamed))


def largest_elastic_slice(profile: Profile, slo: SLO, limit: int) -> ElasticSlice | None:
    """The slice with the most resident layers (fewer than all) whose footprint fits `limit`,
    or None when even zero resident layers do not fit."""
    layers = profile.layer_bytes
    total = len(layers)
    n = need(profile, slo)
    fixed = profile.embedding_bytes + profile.final_norm_bytes + profile.head_bytes + n.kv_cache + n.activation + n.overhead
    prefix = [0] * (total + 1)
    for i, size in enumerate(layers):
        prefix[i + 1] = prefix[i] + size
    suffix_max = [0] * (total + 1)
    for i in range(total - 1, -1, -1):
        suffix_max[i] = max(layers[i], suffix_max[i + 1])
    for k in range(total - 1, -1, -1):
        footprint = fixed + prefix[k] + 2 * suffix_max[k]
        if footprint <= limit:
            return ElasticSlice(k, total, footprint, 2 * suffix_max[k], prefix[total] - prefix[k])
    return None


def copy_ms(nbytes: int, profile: Profile) -> float:
    """Host→device copy time for `nbytes` at the profile's pinned bandwidth."""
    return nbytes / (profile.host_to_device_gbps * GB) * 1000.0


def prefill_ms(profile: Profile, tokens: int) -> float:
    return profile.prefill_ms_per_1k_tokens * tokens / 1000.0


def predict_resident(profile: Profile, slo: SLO) -> Predicted:
    """TTFT for a prompt filling contextTokens, then one decode step; TPOT from the profile."""
    tpot = profile.decode_ms_per_token
    return Predicted(ttft_ms=_ms(prefill_ms(profile, slo.context_tokens) + tpot), tpot_ms=_ms(tpot))


def predict_swap(profile: Profile, slo: SLO) -> Predicted:
    """As resident, plus the swap-in (weights ÷ pinned host→device bandwidth) before the first token."""
    resident = predict_resident(profile, slo)
    swap_in = copy_ms(profile.weight_bytes, profile)
    return Predicted(ttft_ms=_ms(resident.ttft_ms + swap_in), tpot_ms=resident.tpot_ms, swap_in_ms=_ms(swap_in))


def predict_elastic(profile: Profile, slo: SLO, piece: ElasticSlice) -> Predicted:
    """TPOT ≥ max(compute, streamed bytes ÷ bandwidth); each prefill chunk streams every
    non-resident layer once, overlapped with that chunk's compute."""
    stream = copy_ms(piece.streamed_bytes, profile)
    tpot = max(profile.decode_ms_per_token, stream)
    chunks = math.ceil(slo.context_tokens / profile.prefill_chunk_tokens)
    chunk_compute = prefill_ms(profile, min(slo.context_tokens, profile.prefill_chunk_tokens))
    ttft = chunks * max(chunk_compute, stream) + tpot
    return Predicted(ttft_ms=_ms(ttft), tpot_ms=_ms(tpot))


def slo_misses(slo: SLO, predicted: Predicted) -> list[str]:
    """Each SLO target the prediction misses, with both numbers."""
    misses = []
    if slo.ttft_ms is not None and predicted.ttft_ms > slo.ttft_ms:
        misses.append(f"TTFT {predicted.ttft_ms:g} ms > {slo.ttft_ms:g} ms")
    if slo.tpot_ms is not None and predicted.tpot_ms > slo.tpot_ms:
        misses.append(f"TPOT {predicted.tpot_ms:g} ms > {slo.tpot_ms:g} ms")
    return misses


def _ms(value: float) -> float:
    return round(value, 3)
