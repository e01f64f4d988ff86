"""The KV-cache reservation the right-sizing loop recommends for one model. Pure.

The worker reserves a model's KV cache up front: kvBytesPerToken × contextTokens ×
concurrency (contract.footprint). The rule:

- wanted = the KV cache in use (the decaying histogram's PERCENTILE, never below the
  window's peak) × (1 + headroom);
- with an SLO, it promises `slo.concurrency` sequences of `slo.contextTokens`: the
  recommendation is whole sequences of that context, never fewer than the SLO's
  concurrency (so it can only grow);
- without an SLO nothing is promised (the defaults apply): the recommendation is whole
  sequences of the default context when more than one is wanted, otherwise one sequence
  whose context is the wanted tokens rounded up to a prefill chunk (at least one chunk,
  at most the context now): a shorter `slo.contextTokens`, which shrinks the reservation.

It is advisory: the worker's reservation follows `spec.slo`, which only the user edits.
Called by controller.rightsizing.step; its result travels in the record, the Recommend
commit message, PLAN.md and status.rightsizing.recommendation.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from contract.footprint import PREFILL_CHUNK_TOKENS

MAX_SEQUENCES = 1_000_000  # the most a record's kvReservation says (schemas/rightsizing-record.schema.json)


@dataclass(frozen=True)
class KvReservation:
    recommended_bytes: int
    sequences: int           # sequences the recommended reservation holds (slo.concurrency)
    context_tokens: int      # tokens of each (slo.contextTokens)
    reserved_bytes: int      # the reservation now (slo.contextTokens × slo.concurrency)
    reserved_context_tokens: int
    floor_bytes: int
    floor: str               # what the floor is, in words

    @property
    def change(self) -> str:
        """`grow`, `shrink` or `keep` against the reservation now."""
        if self.recommended_bytes > self.reserved_bytes:
            return "grow"
        return "shrink" if self.recommended_bytes < self.reserved_bytes else "keep"

    def as_dict(self) -> dict:
        """The record's `kvReservation`: whole sequences or chunks only, so a record changes when the advice does."""
        return {"recommendedBytes": self.recommended_bytes, "sequences": self.sequences,
                "contextTokens": self.context_tokens, "reservedBytes": self.reserved_bytes,
                "reservedContextTokens": self.reserved_context_tokens, "floorBytes": self.floor_bytes,
                "floor": self.floor, "change": self.change}


def recommend_kv(*, used_percentile_bytes: int | None, used_peak_bytes: int, headroom_percent: float,
                 kv_bytes_per_token: int, context_tokens: int, concurrency: int,
                 slo_concurrency: int | None) -> KvReservation | None:
    """The recommended reservation; None when a token's size is unknown (no profile). `concurrency` and
    `context_tokens` are the model's (the reservation now); `slo_concurrency` the SLO's, None without an SLO."""
    if kv_bytes_per_token <= 0 or context_tokens <= 0:
        return None
    per_sequence = kv_bytes_per_token * context_tokens
    wanted = max(used_percentile_bytes or 0, used_peak_bytes) * (1 + headroom_percent / 100)
    sequences, context = min(max(math.ceil(wanted / per_sequence), 1), MAX_SEQUENCES), context_tokens
    if slo_concurrency is not None:
        sequences = max(sequences, slo_concurrency)
        floor_tokens = slo_concurrency * context_tokens
        floor = (f"slo.concurrency {slo_concurrency} × slo.contextTokens {context_tokens}" if slo_concurrency > 1
                 else f"one full-context sequence (slo.contextTokens {context_tokens})")
    else:
        floor_tokens = min(PREFILL_CHUNK_TOKENS, context_tokens)
        floor = f"one prefill chunk ({floor_tokens} tokens): no SLO promises a context"
        if sequences == 1:
            chunks = max(math.ceil(wanted / kv_bytes_per_token / PREFILL_CHUNK_TOKENS), 1)
            context = min(chunks * PREFILL_CHUNK_TOKENS, context_tokens)
    return KvReservation(sequences * context * kv_bytes_per_token, sequences, context, concurrency * per_sequence,
                         context_tokens, floor_tokens * kv_bytes_per_token, floor)
