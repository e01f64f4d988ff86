"""The KV-cache reservation the right-sizing loop recommends for one model. Pure.

The worker reserves a model's KV cache up front: kvBytesPerToken × contextTokens ×
concurrency (contract.footprint), a whole number of full-context sequences. The rule:

- wanted = the KV cache in use (the decaying histogram's PERCENTILE, never below the
  window's peak) × (1 + headroom), rounded up to whole sequences of contextTokens;
- never below one full-context sequence;
- never below what the SLO promises: `slo.concurrency` sequences when the SLO declares
  it (a reservation shrinks only where the SLO allows it).

An undeclared concurrency is 1, so today the floor equals the reservation and the
recommendation only ever grows it (KV in use with headroom above the reservation). It is
advisory: the worker's reservation follows `spec.slo.concurrency`, which only the user
edits. Called by controller.rightsizing.step; its result travels in the record, the
Recommend commit message and PLAN.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class KvReservation:
    recommended_bytes: int
    sequences: int           # full-context sequences the recommended reservation holds
    context_tokens: int
    reserved_bytes: int      # the reservation now (slo.contextTokens × slo.concurrency)
    floor_bytes: int
    floor: str               # what the floor is: one sequence, or the SLO's concurrency

    @property
    def change(self) -> str:
        """`grow`, `shrink` or `keep` against the reservation now."""
        if self.recommended_bytes > self.reserved_bytes:
            return "grow"
        return "shrink" if self.recommended_bytes < self.reserved_bytes else "keep"

    def as_dict(self) -> dict:
        """The record's `kvReservation`: whole sequences only, so a record changes when the advice does."""
        return {"recommendedBytes": self.recommended_bytes, "sequences": self.sequences,
                "contextTokens": self.context_tokens, "reservedBytes": self.reserved_bytes,
                "floorBytes": self.floor_bytes, "floor": self.floor, "change": self.change}


def recommend_kv(*, used_percentile_bytes: int | None, used_peak_bytes: int, headroom_percent: float,
                 kv_bytes_per_token: int, context_tokens: int, concurrency: int,
                 slo_concurrency: int | None) -> KvReservation | None:
    """The recommended reservation; None when a sequence's size is unknown (no profile). `concurrency` is the
    model's planned concurrency (the reservation now); `slo_concurrency` the SLO's, None when it declares none."""
    per_sequence = kv_bytes_per_token * context_tokens
    if per_sequence <= 0:
        return None
    used = max(used_percentile_bytes or 0, used_peak_bytes)
    wanted = math.ceil(used * (1 + headroom_percent / 100) / per_sequence)
    if slo_concurrency is not None and slo_concurrency > 1:
        floor_sequences, floor = slo_concurrency, (f"slo.concurrency {slo_concurrency} × slo.contextTokens "
                                                   f"{context_tokens}")
    else:
        floor_sequences, floor = 1, f"one full-context sequence ({context_tokens} tokens)"
    sequences = max(wanted, floor_sequences)
    return KvReservation(sequences * per_sequence, sequences, context_tokens, concurrency * per_sequence,
                         floor_sequences * per_sequence, floor)
