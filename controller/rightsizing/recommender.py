"""The recommender: one model's usage series in, budget changes out. Pure and deterministic.

Rules (docs/guide.md, "Right-sizing"):
- Every sample with data feeds a decaying histogram of the model's device bytes
  (half-life HALF_LIFE_S, over the loop's usage window) and a sliding window of its peak over
  `downsizeAfter`.
- **Breaches**: KV in use at KV_NEAR_FRACTION of its reservation (`KvNearReservation`),
  queue wait above its threshold and not falling (`QueueWaitGrowing`; the threshold is
  the TTFT SLO, else 1 s), TTFT or TPOT over the SLO (`TtftOverSlo`, `TpotOverSlo`), a
  worker refusal (`WorkerRefusal`), an out-of-memory failure (`OutOfMemory`).
- **Upsize fast**: a breach held in consecutive samples for `upsizeAfter` (a refusal or an
  OOM at once, unless the last change is younger than `upsizeAfter`) raises the budget to the largest of budget x (1 + headroom), the window's
  peak x (1 + headroom) and budget + the missing bytes a refusal reported x (1 + headroom).
- **Downsize slow**: headroom covers what varies. With KV in use reported, the target is
  the window's peak of the rest (device bytes minus KV in use: weights, buffers, activations,
  unused reservations) plus the KV in use (its histogram's PERCENTILE, never below its
  window peak) plus headroom on that KV; without it, the device bytes' PERCENTILE, never
  below their window peak, plus headroom. Never below the window's peak of device bytes.
  When it frees at least DOWNSIZE_MARGIN of the budget
  in every sample for `downsizeAfter`, no sooner than `downsizeAfter` after the series
  began and `cooldown` after the last change, the budget goes down to it.
- A breach in a sample whose `budgetBytes` (the budget the worker runs with) is below the
  budget the loop set is not acted on: that upsize has not reached the worker yet.
- Samples at or before `last_change_at` (a change an earlier pass made) feed the histogram
  and the peak but trigger nothing: they already acted.
- **Act on what helps**: memory breaches (KvNearReservation, WorkerRefusal, OutOfMemory) upsize.
  Latency breaches alone (TTFT, TPOT, queue wait) upsize only where `Limits.latency_helps` (the
  planner predicts more bytes lower the latency: controller.rightsizing.bounds); otherwise they
  hold with MemoryWontHelp, saying why and what would help.
- **Bounds** (controller.rightsizing.bounds.Limits): every budget is rounded up to a MiB, clamped
  to [minBudget, maxBudget], never below the window's peak plus headroom nor the floor (the
  elastic minimum), never above the ceiling (the largest usable GPU of the product, maxBudget,
  int64); a floor above the ceiling holds (WouldBeRefused). Whatever a sample says (inputs are
  finite and within the usage format's limits; anything else is capped at the ceiling).
- **At most MAX_CHANGES_PER_DAY changes** in any 24 h (counting `recent_changes` an earlier
  pass made): one more holds (ChangeCapReached) until the oldest leaves the day.
- **Missing data holds**: a sample without device bytes, or a gap longer than
  GAP_INTERVALS scrape intervals, changes nothing and restarts both the breach and the
  quiet run; `Hold` says so once per outage (the UsageMissing condition).
Called by `replay` (the CLI, the bench, the controller's pass).
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Iterable, Literal

from .bounds import MEMORY_BREACHES, MIB, Limits
from .histogram import DecayingHistogram
from controller.policy import DOWNSIZE_MARGIN, HALF_LIFE_S, KV_NEAR_FRACTION, MAX_CHANGES_PER_DAY, PERCENTILE, Rightsizing
from .usage import Sample

DAY_S = 86400
GAP_INTERVALS = 2.5
QUEUE_WAIT_THRESHOLD_S = 1.0
IMMEDIATE = frozenset({"WorkerRefusal", "OutOfMemory"})


@dataclass(frozen=True)
class Slo:
    ttft_ms: float | None = None
    tpot_ms: float | None = None


@dataclass(frozen=True)
class Evidence:
    """What a change was computed from; printed in commit messages and decision records."""

    percentile: float
    percentile_bytes: int | None
    peak_bytes: int
    window_s: float
    half_life_s: float
    headroom_percent: float
    samples: int
    breaches: tuple[str, ...] = ()
    breach_since: float | None = None
    kv_used_p99_bytes: int | None = None
    kv_reserved_bytes: int | None = None
    kv_used_peak_bytes: int | None = None

    def as_dict(self) -> dict:
        out = {"percentile": self.percentile, "percentileBytes": self.percentile_bytes,
               "peakBytes": self.peak_bytes, "windowSeconds": round(self.window_s), "halfLifeSeconds": self.half_life_s,
               "headroomPercent": self.headroom_percent, "samples": self.samples, "breaches": list(self.breaches)}
        if self.breach_since is not None:
            out["breachSinceUnix"] = round(self.breach_since, 3)
        if self.kv_used_peak_bytes is not None:
            out.update(kvUsedP99Bytes=self.kv_used_p99_bytes, kvUsedPeakBytes=self.kv_used_peak_bytes)
        if self.kv_reserved_bytes is not None:
            out["kvReservedBytes"] = self.kv_reserved_bytes
        return out


@dataclass(frozen=True)
class Change:
    at: float
    model: str
    direction: Literal["up", "down"]
    from_bytes: int
    to_bytes: int
    reason: str
    evidence: Evidence


@dataclass(frozen=True)
class Hold:
    """No change: `reason` UsageMissing (no data), AtMaxBudget (a breach, nothing left to grant), MemoryWontHelp
    (a latency breach more bytes would not fix), WouldBeRefused (the bounds cross) or ChangeCapReached."""

    at: float
    model: str
    reason: str
    message: str


Event = Change | Hold


def _mib_ceil(nbytes: float) -> int:
    return math.ceil(nbytes / MIB) * MIB


class _WindowMax:
    """Max of (time, value) over the last `span` seconds, amortised O(1)."""

    def __init__(self, span: float):
        self.span = span
        self._items: deque[tuple[float, int]] = deque()

    def add(self, at: float, value: int) -> None:
        while self._items and self._items[-1][1] <= value:
            self._items.pop()
        self._items.append((at, value))
        while self._items[0][0] < at - self.span:
            self._items.popleft()

    @property
    def value(self) -> int:
        return self._items[0][1] if self._items else 0

    def clear(self) -> None:
        self._items.clear()


class Recommender:
    """The loop's state for one model; `observe` is the transition, fed samples in time order."""

    def __init__(self, model: str, budget_bytes: int, policy: Rightsizing, slo: Slo = Slo(),
                 last_change_at: float | None = None, limits: Limits = Limits(),
                 recent_changes: Iterable[float] = (), window_s: float | None = None):
        self.model, self.budget, self.policy, self.slo = model, budget_bytes, policy, slo
        self.limits = limits.within(policy)
        self.recent = deque(sorted(recent_changes))  # change times within the last day (the cap)
        self.histogram = DecayingHistogram(HALF_LIFE_S, window_s)
        self.kv_histogram = DecayingHistogram(HALF_LIFE_S, window_s)
        self.peak = _WindowMax(policy.downsize_after_s)
        self.fixed_peak = _WindowMax(policy.downsize_after_s)
        self.kv_peak = _WindowMax(policy.downsize_after_s)
        self.kv_seen = False
        self.last_change_at = last_change_at
        self.first_at: float | None = None
        self.last_at: float | None = None
        self.interval: float | None = None
        self.breach_since: float | None = None
        self.quiet_since: float | None = None
        self.holding: str | None = None
        self.samples = 0
        self._last_queue_wait: float | None = None
        self._kv_reserved: int | None = None

    @property
    def headroom(self) -> float:
        return 1 + self.policy.headroom_percent / 100

    def observe(self, s: Sample) -> list[Event]:
        crossed = self.limits.crossed
        if crossed is not None:
            return self._hold(s.time, "WouldBeRefused", crossed)
        gap = self._gap(s.time)
        self.last_at = s.time
        if s.missing or gap:
            return self._hold(s.time, "UsageMissing", "no usage sample" if s.missing else
                              f"no usage for {gap:.0f}s (more than {GAP_INTERVALS} scrape intervals)")
        if self.first_at is None:
            self.first_at = s.time
        if self.holding == "UsageMissing":
            self.holding = None
        self.samples += 1
        self.histogram.add(s.device_bytes, s.time)
        self.peak.add(s.time, s.device_bytes)
        kv_used = min(s.kv_used_bytes or 0, s.device_bytes)
        self.kv_seen = self.kv_seen or s.kv_used_bytes is not None
        self.kv_histogram.add(kv_used, s.time)
        self.kv_peak.add(s.time, kv_used)
        self.fixed_peak.add(s.time, s.device_bytes - kv_used)
        if s.kv_reserved_bytes is not None:
            self._kv_reserved = s.kv_reserved_bytes
        breaches = self.breaches(s)
        self._last_queue_wait = s.queue_wait_s
        if self.last_change_at is not None and s.time <= self.last_change_at:
            return []  # history before the last change: it informs the target, it already acted
        if breaches and s.budget_bytes is not None and s.budget_bytes < self.budget:
            self.breach_since = None  # the worker still runs the old, smaller budget: the upsize is on its way
            return []
        if breaches:
            return self._on_breach(s, breaches)
        self.breach_since = None
        return self._on_quiet(s)

    def breaches(self, s: Sample) -> tuple[str, ...]:
        found = []
        if s.kv_used_bytes is not None and s.kv_reserved_bytes and s.kv_used_bytes >= KV_NEAR_FRACTION * s.kv_reserved_bytes:
            found.append("KvNearReservation")
        threshold = self.slo.ttft_ms / 1000 if self.slo.ttft_ms else QUEUE_WAIT_THRESHOLD_S
        if s.queue_wait_s is not None and s.queue_wait_s > threshold and (
                self._last_queue_wait is None or s.queue_wait_s >= self._last_queue_wait):
            found.append("QueueWaitGrowing")
        if self.slo.ttft_ms and s.ttft_s is not None and s.ttft_s * 1000 > self.slo.ttft_ms:
            found.append("TtftOverSlo")
        if self.slo.tpot_ms and s.tpot_s is not None and s.tpot_s * 1000 > self.slo.tpot_ms:
            found.append("TpotOverSlo")
        if s.refusals:
            found.append("WorkerRefusal")
        if s.ooms:
            found.append("OutOfMemory")
        return tuple(found)

    def evidence(self, breaches: tuple[str, ...] = ()) -> Evidence:
        kv_p99 = self.kv_histogram.percentile(PERCENTILE) if self.kv_seen else None
        return Evidence(PERCENTILE, self.histogram.percentile(PERCENTILE), self.peak.value,
                        (self.last_at or 0) - (self.first_at or 0), HALF_LIFE_S, self.policy.headroom_percent,
                        self.samples, breaches, self.breach_since if breaches else None,
                        kv_p99, self._kv_reserved, self.kv_peak.value if self.kv_seen else None)

    def downsize_target(self) -> int:
        if self.kv_seen:
            kv = max(self.kv_histogram.percentile(PERCENTILE) or 0, self.kv_peak.value)
            wanted = self.fixed_peak.value + kv * self.headroom
        else:
            wanted = (self.histogram.percentile(PERCENTILE) or 0) * self.headroom
        return self.bounded(max(wanted, self.peak.value * self.headroom))

    def upsize_target(self, missing_bytes: int) -> int:
        wanted = max(self.budget * self.headroom, self.peak.value * self.headroom,
                     self.budget + missing_bytes * self.headroom)
        return self.bounded(wanted)

    def bounded(self, wanted: float) -> int:
        """`wanted` as a budget: whole MiB, within [minBudget, maxBudget] and the Limits, an int64 whatever came in."""
        ceiling = self.limits.ceiling
        if not wanted <= ceiling:  # NaN, inf, beyond the ceiling
            wanted = ceiling
        return max(self.limits.floor, min(_mib_ceil(max(wanted, 0)), ceiling))

    # transitions
    def _gap(self, at: float) -> float | None:
        if self.last_at is None:
            return None
        step = at - self.last_at
        if step > 0:
            if self.interval is not None and step > GAP_INTERVALS * self.interval:
                return step
            self.interval = step if self.interval is None else min(self.interval, step)
        return None

    def _hold(self, at: float, reason: str, message: str) -> list[Event]:
        self.breach_since = self.quiet_since = None
        if self.holding == reason:
            return []
        self.holding = reason
        return [Hold(at, self.model, reason, message)]

    def _on_breach(self, s: Sample, breaches: tuple[str, ...]) -> list[Event]:
        self.quiet_since = None
        if self.breach_since is None:
            self.breach_since = s.time
        settled = self.last_change_at is None or s.time - self.last_change_at >= self.policy.upsize_after_s
        sustained = (bool(IMMEDIATE & set(breaches)) and settled) or s.time - self.breach_since >= self.policy.upsize_after_s
        if not sustained:
            return []
        if not MEMORY_BREACHES & set(breaches) and not self.limits.latency_helps:
            return self._hold(s.time, "MemoryWontHelp", f"{', '.join(breaches)}, but {self.limits.latency_why}; "
                              "the budget is left alone")
        target = self.upsize_target(s.missing_bytes or 0)
        if target <= self.budget:
            return self._hold(s.time, "AtMaxBudget", f"{', '.join(breaches)} but the budget is at its ceiling, "
                              f"{self.limits.ceiling_why}")
        return self._change(s.time, "up", target, breaches[0], breaches)

    def _on_quiet(self, s: Sample) -> list[Event]:
        self.holding = None
        target = self.downsize_target()
        if target > self.budget * (1 - DOWNSIZE_MARGIN):
            self.quiet_since = None
            return []
        if self.quiet_since is None:
            self.quiet_since = s.time
        waited = s.time - self.quiet_since >= self.policy.downsize_after_s
        observed = s.time - self.first_at >= self.policy.downsize_after_s
        cooled = self.last_change_at is None or s.time - self.last_change_at >= self.policy.cooldown_s
        if waited and observed and cooled:
            return self._change(s.time, "down", target, "BelowTarget", ())
        return []

    def _change(self, at: float, direction, target: int, reason: str, breaches: tuple[str, ...]) -> list[Event]:
        while self.recent and self.recent[0] <= at - DAY_S:
            self.recent.popleft()
        if len(self.recent) >= MAX_CHANGES_PER_DAY:
            return self._hold(at, "ChangeCapReached", f"{MAX_CHANGES_PER_DAY} changes in the last 24 h, the most "
                              f"a model gets; the next is possible after {self.recent[0] + DAY_S:.0f} (Unix s)")
        change = Change(at, self.model, direction, self.budget, target, reason, self.evidence(breaches))
        self.budget, self.last_change_at = target, at
        self.recent.append(at)
        self.breach_since = self.quiet_since = None
        self.holding = None
        return [change]


def replay(samples: Iterable[Sample], model: str, budget_bytes: int, policy: Rightsizing, slo: Slo = Slo(),
           last_change_at: float | None = None, limits: Limits = Limits(),
           recent_changes: Iterable[float] = (), window_s: float | None = None) -> tuple[list[Event], Recommender]:
    """The events the loop takes over one model's samples (in time order), and its final state. `window_s`: the
    loop's usage window; the percentiles then forget what is older, so a replay of days decides as the loop's
    passes do (each reads one window)."""
    loop = Recommender(model, budget_bytes, policy, slo, last_change_at, limits, recent_changes, window_s)
    events: list[Event] = []
    for s in samples:
        events += loop.observe(s)
    return events, loop
