"""The recommender: one model's usage in, budget changes out. Pure and deterministic.

What it decides on: the window (controller.rightsizing.window: one peak per slot, their decaying
histograms, the peaks over `downsizeAfter`, where usage is missing) and the grid samples, in time
order. A pass of the installed loop reads the older part of its window as slot peaks (samples at or
before `history_until`, which feed the window only) and the rest on the grid; a replay reads a file's
samples on their grid. What carries from one pass to the next is what the records hold: the budget,
the last change (`last_change_at`) and the changes of the last day (`recent_changes`). Everything
else is recomputed, and a pass acts only on grid samples from `acts_after` (where its window ends
being only judged against: `history_until`, or a whole window into a read on the grid) + upsizeAfter +
one step on (`act_from`: by then a breach's clock reads what a replay's would), so `replay` over a
series decides what the loop, pass by pass over the same samples, decides
(tests/test_rightsizing_one_rule.py).

Rules (docs/guide.md, "Right-sizing"):
- **Breaches**, on grid samples only: KV in use at KV_NEAR_FRACTION of its reservation
  (`KvNearReservation`), queue wait above its threshold and not falling (`QueueWaitGrowing`; the
  threshold is the TTFT SLO, else 1 s), TTFT or TPOT over the SLO (`TtftOverSlo`, `TpotOverSlo`), a
  worker refusal (`WorkerRefusal`), an out-of-memory failure (`OutOfMemory`). More than GAP_INTERVALS
  grid steps without usage ends a breach (and holds once, UsageMissing).
- **Act only where memory helps** (controller.rightsizing.bounds.Limits.relief: the planner's own
  arithmetic): an OOM, and a refusal while the budget is below what the model's mode needs, upsize; a
  latency breach upsizes only where more bytes lower the predicted latency, and never past the budget
  at which every layer is resident. KV pressure against its fixed reservation, a refusal within the
  budget and latency that memory cannot move hold instead (MemoryWontHelp, with what would help).
- **Upsize fast**: a breach memory relieves, held for `upsizeAfter` (a refusal or an OOM at once, unless
  the last change is younger than `upsizeAfter`; a breach it cannot relieve never starts that clock, and
  holds after `upsizeAfter` of its own) raises the budget to the largest of budget x (1 + headroom),
  the peak x (1 + headroom) and budget + the missing bytes a refusal reported x (1 + headroom). A
  breach in a sample whose `budgetBytes` is below the loop's budget waits for that budget to arrive.
- **Downsize to the target, sooner the further it is**: the target is the peak over `downsizeAfter`
  of what does not vary plus the KV cache in use (its histogram's PERCENTILE over the window, never
  below its peak) plus headroom on that KV; without KV in use, the device bytes' PERCENTILE plus
  headroom; never below the peak of device bytes over `downsizeAfter` plus headroom. The budget goes
  down to it when it frees a share of at least MIN_DOWNSIZE_SHARE of the budget, and with
  f = max(1, DOWNSIZE_MARGIN / share) (a step of 10 % or more: 1; of 5 %: 2), usage has been there
  in every slot for `downsizeAfter` x f (at most the window; a hole within `downsizeAfter` holds it,
  UsageMissing) and the last change is at least `cooldown` x f old. No clock restarts at a change:
  the target already holds the last `downsizeAfter`, so a steady decline is followed a cooldown or
  two behind.
- **Bounds** (controller.rightsizing.bounds.Limits): every budget is whole MiB within [floor,
  ceiling]; a floor above the ceiling holds (WouldBeRefused). A limit never takes the budget below
  the peak plus headroom: a downsize the ceiling would cut below it holds (AtMaxBudget,
  MaxBudgetBelowUsage) instead.
- **At most MAX_CHANGES_PER_DAY changes** in any 24 h: one more holds (ChangeCapReached).
Called by `replay` (the CLI, the benches, the controller's pass: controller.rightsizing.step).
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Iterable, Literal, Sequence

from contract.quantity import format_bytes, paste_quantity

from .bounds import INT64_MAX_MIB, MIB, Limits
from controller.policy import (DEFAULT_WINDOW_S, DOWNSIZE_MARGIN, HALF_LIFE_S, KV_NEAR_FRACTION, MAX_CHANGES_PER_DAY,
                               MIN_DOWNSIZE_SHARE, PERCENTILE, Rightsizing)
from .usage import Sample, format_time
from .window import GAP_INTERVALS, Window, slot_for, words

DAY_S = 86400
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
    slot_s: int | None = None

    def as_dict(self) -> dict:
        out = {"percentile": self.percentile, "percentileBytes": self.percentile_bytes,
               "peakBytes": self.peak_bytes, "windowSeconds": round(self.window_s), "halfLifeSeconds": self.half_life_s,
               "headroomPercent": self.headroom_percent, "samples": self.samples, "breaches": list(self.breaches)}
        if self.slot_s is not None:
            out["slotSeconds"] = self.slot_s
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
    """No change: `reason` UsageMissing (no data, or a hole in the span a downsize needs), AtMaxBudget (a breach,
    nothing left to grant), MaxBudgetBelowUsage (a downsize the ceiling would cut below the peak plus headroom),
    MemoryWontHelp / KvReservationFull / RefusedWithinBudget (a breach more bytes would not fix), WouldBeRefused
    (the bounds cross) or ChangeCapReached. `condition`: the status condition it lands in (its reason when None)."""

    at: float
    model: str
    reason: str
    message: str
    condition: str | None = None

    @property
    def kind(self) -> str:
        return self.condition or self.reason


Event = Change | Hold


def _mib_ceil(nbytes: float) -> int:
    """Whole MiB at or above `nbytes`; the largest int64 budget for anything beyond it (an absurd headroom)."""
    if not nbytes < INT64_MAX_MIB:
        return INT64_MAX_MIB
    return math.ceil(nbytes / MIB) * MIB


def grid_of(samples: Sequence[Sample], after: float | None = None) -> float | None:
    """The grid of a series: the smallest positive spacing of its samples (after `after`); None under two."""
    times = [s.time for s in samples if after is None or s.time > after]
    steps = [b - a for a, b in zip(times, times[1:]) if b > a]
    return min(steps) if steps else None


class Recommender:
    """The loop's state for one model; `observe` is the transition, fed samples in time order."""

    def __init__(self, model: str, budget_bytes: int, policy: Rightsizing, slo: Slo = Slo(),
                 last_change_at: float | None = None, limits: Limits = Limits(),
                 recent_changes: Iterable[float] = (), window_s: float = DEFAULT_WINDOW_S, *,
                 step_s: float | None = None, history_until: float | None = None, acts_after: float | None = None,
                 slot_s: int | None = None):
        self.model, self.budget, self.policy, self.slo = model, budget_bytes, policy, slo
        self.limits = limits.within(policy)
        self.recent = deque(sorted(recent_changes))  # change times within the last day (the cap)
        self.window_s = window_s
        self.span_s = min(policy.downsize_after_s, window_s)  # downsizeAfter, at most the window the loop reads
        self.window = Window(window_s, slot_s or slot_for(window_s), self.span_s, step_s)
        self.step_s = step_s
        self._learn_step = step_s is None  # learnt as the smallest spacing seen
        self.history_until = history_until
        acts_after = history_until if acts_after is None else acts_after
        self.act_from = -math.inf if acts_after is None else acts_after + policy.upsize_after_s + (step_s or 0)
        self.last_change_at = last_change_at
        self.last_at: float | None = None  # the last grid sample with usage
        self.breach_since: float | None = None  # the run of samples with a breach began
        self.helpful_since: float | None = None  # the run of samples with a breach more memory relieves began
        self.holding: str | None = None
        self.in_gap = False
        self.samples = 0
        self._last_queue_wait: float | None = None
        self._kv_reserved: int | None = None

    @property
    def headroom(self) -> float:
        return 1 + self.policy.headroom_percent / 100

    @property
    def kv_seen(self) -> bool:
        return self.window.kv_seen

    def observe(self, s: Sample) -> list[Event]:
        crossed = self.limits.crossed
        if crossed is not None:
            return self._hold(s.time, "WouldBeRefused", crossed)
        if self.history_until is not None and s.time <= self.history_until:  # a slot's peaks: the window only
            if not s.missing:
                self.samples += 1
                self.window.add(s.time, s.device_bytes, s.kv_used_bytes, complete=True, kv_least=s.kv_used_least_bytes)
            return []
        if s.missing:
            if self.last_at is None and not self.in_gap:  # no usage yet at all
                self.in_gap = True
                return [Hold(s.time, self.model, "UsageMissing", "no usage sample")]
            return self._gap(s.time, present=False)
        self.samples += 1
        events = self._gap(s.time, present=True)
        self.last_at = s.time
        self.window.add(s.time, s.device_bytes, s.kv_used_bytes)
        if s.kv_reserved_bytes is not None:
            self._kv_reserved = s.kv_reserved_bytes
        breaches = self.breaches(s)
        self._last_queue_wait = s.queue_wait_s
        if self.last_change_at is not None and s.time <= self.last_change_at:
            return events  # history before the last change: it informs the target, it already acted
        if breaches and s.budget_bytes is not None and s.budget_bytes < self.budget:
            self.breach_since = self.helpful_since = None  # the worker still runs the old, smaller budget: the upsize is on its way
            return events
        if not breaches:
            self.breach_since = self.helpful_since = None
            return events + (self._on_quiet(s) if s.time >= self.act_from else [])
        return events + self._on_breach(s, breaches)

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
        w = self.window
        kv_p99 = w.kv.percentile(PERCENTILE) if w.kv_seen else None
        end = self.now
        seen = min(end - w.data_since, self.window_s) if w.data_since is not None else 0.0
        device, _, kv = w.peaks(end)
        return Evidence(PERCENTILE, w.device.percentile(PERCENTILE), device, seen,
                        HALF_LIFE_S, self.policy.headroom_percent, self.samples, breaches,
                        (self.helpful_since or self.breach_since) if breaches else None, kv_p99, self._kv_reserved,
                        kv if w.kv_seen else None, w.slot_s)

    @property
    def now(self) -> float:
        """The time of the last sample with usage (a grid sample, else a slot's end)."""
        return self.last_at if self.last_at is not None else (self.window.end or 0.0)

    @property
    def kv_peak(self) -> int:
        return self.window.peaks(self.now)[2]

    def wanted_down(self) -> float:
        """The target before the bounds (docs: the rules)."""
        w = self.window
        device, fixed, kv_peak = w.peaks(self.now)
        if w.kv_seen:
            kv = max(w.kv.percentile(PERCENTILE) or 0, kv_peak)
            wanted = fixed + kv * self.headroom
        else:
            wanted = (w.device.percentile(PERCENTILE) or 0) * self.headroom
        return max(wanted, device * self.headroom)

    @property
    def usage_floor(self) -> float:
        """The peak of device bytes over downsizeAfter plus headroom: no budget the loop sets goes below it."""
        return self.window.peaks(self.now)[0] * self.headroom

    def downsize_target(self) -> int:
        return self.bounded(self.wanted_down())

    def upsize_target(self, helpful: tuple[str, ...], missing_bytes: int) -> int:
        wanted = max(self.budget * self.headroom, self.usage_floor)
        if "WorkerRefusal" in helpful:
            wanted = max(wanted, self.budget + missing_bytes * self.headroom)
        if not IMMEDIATE & set(helpful) and self.limits.resident_bytes is not None:
            wanted = min(wanted, self.limits.resident_bytes)  # latency: every layer resident is all memory buys
        return self.bounded(wanted)

    def bounded(self, wanted: float) -> int:
        """`wanted` as a budget: whole MiB, within [minBudget, maxBudget] and the Limits, an int64 whatever came in."""
        ceiling = self.limits.ceiling
        if not wanted <= ceiling:  # NaN, inf, beyond the ceiling
            wanted = ceiling
        return max(self.limits.floor, min(_mib_ceil(max(wanted, 0)), ceiling))

    def holes(self) -> str | None:
        """Why a downsize waits for usage (a hole in the last downsizeAfter), or None."""
        hole = self.window.hole_within(self.now) if self.window.end is not None else None
        if hole is None:
            return None
        return (f"no usage from {_clock(hole[0])} to {_clock(hole[1])}, within the last {words(self.span_s)} a "
                f"downsize needs covered; downsizes wait until {_clock(hole[1] + self.span_s)} (breaches still upsize)")

    # transitions
    def _gap(self, at: float, present: bool) -> list[Event]:
        """A gap of more than GAP_INTERVALS grid steps since the last sample with usage ends the breach; it holds
        once (UsageMissing). Learns the grid when none was given."""
        if self.last_at is None:
            self.in_gap = self.in_gap and not present
            return []
        step = at - self.last_at
        if present and step > 0 and self._learn_step:
            self.step_s = step if self.step_s is None else min(self.step_s, step)
            self.window.step_s = self.step_s
        if self.step_s is None or step <= GAP_INTERVALS * self.step_s:
            self.in_gap = self.in_gap and not present
            return []
        self.breach_since = self.helpful_since = None
        was, self.in_gap = self.in_gap, not present
        if was:
            return []
        return [Hold(at, self.model, "UsageMissing", f"no usage for {step:.0f}s (more than {GAP_INTERVALS:g} grid "
                     f"steps of {self.step_s:g}s): no breach runs across it")]

    def _hold(self, at: float, reason: str, message: str, condition: str | None = None) -> list[Event]:
        if self.holding == reason:
            return []
        self.holding = reason
        return [Hold(at, self.model, reason, message, condition)]

    def _on_breach(self, s: Sample, breaches: tuple[str, ...]) -> list[Event]:
        """Two clocks: the run of breaches of any kind (a hold, when none is one memory relieves) and the run of
        breaches memory relieves (an upsize): a breach memory cannot relieve never starts an upsize's clock."""
        helpful, held = self.limits.relief(breaches, self.budget, s)
        self.breach_since = s.time if self.breach_since is None else self.breach_since
        self.helpful_since = (s.time if self.helpful_since is None else self.helpful_since) if helpful else None
        if s.time < self.act_from:
            return []
        settled = self.last_change_at is None or s.time - self.last_change_at >= self.policy.upsize_after_s
        at_once = bool(IMMEDIATE & set(breaches)) and settled
        if not helpful:
            if at_once or s.time - self.breach_since >= self.policy.upsize_after_s:
                reason, message = held
                return self._hold(s.time, reason, message, "MemoryWontHelp")
            return []
        if not (at_once and IMMEDIATE & set(helpful)) and s.time - self.helpful_since < self.policy.upsize_after_s:
            return []
        target = self.upsize_target(helpful, s.missing_bytes or 0)
        if target <= self.budget:
            return self._hold(s.time, "AtMaxBudget", f"{', '.join(helpful)} but the budget is at its ceiling, "
                              f"{self.limits.ceiling_why}")
        return self._change(s.time, "up", target, helpful[0], breaches)

    def _on_quiet(self, s: Sample) -> list[Event]:
        wanted = self.wanted_down()
        target = self.bounded(wanted)
        share = 1 - target / self.budget if self.budget > 0 else 0.0
        if share < MIN_DOWNSIZE_SHARE:
            self.holding = None
            return []
        floor = _mib_ceil(self.usage_floor)
        if target < floor:  # only the ceiling cuts below the peak plus headroom
            least = paste_quantity(floor)  # to a tenth of a GiB: the words stay put while the peak wobbles
            return self._hold(s.time, "MaxBudgetBelowUsage", (
                f"{self.limits.ceiling_why} ({format_bytes(self.limits.ceiling)}) is below the peak of the last "
                f"{words(self.span_s)} plus headroom (about {least}): the loop does not cut the budget below what the "
                f"model uses; raise it to at least {least}"), "AtMaxBudget")
        holes = self.holes()
        if holes is not None:
            return self._hold(s.time, "UsageMissing", holes)
        self.holding = None
        longer = max(1.0, DOWNSIZE_MARGIN / share)  # a smaller step waits longer, in proportion
        if self.window.covered_for(s.time) < min(self.span_s * longer, self.window_s):
            return []  # not yet downsizeAfter (times `longer`, at most the window) of usage without a hole
        if self.last_change_at is not None and s.time - self.last_change_at < self.policy.cooldown_s * longer:
            return []
        return self._change(s.time, "down", target, "BelowTarget", ())

    def _change(self, at: float, direction, target: int, reason: str, breaches: tuple[str, ...]) -> list[Event]:
        while self.recent and self.recent[0] <= at - DAY_S:
            self.recent.popleft()
        if len(self.recent) >= MAX_CHANGES_PER_DAY:
            return self._hold(at, "ChangeCapReached", f"{MAX_CHANGES_PER_DAY} changes in the last 24 h, the most "
                              f"a model gets; the next is possible after {_clock(self.recent[0] + DAY_S)}")
        change = Change(at, self.model, direction, self.budget, target, reason, self.evidence(breaches))
        self.budget, self.last_change_at = target, at
        self.recent.append(at)
        self.breach_since = self.helpful_since = None
        self.holding = None
        return [change]


def _clock(t: float) -> str:
    return format_time(t) if 0 <= t < 1 << 34 else f"{t:.0f}"


def replay(samples: Iterable[Sample], model: str, budget_bytes: int, policy: Rightsizing, slo: Slo = Slo(),
           last_change_at: float | None = None, limits: Limits = Limits(),
           recent_changes: Iterable[float] = (), window_s: float = DEFAULT_WINDOW_S, *,
           step_s: float | None = None, history_until: float | None = None,
           acts_after: float | None = None) -> tuple[list[Event], Recommender]:
    """The events the loop takes over one model's samples (in time order), and its final state. `window_s`: the
    loop's usage window (WindowError when it cannot keep it); `step_s`: the grid (None: the series' smallest
    spacing). A pass's read: the samples up to `history_until` are slot peaks, and nothing up to `acts_after`
    (default: history_until) + upsizeAfter + one step acts: those samples feed the window and a breach's clock."""
    samples = list(samples)
    if step_s is None:
        step_s = grid_of([s for s in samples if not s.missing], history_until)
    loop = Recommender(model, budget_bytes, policy, slo, last_change_at, limits, recent_changes, window_s,
                       step_s=step_s, history_until=history_until, acts_after=acts_after)
    events: list[Event] = []
    for s in samples:
        events += loop.observe(s)
    return events, loop
