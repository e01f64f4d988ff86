"""One system, one decision: the replay runs the installed loop's rule with its window, so a replay of days ends
where the loop's own pass over its window ends; a sustained decline is followed down to the documented target
(the window's p99, never below its peak, plus headroom) within the documented time (window + downsizeAfter)."""
from __future__ import annotations

import math

import pytest

from controller.rightsizing.histogram import DecayingHistogram
from controller.policy import DEFAULT_WINDOW_S, Rightsizing
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
    windowed, fresh = DecayingHistogram(DAY, windowed=True), DecayingHistogram(DAY)
    for i in range(2000):
        windowed.add((40 if i < 1000 else 10) * GiB, i * 120.0)
        windowed.forget_through(i * 120.0 - DAY)
    for i in range(2000):
        if i * 120.0 > 1999 * 120.0 - DAY:
            fresh.add((40 if i < 1000 else 10) * GiB, i * 120.0)
    for q in (0.5, 0.9, 0.99, 1.0):
        assert windowed.percentile(q) == fresh.percentile(q)


MiB = 1 << 20


def _fleet(a_room_for_chat: int):
    """chat (elastic under its budget) beside a neighbour on node-a; node-b empty: an upsize may fit in place,
    move, or fit nowhere, and the record must say what the next plan then does."""
    from dataclasses import replace
    from factories import toy_model, toy_profile, toy_slot
    profile = toy_profile(layer_bytes=100 * MiB, embedding=100 * MiB, head=100 * MiB, gbps=10.0)
    auto = Rightsizing(policy="Auto", upsize_after_s=60)
    chat = replace(toy_model("chat", 800 * MiB), rightsizing=auto)
    other = toy_model("other", 1300 * MiB, model="org/toy")
    slots = [toy_slot("node-a", 1300 * MiB + a_room_for_chat), toy_slot("node-b", 1600 * MiB)]
    return [chat, other], [profile], slots


@pytest.mark.parametrize("room,b_later,expected", [(2000 * MiB, False, "InPlace"), (900 * MiB, True, "Move"),
                                                   (200 * MiB, False, "InPlace")],
                         ids=["room-here", "room-only-on-the-empty-gpu", "squeezed-in-place-as-the-planner-does"])
def test_a_records_verdict_is_what_the_next_plan_does(room, b_later, expected):
    """The last case is the issue's: a slot-room estimate said "moves to the empty GPU" while the planner kept
    the model in place, elastic at fewer bytes than granted; the verdict now comes from the planner."""
    from controller.planning.plan import plan
    from controller.inputs.rightsizing_records import effective_models
    from controller.rightsizing.step import step
    from controller.types import Inputs
    from contract.quantity import format_bytes
    models, profiles, slots = _fleet(room)
    # b_later: node-b joins after the first plan (else chat would start alone there: a quiet GPU predicts less)
    first = plan(Inputs(tuple(models), tuple(profiles), tuple(slots[:1] if b_later else slots)))
    before = {d.key: d for d in first.decisions}
    usage = {"llm/chat": [Sample(time=60.0 * i, model="llm/chat", device_bytes=800 * MiB, ooms=int(i == 5))
                          for i in range(10)]}
    result = step(models, first.decisions, slots, {}, usage, 600.0, profiles=profiles)
    record = result.records[("llm", "chat")]
    assert record.direction == "up" or record.fit.get("kind") == "NeedsCapacity"
    nxt = plan(Inputs(effective_models(models, result.records), tuple(profiles), tuple(slots)), before)
    after = {d.key: d for d in nxt.decisions}[("llm", "chat")]
    kind = record.fit["kind"]
    if kind == "InPlace":
        assert after.slot == before[("llm", "chat")].slot == record.fit["slot"]
    elif kind == "Move":
        assert after.slot == record.fit["slot"] != before[("llm", "chat")].slot
    else:  # NeedsCapacity: Auto keeps its budget, the next plan keeps the model where it was
        assert record.budget_bytes == 800 * MiB and after.slot == before[("llm", "chat")].slot
    if kind != "NeedsCapacity":  # the footprint the record names is the one the next plan gives
        assert format_bytes(after.footprint_bytes) in record.fit["message"]
    assert kind == expected
