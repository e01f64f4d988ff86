"""Bounds no usage series breaks (hypothesis over arbitrary series within the usage format), acting on what
helps (a latency breach upsizes only where the planner predicts more bytes lower latency), the daily change
cap, and the limits computed from the planner's view of a model."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.rightsizing.bounds import INT64_MAX, Limits, latency_effect, limits_for
from controller.policy import MAX_CHANGES_PER_DAY, Rightsizing
from controller.rightsizing.recommender import MIB, Change, Hold, Slo, replay
from controller.rightsizing.usage import MAX_USAGE_BYTES, MAX_USAGE_COUNT, MAX_USAGE_SECONDS, Sample

GiB = 1 << 30
DAY = 86400


@st.composite
def anything(draw):
    """Any series the usage format admits: any byte count up to its limit, any latency, bursts of breaches,
    gaps, missing points; any policy the schema admits; any limits."""
    n = draw(st.integers(1, 60))
    samples, t = [], 0.0
    for _ in range(n):
        t += draw(st.sampled_from([15.0, 60.0, 60.0, 600.0, 3600.0, 5 * 3600.0]))
        nbytes = st.one_of(st.integers(0, 64 * GiB), st.integers(0, MAX_USAGE_BYTES), st.none())
        samples.append(Sample(
            time=t, model="llm/chat", device_bytes=draw(nbytes), kv_used_bytes=draw(nbytes),
            kv_reserved_bytes=draw(nbytes), missing_bytes=draw(nbytes), budget_bytes=draw(nbytes),
            refusals=draw(st.sampled_from([None, 0, 0, 1, int(MAX_USAGE_COUNT)])),
            ooms=draw(st.sampled_from([None, 0, 0, 0, 1, int(MAX_USAGE_COUNT)])),
            ttft_s=draw(st.sampled_from([None, 0.1, 5.0, MAX_USAGE_SECONDS])),
            tpot_s=draw(st.sampled_from([None, 0.01, 0.5, MAX_USAGE_SECONDS])),
            queue_wait_s=draw(st.sampled_from([None, 0.0, 2.0, MAX_USAGE_SECONDS]))))
    low = draw(st.sampled_from([None, 0, GiB, 40 * GiB]))
    high = draw(st.sampled_from([None, GiB, 24 * GiB, 1 << 62]))
    if low is not None and high is not None and low > high:
        low, high = high, low
    policy = Rightsizing(policy="Auto", headroom_percent=draw(st.sampled_from([0.0, 15.0, 100.0, 1000.0, 1e300])),
                         min_budget=low, max_budget=high, upsize_after_s=draw(st.sampled_from([0, 15, 60, 3600])),
                         downsize_after_s=draw(st.sampled_from([0, 60, 3600, DAY])),
                         cooldown_s=draw(st.sampled_from([0, 60, 3600])))
    limits = Limits(ceiling=draw(st.sampled_from([80 * GiB // MIB * MIB, 141 * GiB, (INT64_MAX >> 20) << 20])),
                    floor=draw(st.sampled_from([0, 2 * GiB, 100 * GiB])), latency_helps=draw(st.booleans()))
    budget = draw(st.sampled_from([0, MIB, 24 * GiB, 100 * GiB, 1 << 62]))
    recent = draw(st.lists(st.floats(-DAY, 0), max_size=MAX_CHANGES_PER_DAY))
    return samples, policy, limits, budget, recent


@settings(max_examples=120, deadline=None)
@given(anything())
def test_no_series_takes_a_budget_outside_its_bounds(case):
    samples, policy, limits, budget, recent = case
    slo = Slo(ttft_ms=500, tpot_ms=50)
    events, loop = replay(samples, "llm/chat", budget, policy, slo, limits=limits, recent_changes=recent)
    changes = [e for e in events if isinstance(e, Change)]
    if limits.within(policy).crossed:
        assert not changes and loop.budget == budget  # the bounds cross: it holds, and says so
        return
    headroom = 1 + policy.headroom_percent / 100
    for change in changes:
        assert 0 <= change.to_bytes <= INT64_MAX and change.to_bytes % MIB == 0
        assert limits.floor <= change.to_bytes <= limits.ceiling
        assert (policy.min_budget or 0) <= change.to_bytes <= (policy.max_budget or INT64_MAX)
        peak = change.evidence.peak_bytes
        # never below the peak plus headroom, unless the ceiling (maxBudget included) is lower: the cap wins
        assert change.to_bytes >= min(limits.within(policy).ceiling, peak * headroom) - MIB or change.direction == "up"
        if change.direction == "up" and not limits.latency_helps:
            assert set(change.evidence.breaches) & {"KvNearReservation", "WorkerRefusal", "OutOfMemory"}
    times = sorted([*recent, *(c.at for c in changes)])
    for i, at in enumerate(times):
        assert sum(1 for other in times[i:] if other < at + DAY) <= MAX_CHANGES_PER_DAY


def _series(n, **fields):
    return [Sample(time=60.0 * i, model="llm/chat", device_bytes=3 * GiB, **fields) for i in range(n)]


@pytest.mark.parametrize("breach", [dict(tpot_s=0.2), dict(ttft_s=2.0), dict(queue_wait_s=5.0)],
                         ids=["tpot", "ttft", "queue-wait"])
def test_a_latency_breach_memory_cannot_fix_holds_and_says_why(breach):
    why = "it runs resident with every layer on the GPU, so more memory cannot lower its latency"
    events, loop = replay(_series(1440, **breach), "llm/chat", 24 * GiB, Rightsizing(policy="Auto"),
                          Slo(ttft_ms=500, tpot_ms=50), limits=Limits(latency_why=why))
    assert loop.budget == 24 * GiB and [e.reason for e in events] == ["MemoryWontHelp"]
    assert why in events[0].message


def test_a_sustained_latency_breach_where_memory_helps_grows_at_most_to_the_ceiling_and_the_cap():
    """The runaway of the issue: a TPOT breach held for 2 days. Bounded by the GPU and by the daily cap."""
    limits = Limits(ceiling=141 * GiB, latency_helps=True)
    samples = [Sample(time=60.0 * i, model="llm/chat", device_bytes=20 * GiB, tpot_s=0.2) for i in range(2 * 1440)]
    events, loop = replay(samples, "llm/chat", 24 * GiB, Rightsizing(policy="Auto"), Slo(tpot_ms=50), limits=limits)
    changes = [e for e in events if isinstance(e, Change)]
    assert loop.budget <= 141 * GiB and len(changes) <= 2 * MAX_CHANGES_PER_DAY
    assert any(isinstance(e, Hold) and e.reason in ("ChangeCapReached", "AtMaxBudget") for e in events)


def test_a_memory_breach_upsizes_even_where_latency_would_not_help():
    samples = _series(3, ooms=1)
    events, loop = replay(samples, "llm/chat", 4 * GiB, Rightsizing(policy="Auto"), limits=Limits())
    assert isinstance(events[0], Change) and events[0].reason == "OutOfMemory"


def test_bounds_that_cross_hold_with_would_be_refused():
    events, loop = replay(_series(5, ooms=1), "llm/chat", 4 * GiB, Rightsizing(policy="Auto", max_budget=GiB),
                          limits=Limits(floor=2 * GiB, floor_why="the elastic minimum"))
    assert [e.reason for e in events] == ["WouldBeRefused"] and "elastic minimum" in events[0].message
    assert loop.budget == 4 * GiB


def test_limits_come_from_the_gpu_product_max_budget_and_the_elastic_minimum():
    from controller.types import GpuSlot
    from factories import toy_model, toy_profile
    model = toy_model("chat", 4 * GiB)
    slots = [GpuSlot("n1", 0, "NVIDIA-L4", 24 * GiB), GpuSlot("n2", 0, "NVIDIA-H200", 141 * GiB)]
    profile = toy_profile()
    model = replace(model, gpu_product="NVIDIA-L4")
    limits = limits_for(model, Rightsizing(policy="Auto"), None, slots, profile)
    assert limits.ceiling == 23 * GiB and "NVIDIA-L4" in limits.ceiling_why
    assert 0 < limits.floor < limits.ceiling and limits.floor % MIB == 0
    capped = limits_for(model, Rightsizing(policy="Auto", max_budget=8 * GiB), None, slots, profile)
    assert (capped.ceiling, capped.ceiling_why) == (8 * GiB, "maxBudget")
    assert not latency_effect(model, None, profile)[0]
