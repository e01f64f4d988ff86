"""How elastic slices on one slot grow (issue 33, item 5; controller/planning/growth.py, docs/planner.md "Modes and
limits"): one rule for both planners. Each slice starts at its start slice; where the node's host RAM is short,
the slices keep one more layer each, in turn by name, until what they pin fits; then they grow into the bytes
left, one layer each in turn by name (from the first name again), within each budget, while the SLO limits hold.

Toy profiles (tests/factories.py), no activation or overhead, context 100 (KV 100 bytes):
- "org/toy": 10 layers of 100 bytes, embedding and head 100 each. A slice with k resident layers takes
  500 + 100k bytes (its two stream buffers are 200) and pins 100 × (10 - k); whole it needs 1,300.
- "org/wide": 10 layers of 200 bytes: 700 + 200k bytes, pins 200 × (10 - k); whole it needs 2,300.
A budget of 1,200 caps "org/toy" at 7 layers, one of 2,200 caps "org/wide" at 7. Every expected count below is
worked out by hand from the rule in its comment, and held on both planners.
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from controller.planning.plan import plan
from controller.types import GpuSlot, Inputs
from tests.factories import toy_model, toy_profile, toy_slot
from tests.test_plan_readmit import PROFILES as L4_PROFILES
from tests.test_plan_readmit import QWEN_32B, GiB, model

PROFILES = (toy_profile(), toy_profile("org/wide", layer_bytes=200))


def toy(name: str, budget: int = 1200, **kw):
    return toy_model(name, budget, **kw)


def wide(name: str, budget: int = 2200, **kw):
    return toy_model(name, budget, model="org/wide", **kw)


CASES = {
    # starts 500 + 500: 1,000 left = 10 layers, a, b, a, b ...
    "two-share-the-room-evenly": ([toy("a"), toy("b")], 2000, None, {"a": 5, "b": 5}),
    # 1,100 left: 11 layers, the first name takes the odd one
    "two-odd-layer-to-the-first-name": ([toy("b"), toy("a")], 2100, None, {"a": 6, "b": 5}),
    # 1,400 left: 14 layers, but each budget stops at 7
    "two-each-stopped-by-its-budget": ([toy("a"), toy("b")], 2400, None, {"a": 7, "b": 7}),
    # a layer each whatever its size: wide layers take 200, toy ones 100. Starts 500 + 700, 1,000 left:
    # a1 (900 left), b1 (700), a2 (600), b2 (400), a3 (300), b3 (100), a4 (0)
    "two-unequal-layers-a-layer-each": ([toy("a"), wide("b")], 2200, None, {"a": 4, "b": 3}),
    # host RAM 2,400 against 1,000 + 2,000 pinned at the start: 600 short. In turn: a1 (500 short), b1 (300),
    # a2 (200), b2 (fits). Then 2,400 - (700 + 1,100) = 600 left: a3 (500), b3 (300), a4 (200), b4 (0)
    "two-host-ram-short-a-layer-each-in-turn": ([toy("a"), wide("b")], 2400, 2400, {"a": 4, "b": 4}),
    # starts 3 × 500: 600 left: a, b, c, a, b, c
    "three-share-the-room-evenly": ([toy("a"), toy("b"), toy("c")], 2100, None, {"a": 2, "b": 2, "c": 2}),
    # 700 left: the seventh layer to the first name
    "three-odd-layer-to-the-first-name": ([toy("c"), toy("a"), toy("b")], 2200, None, {"a": 3, "b": 2, "c": 2}),
    # b's budget of 700 stops it at 2; a and c go on: a1 b1 c1 a2 b2 c2 a3 c3 a4 (900 left)
    "three-one-stopped-by-its-budget": ([toy("a"), toy("b", 700), toy("c")], 2400, None, {"a": 4, "b": 2, "c": 3}),
    # host RAM 3,000 against 4,000 pinned: 1,000 short. a1 (900), b1 (700), c1 (600), a2 (500), b2 (300),
    # c2 (200), a3 (100), b3 (fits). Bytes 800 + 1,300 + 700 = 2,800 of 3,400: 600 left, from a again:
    # a4 (500), b4 (300), c3 (200), a5 (100), b5 needs 200 (stops), c4 (0)
    "three-host-ram-short-then-the-room-in-turn": ([toy("a"), wide("b"), toy("c")], 3400, 3000,
                                                    {"a": 5, "b": 4, "c": 4}),
}


@pytest.mark.parametrize("method", ["exact", "greedy"])
@pytest.mark.parametrize("models, usable, host, layers", list(CASES.values()), ids=list(CASES))
def test_elastic_slices_on_one_slot_grow_a_layer_each_in_turn_by_name(method, models, usable, host, layers):
    slot = replace(toy_slot(usable=usable), host_memory_bytes=host)
    decisions = plan(Inputs(models=tuple(models), profiles=PROFILES, slots=(slot,)), method=method).decisions
    assert {d.name: (d.mode, d.slot) for d in decisions} == {name: ("elastic", slot.id) for name in layers}
    assert {d.name: d.resident_layers for d in decisions} == layers
    assert sum(d.footprint_bytes for d in decisions) <= usable
    assert host is None or sum(d.host_bytes for d in decisions) <= host


@pytest.mark.parametrize("method", ["exact", "greedy"])
@pytest.mark.parametrize("host_gib", [None, 128])
def test_two_like_32b_models_on_an_l4_get_as_many_layers_each(method, host_gib):
    """Estimated profiles (examples/fleet): two Qwen2.5-32B without targets on one NVIDIA-L4, where the exact
    solver gave one all the room (10 and 0 layers with 128 GiB of host RAM): by the rule, alike models get
    layers alike, the first name the odd one."""
    models = tuple(model(name, QWEN_32B, 24, 1024, None) for name in ("coder", "reviewer"))
    slot = GpuSlot(node="l4", index=0, product="NVIDIA-L4", memory_bytes=23034 * 2**20,
                   host_memory_bytes=None if host_gib is None else host_gib * GiB)
    decisions = {d.name: d for d in plan(Inputs(models=models, profiles=L4_PROFILES, slots=(slot,)),
                                         method=method).decisions}
    assert {d.mode for d in decisions.values()} == {"elastic"}
    assert decisions["coder"].resident_layers - decisions["reviewer"].resident_layers in (0, 1)
    assert decisions["reviewer"].resident_layers > 0
