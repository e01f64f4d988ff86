"""What a model costs on a GPU: need, the elastic slice, and predicted latencies.

Owns the planner's view of ONE model and ONE profile, with no knowledge of other
models or slots: the bytes come from the shared footprint arithmetic
(contract.footprint, the same the worker admits with), the latencies from the
profile. Called by the planner (controller.planning.plan)
and by `gpushare explain`, which prints the same terms.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from contract.footprint import PREFILL_CHUNK_TOKENS, Footprint, footprint, largest_elastic
from controller.types import SLO, Predicted, Profile

GB = 1e9  # bandwidths are in GB/s = 1e9 bytes per second

Need = Footprint  # a model's footprint with every layer on the device


@dataclass(frozen=True)
class ElasticSlice:
    """An elastic footprint as the planner places it: `footprint` bytes on the GPU with `resident_layers`
    decoder layers kept; `buffer_bytes` of streaming buffers; `streamed_bytes` copied per pass."""

    resident_layers: int
    total_layers: int
    footprint: int
    buffer_bytes: int
    streamed_bytes: int

    @classmethod
    def of(cls, f: Footprint) -> ElasticSlice:
        return cls(f.resident_layers, f.total_layers, f.total, f.buffers, f.streamed_bytes)


def need(profile: Profile, slo: SLO) -> Need:
    """need(m) = weights + KV cache + activation peak + runtime overhead (contract.footprint)."""
    return footprint(profile.terms, slo.context_tokens, slo.concurrency)


def elastic_slice_at(profile: Profile, slo: SLO, resident_layers: int) -> ElasticSlice:
    """The elastic footprint when the first `resident_layers` layers stay on the GPU."""
    return ElasticSlice.of(footprint(profile.terms, slo.context_tokens, slo.concurrency, resident_layers))


def largest_elastic_slice(profile: Profile, slo: SLO, limit: int) -> ElasticSlice | None:
    """The slice with the most resident layers (fewer than all) whose footprint fits `limit`,
    or None when even zero resident layers do not fit."""
    found = largest_elastic(profile.terms, slo.context_tokens, slo.concurrency, limit)
    return None if found is None else ElasticSlice.of(found)


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
    chunks = math.ceil(slo.context_tokens / PREFILL_CHUNK_TOKENS)
    chunk_compute = prefill_ms(profile, min(slo.context_tokens, PREFILL_CHUNK_TOKENS))
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
