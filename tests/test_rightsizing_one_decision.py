"""One system, one decision: the replay runs the installed loop's rule with its window, so a replay of days ends
where the loop's own pass over its window ends; a sustained decline is followed down to the documented target
(the window's p99, never below its peak, plus headroom) within the documented time (window + downsizeAfter)."""
from __future__ import annotations

import math

from controller.rightsizing.histogram import DecayingHistogram
from controller.rightsizing.policy import DEFAULT_WINDOW_S, Rightsizing
from controller.rightsizing.recommender import MIB, Change, replay
from controller.rightsizing.usage import Sample

GiB = 1 << 30
DAY = 86400
POLICY = Rightsizing(policy="Auto")  # the documented defaults: 15 % headroom, downsizeAfter 1d, cooldown 6h


def decline(days: int, start_gib: float = 40, end_gib: float = 20, step: int = 300) -> list[Sample]:
    """Usage falling linearly over the first half, then flat at its end value: the issue's slow decline."""
    out = []
    for i in range(days * DAY // step):
        t = i * step
        share = min(1.0, t / (days * DAY / 2))
        out.append(Sample(time=float(t), model="llm/chat", device_bytes=int((start_gib + (end_gib - start_gib) * share) * GiB)))
    return out


def test_a_replay_of_days_ends_where_the_loops_pass_over_its_window_ends():
    samples = decline(6)
    _, whole = replay(samples, "llm/chat", 48 * GiB, POLICY, window_s=DEFAULT_WINDOW_S)
    last = [s for s in samples if s.time >= samples[-1].time - DEFAULT_WINDOW_S]
    whole_target, window_target = whole.downsize_target(), replay(last, "llm/chat", 48 * GiB, POLICY)[1].downsize_target()
    assert whole_target == window_target


def test_a_sustained_decline_is_followed_down_to_the_documented_target_in_the_documented_time():
    samples = decline(6)
    events, loop = replay(samples, "llm/chat", 48 * GiB, POLICY, window_s=DEFAULT_WINDOW_S)
    target = math.ceil(20 * GiB * 1.15 / MIB) * MIB  # flat at 20 GiB since day 3: p99 = peak = 20 GiB, + 15 %
    flat_since = 3 * DAY
    settled = [e for e in events if isinstance(e, Change) and e.at <= flat_since + DEFAULT_WINDOW_S + DAY]
    assert settled and settled[-1].to_bytes <= target * 1.06  # within one histogram bucket (5 %) of the target
    assert loop.budget <= target * 1.06 and loop.budget >= 20 * GiB * 1.15


def test_a_windowed_histogram_forgets_exactly_what_left_the_window():
    windowed, fresh = DecayingHistogram(DAY, window_s=DAY), DecayingHistogram(DAY)
    for i in range(2000):
        windowed.add((40 if i < 1000 else 10) * GiB, i * 120.0)
    for i in range(2000):
        if i * 120.0 >= 1999 * 120.0 - DAY:
            fresh.add((40 if i < 1000 else 10) * GiB, i * 120.0)
    for q in (0.5, 0.9, 0.99, 1.0):
        assert windowed.percentile(q) == fresh.percentile(q)
