"""The usage window the right-sizing loop decides on: one peak per slot, kept the same way whether the
slots come from Prometheus or from the samples of a replayed file.

The loop carries little from one pass to the next, and all of it in its records (the budget, the
last change, the changes of the last day); what else it decides on is recomputed every pass from
the window, held here. So a replay of any length and the installed loop, pass by pass over the
same samples, decide alike (controller.rightsizing.recommender). Owns:
- `slot_for(window_s, step_s)`: the slot a window is kept in. A window of half an hour or more is
  kept as half-hour slots (SLOT_S): it must be a whole number of them, at most MAX_WINDOW_S, and the
  grid step must divide the slot. A shorter window (tests, demos) is kept per second. Anything else
  raises WindowError, naming what to pass instead: the loop could not represent it;
- `slot_end(t, slot_s)`: slot k covers (k·slot, (k+1)·slot], what Prometheus' `max_over_time` over
  one slot covers when evaluated at its end;
- `Window`: the slot in progress and the complete slots whose end lies within the window before
  its end: a decaying histogram of their device-bytes peaks and one of their KV-in-use peaks (the
  percentiles), the peaks over a span (`downsizeAfter`, at most the window) of device bytes, of KV
  in use and of what is not KV in use (a slot's device peak less its least KV in use), and the run of slots
  holding usage without a hole (consecutive slots further apart than the slot plus GAP_INTERVALS
  grid steps), which a downsize needs over its whole span.
Pure. Called by the recommender; the Prometheus reader asks for the slots `slot_for` names.
"""
from __future__ import annotations

import math
from collections import deque

from controller.policy import HALF_LIFE_S

from .histogram import DecayingHistogram

SLOT_S = 1800            # the slot of a window of half an hour or more: one peak per half hour
MAX_WINDOW_S = 14 * 86400  # 672 slots a model: two weekly cycles
GAP_INTERVALS = 2.5      # grid steps without usage that end a breach, and (beyond a slot) break the covered run


class WindowError(ValueError):
    """A window (or grid) the loop cannot keep; the message says what to pass instead."""

    reason = "WindowInvalid"


def slot_for(window_s: float, step_s: float | None = None) -> int:
    """The slot (seconds) `window_s` is kept in; WindowError when the loop cannot represent that window."""
    if not (isinstance(window_s, (int, float)) and math.isfinite(window_s)) or window_s <= 0:
        raise WindowError(f"a window of {window_s!r}s is no duration; pass e.g. 2d")
    if window_s > MAX_WINDOW_S:
        raise WindowError(f"a window of {words(window_s)} is longer than the loop keeps ({words(MAX_WINDOW_S)}: "
                          f"{MAX_WINDOW_S // SLOT_S} half-hour peaks a model); pass at most 14d")
    if window_s < SLOT_S:
        if window_s != int(window_s):
            raise WindowError(f"a window of {window_s:g}s is not a whole number of seconds; pass e.g. "
                              f"{math.ceil(window_s)}s")
        return 1
    if window_s % SLOT_S:
        low = window_s // SLOT_S * SLOT_S
        raise WindowError(f"a window of {words(window_s)} is not a whole number of half hours: the loop keeps one "
                          f"peak per half hour; pass {words(low)} or {words(low + SLOT_S)}")
    if step_s is not None and (step_s <= 0 or SLOT_S % step_s):
        raise WindowError(f"a grid step of {step_s:g}s does not divide the half-hour slot, so a slot's peak would "
                          "not be the peak of its grid samples; pass a step that divides 30m (15s, 30s, 60s, 5m)")
    return SLOT_S


def words(seconds: float) -> str:
    """A duration as the duration flags take it (contract.durations): 2d, 45.5h, 90m, 15s."""
    if seconds >= 86400 and seconds % 86400 == 0:
        return f"{seconds / 86400:g}d"
    if seconds >= 3600 and seconds % 1800 == 0:
        return f"{seconds / 3600:g}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g}m"
    return f"{seconds:g}s"


def slot_end(t: float, slot_s: int) -> float:
    return float(math.ceil(t / slot_s) * slot_s)


def _fixed(device: int, kv_least: int | None) -> int:
    """What is not KV in use in a slot, at most: its device peak less its least KV in use (never below the
    difference at any one time in it)."""
    return max(0, device - (kv_least or 0))


class SpanMax:
    """The largest value of (end, value) pairs added in time order whose end is at or after a cutoff."""

    def __init__(self) -> None:
        self._items: deque[tuple[float, int]] = deque()

    def add(self, end: float, value: int) -> None:
        while self._items and self._items[-1][1] <= value:
            self._items.pop()
        self._items.append((end, value))

    def after(self, cutoff: float) -> int | None:
        while self._items and self._items[0][0] < cutoff:
            self._items.popleft()
        return self._items[0][1] if self._items else None


class Window:
    """One model's window: `add` each value in time order (`complete`: a whole slot's peak, as a pass reads the
    older part of its window; otherwise a grid sample, folded into the slot in progress)."""

    def __init__(self, window_s: float, slot_s: int, span_s: float, step_s: float | None):
        self.window_s, self.slot_s, self.span_s, self.step_s = window_s, slot_s, span_s, step_s
        self.device = DecayingHistogram(HALF_LIFE_S, windowed=True)
        self.kv = DecayingHistogram(HALF_LIFE_S, windowed=True)
        self._device_peak, self._fixed_peak, self._kv_peak = SpanMax(), SpanMax(), SpanMax()
        self._current: list | None = None  # [end, device peak, KV peak, least KV] of the slot in progress
        self._last_end: float | None = None  # the end of the last slot with usage
        self.data_since: float | None = None  # the end of the first slot with usage
        self.covered_since: float | None = None  # the end of the first slot of the run without a hole (usage is
        # counted from there: to the slot, never more than there is)
        self.hole: tuple[float, float] | None = None  # (from, to) of the last hole, the time usage was missing
        self.kv_seen = False
        self.values = 0

    def add(self, at: float, device: int, kv: int | None, complete: bool = False, kv_least: int | None = None) -> None:
        """`kv_least`: a slot's least KV in use (a grid sample's is its own)."""
        end = slot_end(at, self.slot_s)
        if self._current is not None and end > self._current[0]:
            self._close()
        if self._current is None:
            self._open(end)
        kv_used = min(kv or 0, device)
        least = min(kv_used if kv_least is None else kv_least, kv_used)
        self.kv_seen = self.kv_seen or kv is not None
        current = self._current
        current[1], current[2] = max(current[1], device), max(current[2], kv_used)
        current[3] = least if current[3] is None else min(current[3], least)
        self.values += 1
        if complete:
            self._close()

    def _open(self, end: float) -> None:
        if self.data_since is None:
            self.data_since = self.covered_since = end
        elif end - self._last_end > self.slot_s + GAP_INTERVALS * (self.step_s or 0):
            self.covered_since = end
            self.hole = (self._last_end, end - self.slot_s)
        self._last_end = end
        self._current = [end, 0, 0, None]
        cutoff = end - self.window_s
        self.device.forget_through(cutoff)
        self.kv.forget_through(cutoff)

    def _close(self) -> None:
        end, device, kv, least = self._current
        self._current = None
        self.device.add(device, end)
        self.kv.add(kv, end)
        self._device_peak.add(end, device)
        self._fixed_peak.add(end, _fixed(device, least))
        self._kv_peak.add(end, kv)

    @property
    def end(self) -> float | None:
        """The end of the slot in progress (or of the last one, when a slot's peak was added last)."""
        return self._current[0] if self._current is not None else self._last_end

    def peaks(self, at: float) -> tuple[int, int, int]:
        """(device bytes, what is not KV in use, KV in use): each the peak of the slots that end at or after
        `at` - span and of the slot in progress (at least the span before `at`, to the slot)."""
        cutoff = at - self.span_s
        current = self._current or (None, 0, 0, 0)
        found = (self._device_peak.after(cutoff), self._fixed_peak.after(cutoff), self._kv_peak.after(cutoff))
        now = (current[1], _fixed(current[1], current[3]), current[2])
        return tuple(max(f or 0, n) for f, n in zip(found, now))

    def covered_for(self, at: float) -> float:
        """How long before `at` usage has been there in every slot, without a hole (from the first slot's end)."""
        return 0.0 if self.covered_since is None else at - self.covered_since

    def hole_within(self, at: float) -> tuple[float, float] | None:
        """The last hole, when it lies within the span before `at` (after usage began)."""
        if self.hole is None or self.hole[1] <= at - self.span_s:
            return None
        return self.hole
