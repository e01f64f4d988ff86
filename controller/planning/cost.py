"""What a model costs on a GPU: need, the elastic slice, and predicted latencies.

Owns the arithmetic of the decision rules for ONE model and ONE profile: what it
needs, its elastic slices, its batch-aware decode step, and its predicted TTFT/TPOT
given what the planner tells it about its slot (how many models share the host→device
link, how long co-tenants' steps take, how long a swap-in may wait). It knows nothing
of other models itself. Called by the planner (controller.planning.plan, controller.planning.plan_exact)
and by `gpushare explain`, which prints the same terms.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from contract.estimate import BATCH_STEP_GROWTH
from controller.types import SLO, Predicted, Profile

GB = 1e9  # bandwidths are in GB/s = 1e9 bytes per second
MIN_RESIDENCY_MS = 2000  # the worker's default minResidencyMs: a swapped-in model stays at least this long
SWAP_DRAIN_TOKENS = 256  # a draining member finishes its running requests: at most this many more steps


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


def elastic_slices(profile: Profile, slo: SLO) -> list[ElasticSlice]:
    """Every elastic slice, by resident layers 0 .. total-1 (what elastic_slice_at gives for each), in O(layers)."""
    layers = profile.layer_bytes
    total = len(layers)
    n = need(profile, slo)
    fixed = profile.embedding_bytes + profile.final_norm_bytes + profile.head_bytes + n.kv_cache + n.activation + n.overhead
    suffix_max = [0] * (total + 1)
    for i in range(total - 1, -1, -1):
        suffix_max[i] = max(layers[i], suffix_max[i + 1])
    out, resident, streamed = [], 0, sum(layers)
    for k in range(total):
        out.append(ElasticSlice(k, total, fixed + resident + 2 * suffix_max[k], 2 * suffix_max[k], streamed))
        resident += layers[k]
        streamed -= layers[k]
    return out


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


def smallest_slice_meeting(profile: Profile, slo: SLO, limit: int, streamers: int,
                           slices: list[ElasticSlice] | None = None) -> ElasticSlice | None:
    """The elastic slice an elastic model starts at: the fewest resident layers whose streaming at its share
    of the link (1/streamers) meets slo.tpotMs, or the elastic minimum without a TPOT target. None when no
    slice within `limit` meets the target at that share. `slices`: elastic_slices(), if the caller has them."""
    slices = slices or elastic_slices(profile, slo)
    if slices[0].footprint > limit:
        return None
    if slo.tpot_ms is None:
        return slices[0]
    allowed = slo.tpot_ms * 1e-3 * link_share_gbps(profile, streamers) * GB  # bytes it may stream per token
    for piece in slices:
        if piece.streamed_bytes <= allowed:
            return piece if piece.footprint <= limit else None
    return None


def copy_ms(nbytes: int, profile: Profile, streamers: int = 1) -> float:
    """Host→device copy time for `nbytes` at this model's share of the pinned link (1/streamers of it)."""
    return nbytes / (link_share_gbps(profile, streamers) * GB) * 1000.0


def link_share_gbps(profile: Profile, streamers: int) -> float:
    """The host→device bandwidth one of `streamers` models that stream concurrently on one GPU gets."""
    return profile.host_to_device_gbps / max(1, streamers)


def prefill_ms(profile: Profile, tokens: int) -> float:
    return profile.prefill_ms_per_1k_tokens * tokens / 1000.0


def decode_step_ms(profile: Profile, batch: int) -> float:
    """One decode step of `batch` sequences (each gets one token): the profile's measured steps
    (latency.decodeStepMs) interpolated linearly, extrapolated along the last two points; without
    them, the batch-1 time grown by BATCH_STEP_GROWTH per extra sequence (contract.estimate)."""
    points = dict(profile.decode_step_ms)
    points.setdefault(1, profile.decode_ms_per_token)
    batches = sorted(points)
    if len(batches) == 1:
        return profile.decode_ms_per_token * (1 + BATCH_STEP_GROWTH * (batch - 1))
    i = max(0, min(bisect.bisect_right(batches, batch) - 1, len(batches) - 2))
    lo, hi = batches[i], batches[i + 1]
    slope = (points[hi] - points[lo]) / (hi - lo)
    return max(points[lo] + slope * (batch - lo), min(points.values()))


def swap_turn_ms(profile: Profile, slo: SLO, streamers: int = 1) -> float:
    """How long one member of a swap group can hold the GPU while another waits: its swap-in, its
    minimum residency, then draining its running requests (SWAP_DRAIN_TOKENS steps at its concurrency)."""
    return (copy_ms(profile.weight_bytes, profile, streamers) + MIN_RESIDENCY_MS
            + SWAP_DRAIN_TOKENS * decode_step_ms(profile, slo.concurrency))


def predict_resident(profile: Profile, slo: SLO, shared_ms: float = 0.0) -> Predicted:
    """TPOT: one decode step at the model's concurrency plus `shared_ms`, the co-tenants' steps that share
    the GPU's time when all of them decode at once. TTFT: a prompt filling contextTokens, then one token."""
    tpot = decode_step_ms(profile, slo.concurrency) + shared_ms
    return Predicted(ttft_ms=_ms(prefill_ms(profile, slo.context_tokens) + tpot), tpot_ms=_ms(tpot))


def predict_swap(profile: Profile, slo: SLO, wait_ms: float = 0.0, shared_ms: float = 0.0,
                 streamers: int = 1) -> Predicted:
    """As resident, plus the worst wait before the first token: `wait_ms` (the other members' turns,
    swap_turn_ms each) and its own swap-in at its share of the link."""
    resident = predict_resident(profile, slo, shared_ms)
    swap_in = copy_ms(profile.weight_bytes, profile, streamers)
    return Predicted(ttft_ms=_ms(resident.ttft_ms + wait_ms + swap_in), tpot_ms=resident.tpot_ms,
                     swap_in_ms=_ms(swap_in), link_share_gbps=_sig(link_share_gbps(profile, streamers)))


def predict_elastic(profile: Profile, slo: SLO, piece: ElasticSlice, streamers: int = 1,
                    shared_ms: float = 0.0) -> Predicted:
    """TPOT = max(step at its concurrency + co-tenants' steps, streamed bytes ÷ its share of the link):
    one pass of the streamed layers serves the whole batch. Each prefill chunk streams every
    non-resident layer once, overlapped with that chunk's compute."""
    stream = copy_ms(piece.streamed_bytes, profile, streamers)
    tpot = max(decode_step_ms(profile, slo.concurrency) + shared_ms, stream)
    chunks = math.ceil(slo.context_tokens / profile.prefill_chunk_tokens)
    chunk_compute = prefill_ms(profile, min(slo.context_tokens, profile.prefill_chunk_tokens))
    ttft = chunks * max(chunk_compute, stream) + tpot
    return Predicted(ttft_ms=_ms(ttft), tpot_ms=_ms(tpot), link_share_gbps=_sig(link_share_gbps(profile, streamers)))


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


def _sig(value: float) -> float:
    return float(f"{value:.6g}")
