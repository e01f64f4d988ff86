"""A decaying histogram of byte usage, as the Vertical Pod Autoscaler keeps one per container.

Buckets grow geometrically (5 % apart from 1 MiB), so a percentile is exact to 5 %.
A sample's weight doubles every half-life (new samples count more than old ones, and
the histogram never needs rescanning); the reference time moves forward when weights
grow large. `percentile(q)` is the upper bound of the bucket where the cumulative weight
reaches q, so it never under-states usage. With `window_s` it also forgets every sample older
than that window behind the newest, so a replay of any length decides exactly as the loop's
passes do over their window. Pure and deterministic. Called by the recommender.
"""
from __future__ import annotations

import math
from collections import deque

FIRST_BUCKET_BYTES = 1 << 20
RATIO = 1.05
_MAX_EXPONENT = 60.0


class DecayingHistogram:
    def __init__(self, half_life_s: float, window_s: float | None = None):
        self.half_life_s = half_life_s
        self.window_s = window_s
        self._weights: dict[int, float] = {}
        self._reference: float | None = None
        self._kept: deque[tuple[float, int]] = deque()  # (time, bucket) within the window, when there is one
        self._counts: dict[int, int] = {}  # samples kept per bucket
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
        if self.window_s is not None:
            self._kept.append((at, b))
            self._counts[b] = self._counts.get(b, 0) + 1
            self._forget_before(at - self.window_s)

    def _forget_before(self, cutoff: float) -> None:
        while self._kept and self._kept[0][0] < cutoff:
            at, b = self._kept.popleft()
            self._counts[b] -= 1
            if self._counts[b] == 0:
                del self._counts[b]
                self._weights.pop(b, None)
            elif b in self._weights:
                self._weights[b] = max(0.0, self._weights[b] - 2.0 ** ((at - self._reference) / self.half_life_s))
            self.total = sum(self._weights.values())

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
