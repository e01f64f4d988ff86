"""Planner: table-driven cases on a toy profile with round numbers, then properties.

The toy profile (tests/factories.py): embedding 100 + 10 layers × 100 + head 100 = 1,200
weight bytes; KV 1 byte/token, 100 tokens -> need 1,300. Its elastic minimum (no
resident layer) is 100 + 100 + KV 100 + two 100-byte buffers = 500.
"""
from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.planning import cost
from controller.planning.plan import plan
from controller.types import Decision, Inputs
from tests.factories import toy_model, toy_profile, toy_slot

P = toy_profile()


def run(models, slots=(toy_slot(usable=10_000),), profiles=(P,), previous=None):
    result = plan(Inputs(models=tuple(models), profiles=tuple(profiles), slots=tuple(slots)), previous)
    return {d.name: d for d in result.decisions}, result


CASES = [
    # id, models, slots, expected {name: (mode, resident_layers, reason_code)}
    ("exact-fit-budget-is-resident", [toy_model("a", 1300)], [toy_slot(usable=1300)],
     {"a": ("resident", 10, "FitsResident")}),
    ("one-byte-over-budget-is-elastic", [toy_model("a", 1299)], [toy_slot(usable=10_000)],
     {"a": ("elastic", 7, "ExceedsBudget")}),
    ("one-byte-over-slot-is-elastic", [toy_model("a", 10_000)], [toy_slot(usable=1299)],
     {"a": ("elastic", 7, "ExceedsBudget")}),
    ("elastic-minimum-exact-fit", [toy_model("a", 500)], [toy_slot()],
     {"a": ("elastic", 0, "ExceedsBudget")}),
    ("below-elastic-minimum-refused", [toy_model("a", 499)], [toy_slot()],
     {"a": ("refused", 0, "BudgetBelowElasticMinimum")}),
    ("two-fit-together-both-resident", [toy_model("a", 2000), toy_model("b", 2000)], [toy_slot(usable=2600)],
     {"a": ("resident", 10, "FitsResident"), "b": ("resident", 10, "FitsResident")}),
    ("one-byte-short-for-two-both-swap", [toy_model("a", 2000), toy_model("b", 2000)], [toy_slot(usable=2599)],
     {"a": ("swap", 10, "SharesSwapArea"), "b": ("swap", 10, "SharesSwapArea")}),
    ("three-modes-in-one-slot",
     [toy_model("big-a", 5000), toy_model("big-b", 5000), toy_model("small", 5000, context=10),
      toy_model("tight", 800)], [toy_slot(usable=3500)],
     {"tight": ("elastic", 3, "ExceedsBudget"), "small": ("resident", 10, "FitsResident"),
      "big-a": ("swap", 10, "SharesSwapArea"), "big-b": ("swap", 10, "SharesSwapArea")}),
    ("second-slot-takes-overflow-as-resident", [toy_model("a", 2000), toy_model("b", 2000)],
     [toy_slot("node-a", 1300), toy_slot("node-b", 1300)],
     {"a": ("resident", 10, "FitsResident"), "b": ("resident", 10, "FitsResident")}),
    # e's budget is a cap, not a reservation: it starts at its minimum (500) so f fits whole, then grows
    ("elastic-starts-small-so-a-neighbour-fits-whole", [toy_model("e", 1200), toy_model("f", 2000)],
     [toy_slot(usable=1900)], {"e": ("elastic", 1, "ExceedsBudget"), "f": ("resident", 10, "FitsResident")}),
    ("no-room-whole-both-stream-and-share-the-rest", [toy_model("e", 1299), toy_model("f", 2000)],
     [toy_slot(usable=1600)], {"e": ("elastic", 3, "ExceedsBudget"), "f": ("elastic", 3, "ExceedsFreeSpace")}),
    ("no-room-even-to-stream-is-no-capacity", [toy_model("e", 1299), toy_model("f", 2000)],
     [toy_slot(usable=900)], {"e": ("elastic", 4, "ExceedsBudget"), "f": ("refused", 0, "NoCapacity")}),
    ("unknown-gpu-product-refused", [toy_model("a", 2000, product="NVIDIA-NONE")], [toy_slot()],
     {"a": ("refused", 0, "NoMatchingGPU")}),
    ("no-inventory-refused", [toy_model("a", 2000, product=None)], [], {"a": ("refused", 0, "NoMatchingGPU")}),
]


@pytest.mark.parametrize("models,slots,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_modes(models, slots, expected):
    got, _ = run(models, slots)
    assert {n: (d.mode, d.resident_layers, d.reason_code) for n, d in got.items()} == expected


def test_empty_input_gives_empty_plan():
    _, result = run([], [])
    assert result.decisions == () and result.pending == ()


def test_model_without_profile_waits_for_profiling_and_is_not_guessed():
    got, result = run([toy_model("a", 2000, model="org/unprofiled")])
    assert got == {}
    assert [(p.name, p.gpu_product, p.reason_code) for p in result.pending] == [("a", "NVIDIA-TEST", "AwaitingProfile")]


def test_profile_of_another_revision_is_not_used():
    pinned = replace(toy_model("a", 2000), revision="v2")
    got, result = run([pinned])
    assert got == {}
    assert [(p.name, p.revision) for p in result.pending] == [("a", "v2")]
    assert "org/toy@v2" in result.pending[0].reason
    got, _ = run([pinned], profiles=(P, replace(P, revision="v2")))
    assert got["a"].mode == "resident"


def test_refusal_below_minimum_names_missing_bytes_and_the_fix():
    got, _ = run([toy_model("a", 499)])
    assert "1 bytes missing" in got["a"].reason
    assert "at least 500 bytes" in got["a"].reason


def test_slo_that_cannot_be_met_is_reported_with_both_numbers():
    got, _ = run([toy_model("a", 2000, tpot_ms=5)])
    assert got["a"].slo_met is False
    assert "TPOT 10 ms > 5 ms" in got["a"].reason


def test_slo_met_and_absent_slo():
    got, _ = run([toy_model("a", 2000, tpot_ms=50), toy_model("b", 2000)])
    assert got["a"].slo_met is True
    assert got["b"].slo_met is None


def test_swap_prediction_adds_swap_in_to_ttft():
    got, _ = run([toy_model("a", 2000), toy_model("b", 2000)], [toy_slot(usable=2000)])
    resident = cost.predict_resident(P, toy_model("a", 2000).slo)
    assert got["a"].predicted.swap_in_ms == pytest.approx(1200.0)  # 1,200 bytes at 1,000 bytes/s
    # worst case: b was just swapped in: its swap-in, minimum residency, draining 256 steps of 10 ms
    b_turn = 1200.0 + cost.MIN_RESIDENCY_MS + cost.SWAP_DRAIN_TOKENS * 10.0
    assert got["a"].predicted.ttft_ms == pytest.approx(resident.ttft_ms + b_turn + 1200.0)


def test_elastic_tpot_is_bound_by_streamed_bytes():
    got, _ = run([toy_model("a", 1299)])
    assert got["a"].predicted.tpot_ms == pytest.approx(300.0)  # 3 streamed layers × 100 bytes at 1,000 B/s


def test_swap_breaking_slo_keeps_that_model_resident():
    # Room for one resident (1,300) plus one swap area (1,300). Without an SLO "a-first" would
    # stay resident by name order; "z-slo" has a TTFT a 1.2 s swap-in would break.
    models = [toy_model("a-first", 2000), toy_model("m-middle", 2000), toy_model("z-slo", 2000, ttft_ms=100)]
    got, _ = run(models, [toy_slot(usable=2700)])
    assert got["z-slo"].mode == "resident" and got["z-slo"].slo_met is True
    assert {got["a-first"].mode, got["m-middle"].mode} == {"swap"}


def test_model_keeps_its_previous_slot_when_inputs_are_unchanged():
    slots = [toy_slot("node-a", 3000), toy_slot("node-b", 3000)]
    first, _ = run([toy_model("a", 2000)], slots)
    moved = replace(first["a"], slot="node-b/gpu0")
    got, _ = run([toy_model("a", 2000), toy_model("b", 2000)], slots, previous={("llm", "a"): moved})
    assert got["a"].slot == "node-b/gpu0" and "moved" not in got["a"].reason
    assert got["b"].mode == "resident"


def test_changed_budget_drops_stickiness():
    slots = [toy_slot("node-a", 3000), toy_slot("node-b", 3000), toy_slot("node-c", 3000)]
    fresh = run([toy_model("a", 2000)], slots)[0]["a"].slot
    elsewhere = next(s.id for s in slots if s.id != fresh)
    kept = replace(run([toy_model("a", 2000)], slots)[0]["a"], slot=elsewhere)
    got, _ = run([toy_model("a", 2000)], slots, previous={("llm", "a"): kept})
    assert got["a"].slot == elsewhere  # unchanged: keeps its slot although a fresh plan would pick another
    changed = replace(kept, budget_bytes=1999)
    got, _ = run([toy_model("a", 2000)], slots, previous={("llm", "a"): changed})
    assert got["a"].slot == fresh  # its own input changed: planned as new
    assert "moved" not in got["a"].reason


# ---------------------------------------------------------------------------------- properties

fleet = st.lists(
    st.tuples(st.integers(300, 4000), st.integers(1, 400), st.integers(0, 4)),  # budget, context, slot hint
    min_size=1, max_size=12,
)
slot_sizes = st.lists(st.integers(500, 6000), min_size=1, max_size=4)


def _inputs(specs, sizes) -> Inputs:
    models = tuple(toy_model(f"m{i}", b, context=c) for i, (b, c, _) in enumerate(specs))
    slots = tuple(toy_slot(f"node-{i}", s) for i, s in enumerate(sizes))
    return Inputs(models=models, profiles=(P,), slots=slots)


def _occupancy(decisions: tuple[Decision, ...]) -> dict[str, int]:
    used: dict[str, int] = {}
    swap: dict[str, int] = {}
    for d in decisions:
        if d.mode in ("resident", "elastic"):
            used[d.slot] = used.get(d.slot, 0) + d.footprint_bytes
        elif d.mode == "swap":
            swap[d.slot] = max(swap.get(d.slot, 0), d.need_bytes)
    return {s: used.get(s, 0) + swap.get(s, 0) for s in set(used) | set(swap)}


@settings(max_examples=150, deadline=None)
@given(fleet, slot_sizes)
def test_never_overcommits_a_slot(specs, sizes):
    inputs = _inputs(specs, sizes)
    usable = {s.id: s.usable_bytes for s in inputs.slots}
    for slot, used in _occupancy(plan(inputs).decisions).items():
        assert used <= usable[slot]


@settings(max_examples=150, deadline=None)
@given(fleet, slot_sizes)
def test_elastic_slice_stays_within_budget_and_every_model_is_decided(specs, sizes):
    inputs = _inputs(specs, sizes)
    decisions = plan(inputs).decisions
    assert len(decisions) == len(inputs.models)
    for d in decisions:
        if d.mode == "elastic":
            assert d.footprint_bytes <= d.budget_bytes
            assert d.resident_layers < d.total_layers
        if d.mode == "swap":
            assert sum(1 for o in decisions if o.slot == d.slot and o.mode == "swap") >= 2


@settings(max_examples=100, deadline=None)
@given(fleet, slot_sizes, st.randoms(use_true_random=False))
def test_shuffled_input_gives_the_same_plan(specs, sizes, rnd: random.Random):
    inputs = _inputs(specs, sizes)
    shuffled = Inputs(models=tuple(rnd.sample(inputs.models, len(inputs.models))), profiles=inputs.profiles,
                      slots=tuple(rnd.sample(inputs.slots, len(inputs.slots))))
    assert plan(shuffled) == plan(inputs)


RANK = {"resident": 0, "swap": 1, "elastic": 2, "refused": 3}


@settings(max_examples=150, deadline=None)
@given(st.integers(300, 3000), st.integers(1, 2000), st.integers(1, 400), st.integers(500, 4000))
def test_larger_budget_never_gives_a_worse_mode(budget, extra, context, usable):
    alone = [toy_slot(usable=usable)]
    before, _ = run([toy_model("a", budget, context=context)], alone)
    after, _ = run([toy_model("a", budget + extra, context=context)], alone)
    assert RANK[after["a"].mode] <= RANK[before["a"].mode]
    if before["a"].mode == after["a"].mode == "elastic":
        assert after["a"].resident_layers >= before["a"].resident_layers


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(300, 3000), st.integers(1, 300)), min_size=2, max_size=5),
       st.lists(st.integers(500, 5000), min_size=1, max_size=2), st.integers(1, 2000))
def test_larger_budget_never_gives_a_worse_mode_beside_other_models(specs, sizes, extra):
    slots = [toy_slot(f"node-{i}", s) for i, s in enumerate(sizes)]
    models = [toy_model(f"m{i}", b, context=c) for i, (b, c) in enumerate(specs)]
    before, _ = run(models, slots)
    grown = [replace(models[0], budget_bytes=models[0].budget_bytes + extra)] + models[1:]
    after, _ = run(grown, slots)
    assert RANK[after["m0"].mode] <= RANK[before["m0"].mode], (before["m0"].reason, after["m0"].reason)
    if before["m0"].mode == after["m0"].mode == "elastic":
        assert after["m0"].resident_layers >= before["m0"].resident_layers


@settings(max_examples=300, deadline=None)
@given(fleet, slot_sizes)
def test_replanning_with_its_own_decisions_changes_nothing(specs, sizes):
    """A pass with nothing new must commit nothing: the plan is a fixed point of its own stickiness."""
    inputs = _inputs(specs, sizes)
    first = plan(inputs)
    again = plan(inputs, {d.key: d for d in first.decisions})
    assert again == first
