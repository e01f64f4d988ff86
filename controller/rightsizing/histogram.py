"""A decaying histogram of byte usage, as the Vertical Pod Autoscaler keeps one per container.

Buckets grow geometrically (5 % apart from 1 MiB), so a percentile is exact to 5 %.
A sample's weight doubles every half-life (new samples count more than old ones, and
the histogram never needs rescanning); the reference time moves forward when weights
grow large. `percentile(q)` is the upper bound of the bucket where the cumulative weight
reaches q, so it never under-states usage. Pure and deterministic. Called by the recommender.
"""
from __future__ import annotations

import math

FIRST_BUCKET_BYTES = 1 << 20
RATIO = 1.05
_MAX_EXPONENT = 60.0


class DecayingHistogram:
    def __init__(self, half_life_s: float):
        self.half_life_s = half_life_s
        self._weights: dict[int, float] = {}
        self._reference: float | None = None
        self.total = 0.0

    @staticmethod
    def bucket(nbytes: int) -> int:
        if nbytes <= FIRST_BUCKET_BYTES:
            return 0
        return math.ceil(math.log(nbytes / FIRST_BUCKET_BYTES, RATIO) - 1e-12)

    @staticmethod
    def upper_bound(bucket: int) -> int:
        return math.ceil(FIRST_BUCKET_BYTES * RATIO ** bucket)

    def add(self, nbytes: int, at: float) -> None:
        if self._reference is None:
            self._reference = at
        exponent = (at - self._reference) / self.half_life_s
        if exponent > _MAX_EXPONENT:
            scale = 2.0 ** -exponent
            self._weights = {b: w * scale for b, w in self._weights.items() if w * scale > 1e-12}
            self.total = sum(self._weights.values())
            self._reference, exponent = at, 0.0
        weight = 2.0 ** exponent
        b = self.bucket(nbytes)
        self._weights[b] = self._weights.get(b, 0.0) + weight
        self.total += weight

    def percentile(self, q: float) -> int | None:
        """Bytes at or below which a share q of the (decayed) weight lies; None when empty."""
        if self.total <= 0:
            return None
        need = q * self.total
        seen = 0.0
        for b in sorted(self._weights):
            seen += self._weights[b]
            if seen >= need * (1 - 1e-12):
                return self.upper_bound(b)
        return self.upper_bound(max(self._weights))
