"""What a model costs on a GPU: need, the elastic slice, and predicted latencies.

Owns the planner's view of ONE model and ONE profile: the bytes come from the shared
footprint arithmetic (contract.footprint, the same the worker admits with); its elastic
slices, its batch-aware decode step, and its predicted TTFT/TPOT given what the planner
tells it about its slot (how many models share the host→device link, how long
co-tenants' steps take, how long a swap-in may wait). It knows nothing of other models
itself. Called by the planner (controller.planning.plan, controller.planning.plan_exact)
and by `gpushare explain`, which prints the same terms.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from contract.estimate import BATCH_STEP_GROWTH
from contract.footprint import Footprint, footprint, largest_elastic, prefill_chunk_tokens
from contract.swapturn import MIN_RESIDENCY_MS
from controller.types import SLO, Predicted, Profile

GB = 1e9  # bandwidths are in GB/s = 1e9 bytes per second
SWAP_DRAIN_TOKENS = 256  # a draining member finishes its running requests: at most this many more steps

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


def elastic_slices(profile: Profile, slo: SLO) -> list[ElasticSlice]:
    """Every elastic slice, by resident layers 0 .. total-1: elastic_slice_at for each (the planner computes
    them once per profile, context and concurrency)."""
    return [elastic_slice_at(profile, slo, k) for k in range(profile.total_layers)]


def smallest_slice_meeting(profile: Profile, slo: SLO, limit: int, streamers: int,
                           slices: list[ElasticSlice] | None = None) -> ElasticSlice | None:
    """The fewest resident layers whose streaming at its share of the link (1/streamers) meets slo.tpotMs
    (`streams_within`), or the elastic minimum without a TPOT target. None when no slice within `limit` meets
    the target at that share. `slices`: elastic_slices(), if the caller has them."""
    slices = slices or elastic_slices(profile, slo)
    if slices[0].footprint > limit:
        return None
    if slo.tpot_ms is None:
        return slices[0]
    for piece in slices:
        if streams_within(profile, slo, piece, streamers):
            return piece if piece.footprint <= limit else None
    return None


def streams_within(profile: Profile, slo: SLO, piece: ElasticSlice, streamers: int) -> bool:
    """The streaming term of its predicted TPOT (predict_elastic: its streamed bytes at 1/streamers of the link,
    as the prediction rounds it) is within slo.tpotMs; True without a target."""
    return slo.tpot_ms is None or _ms(copy_ms(piece.streamed_bytes, profile, streamers)) <= slo.tpot_ms


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
    ttft = elastic_prefill_ms(profile, slo, piece.streamed_bytes, stream) + tpot
    return Predicted(ttft_ms=_ms(ttft), tpot_ms=_ms(tpot), link_share_gbps=_sig(link_share_gbps(profile, streamers)))


def elastic_prefill_ms(profile: Profile, slo: SLO, streamed_bytes: int, stream_ms: float) -> float:
    """A prompt filling contextTokens, prefilled elastically: chunks of prefill_chunk_tokens (sized to the
    streaming floor, contract.footprint), each the longer of its compute and one stream (`stream_ms`)."""
    chunk = min(slo.context_tokens, prefill_chunk_tokens(profile.terms, streamed_bytes))
    return math.ceil(slo.context_tokens / chunk) * max(prefill_ms(profile, chunk), stream_ms)


def missed(slo: SLO, predicted: Predicted) -> tuple[str, ...]:
    """The targets ("ttft", "tpot") the prediction misses: the one test of a met SLO, for the verdict, the
    SLO limits and the planners' objective alike."""
    return tuple(name for name, target, value in (("ttft", slo.ttft_ms, predicted.ttft_ms),
                                                  ("tpot", slo.tpot_ms, predicted.tpot_ms))
                 if target is not None and value > target)


def slo_misses(slo: SLO, predicted: Predicted) -> list[str]:
    """Each SLO target the prediction misses, with both numbers."""
    values = {"ttft": (predicted.ttft_ms, slo.ttft_ms), "tpot": (predicted.tpot_ms, slo.tpot_ms)}
    return [f"{name.upper()} {values[name][0]:g} ms > {values[name][1]:g} ms" for name in missed(slo, predicted)]


def _ms(value: float) -> float:
    return round(value, 3)


def _sig(value: float) -> float:
    return float(f"{value:.6g}")
