"""A decaying histogram of byte usage, as the Vertical Pod Autoscaler keeps one per container.

Buckets grow geometrically (5 % apart from 1 MiB), so a percentile is exact to 5 %.
A value's weight doubles every half-life (new values count more than old ones, and
the histogram never needs rescanning); the reference time moves forward when weights
grow large. `percentile(q)` is the upper bound of the bucket where the cumulative weight
reaches q, so it never under-states usage. A `windowed` histogram also keeps what it was given,
so `forget_through(cutoff)` takes out exactly the values added at or before `cutoff` (the window
of controller.rightsizing.window slides so). Pure and deterministic. Called by the window and
the benches' VPA-style recommender.
"""
from __future__ import annotations

import math
from array import array

FIRST_BUCKET_BYTES = 1 << 20
RATIO = 1.05
_MAX_EXPONENT = 60.0


class DecayingHistogram:
    def __init__(self, half_life_s: float, windowed: bool = False):
        self.half_life_s = half_life_s
        self.windowed = windowed
        self._weights: dict[int, float] = {}
        self._reference: float | None = None
        self._times, self._buckets, self._head = array("d"), array("l"), 0  # what was added, when windowed
        self._counts: dict[int, int] = {}  # values kept per bucket
        self._cache: dict[float, int | None] = {}  # percentiles asked since the last change
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
        self._cache.clear()
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
        if self.windowed:
            self._times.append(at)
            self._buckets.append(b)
            self._counts[b] = self._counts.get(b, 0) + 1

    def forget_through(self, cutoff: float) -> None:
        """Take out every value added at or before `cutoff` (a windowed histogram; others keep everything)."""
        changed = False
        times, buckets = self._times, self._buckets
        while self._head < len(times) and times[self._head] <= cutoff:
            at, b = times[self._head], buckets[self._head]
            self._head += 1
            changed = True
            self._counts[b] -= 1
            if self._counts[b] == 0:
                del self._counts[b]
                self._weights.pop(b, None)
            elif b in self._weights:
                self._weights[b] = max(0.0, self._weights[b] - 2.0 ** ((at - self._reference) / self.half_life_s))
        if changed:
            if self._head > 64 and self._head * 2 > len(times):  # drop what was forgotten
                del times[:self._head], buckets[:self._head]
                self._head = 0
            self._cache.clear()
            self.total = sum(self._weights.values())

    def percentile(self, q: float) -> int | None:
        """Bytes at or below which a share q of the (decayed) weight lies; None when empty."""
        if q in self._cache:
            return self._cache[q]
        self._cache[q] = found = self._percentile(q)
        return found

    def _percentile(self, q: float) -> int | None:
        if self.total <= 0:
            return None
        need = q * self.total
        seen = 0.0
        for b in sorted(self._weights):
            seen += self._weights[b]
            if seen >= need * (1 - 1e-12):
                return self.upper_bound(b)
        return self.upper_bound(max(self._weights))
