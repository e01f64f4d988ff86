"""Opening capacity: models no existing GPU takes go to a GPU of a pool node that does not exist yet.

Table cases and properties of controller.planning.plan with gpus.yaml pools (controller.planning.capacity):
the cheapest pool that can serve, an opened node's GPUs filled before another opens, maxNodes and the
named refusal, minNodes as existing capacity, the cluster's idle nodes, no placed model moved, both
regimes (exact and greedy) alike, and the determinism and fixed-point properties the planner keeps.
"""
from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.quantity import paste_quantity
from controller.planning.plan import plan
from controller.types import Inputs, Pool
from tests.factories import PRODUCT, toy_model, toy_profile, toy_slot

# need 2,100 bytes whole (embeddings and head 500 each, ten layers of 100, KV 100); elastic minimum 1,300
P = toy_profile(embedding=500, head=500)
OTHER = "NVIDIA-OTHER"
P_OTHER = toy_profile(embedding=500, head=500, product=OTHER)
NO_SWAP = 1.0  # a TTFT target no swap-in meets: these models never swap


def pool(name: str = "small", *, memory: int = 4500, gpus: int = 2, least: int = 0, most: int = 3,
         product: str = PRODUCT, host: int | None = None) -> Pool:
    return Pool(name=name, product=product, memory_bytes=memory, gpus_per_node=gpus, host_memory_bytes=host,
                min_nodes=least, max_nodes=most, selector=("karpenter.sh/nodepool", name), reserved_bytes=0)


def models(n: int, budget: int = 5000, **kw) -> tuple:
    return tuple(toy_model(f"m{i}", budget, ttft_ms=NO_SWAP, **kw) for i in range(n))


def inputs(fleet, slots=(), pools=(), prices=(), nodes=(), profiles=(P,)) -> Inputs:
    return Inputs(models=tuple(fleet), profiles=tuple(profiles), slots=tuple(slots), pools=tuple(pools),
                  prices=tuple(prices), pool_nodes=tuple(nodes))


def by_name(result):
    return {d.name: d for d in result.decisions}


def nodes_used(result) -> set[str]:
    return {d.slot.split("/")[0] for d in result.decisions if d.pool is not None}


@pytest.mark.parametrize("method", ["exact", "greedy"])
def test_a_model_no_existing_gpu_takes_is_placed_on_a_new_pool_node(method):
    result = plan(inputs(models(2), [toy_slot(usable=2500)], [pool()]), method=method)
    got = by_name(result)
    assert got["m0"].slot == "node-a/gpu0" and got["m0"].pool is None
    assert got["m1"].slot == "pool-small-0/gpu0" and got["m1"].pool == "small"
    assert got["m1"].mode == "resident"
    assert [s.id for s in result.pool_slots] == ["pool-small-0/gpu0", "pool-small-0/gpu1"]


@pytest.mark.parametrize("method", ["exact", "greedy"])
def test_an_opened_nodes_gpus_are_filled_before_another_node_opens(method):
    # four models of 2,100 bytes: one node of two 4,500-byte GPUs holds them, two resident on each
    result = plan(inputs(models(4), [], [pool()]), method=method)
    assert nodes_used(result) == {"pool-small-0"}
    assert {d.mode for d in result.decisions} == {"resident"}
    five = plan(inputs(models(5), [], [pool()]), method=method)
    assert nodes_used(five) == {"pool-small-0", "pool-small-1"}  # the fifth needs a second node


@pytest.mark.parametrize("method", ["exact", "greedy"])
def test_a_model_that_fits_whole_never_streams_on_a_new_node_but_one_whose_budget_says_so_does(method):
    result = plan(inputs(models(5), [], [pool()]), method=method)
    assert {d.mode for d in result.decisions} == {"resident"}  # a second node rather than a squeezed stream
    small = models(5, budget=1500)  # below the need: they stream by their budget, three to a GPU
    streaming = plan(inputs(small, [], [pool()]), method=method)
    assert {d.mode for d in streaming.decisions} == {"elastic"} and nodes_used(streaming) == {"pool-small-0"}


TOO_SMALL = [  # (case id, pools, prices, the second model's pool or None for refused, its mode)
    ("no-pool-gpu-holds-it-whole-it-streams-on-the-cheapest", [pool("small", memory=1500, gpus=1)], (), "small",
     "elastic"),
    ("a-dearer-pool-that-holds-it-whole-takes-it-whole", [pool("small", memory=1500, gpus=1), pool("big")],
     ((PRODUCT, 1.0),), "big", "resident"),
    ("no-pool-gpu-holds-its-elastic-minimum", [pool("tiny", memory=1200, gpus=1)], (), None, "refused"),
]


@pytest.mark.parametrize("method", ["exact", "greedy"])
@pytest.mark.parametrize("pools, prices, expected_pool, mode", [c[1:] for c in TOO_SMALL],
                         ids=[c[0] for c in TOO_SMALL])
def test_a_model_that_fits_whole_only_on_a_full_fixed_gpu_streams_on_a_new_node(method, pools, prices,
                                                                                 expected_pool, mode):
    # two models of need 2,100 (elastic minimum 1,300): the fixed GPU (2,500) holds one whole, and the other
    # fits whole on no pool GPU but the big pool's
    fleet = models(2, budget=2100)
    result = plan(inputs(fleet, [toy_slot(usable=2500)], pools, prices), method=method)
    fixed, other = sorted(result.decisions, key=lambda d: d.pool is not None or d.mode == "refused")
    assert (fixed.slot, fixed.mode) == ("node-a/gpu0", "resident")
    assert (other.pool, other.mode) == (expected_pool, mode), other.reason


@pytest.mark.parametrize("method", ["exact", "greedy"])
def test_a_new_model_that_streams_on_any_pool_gpu_opens_a_node_rather_than_moving_a_placed_one(method):
    # the last plan: m0 on the fixed GPU with room beside it, m1 and m2 on the pool's two nodes (minNodes 2); the
    # new model fits whole only on the fixed GPU, beside nothing: a third node opens for it, and nothing moves
    fleet = [toy_model(f"m{i}", 1201, context=1, ttft_ms=NO_SWAP if i % 2 else None) for i in range(3)]
    data = inputs(fleet, [toy_slot("fixed-0", 2500)], [pool(memory=1500, gpus=1, least=2, most=6)])
    first = plan(data, method=method)
    grown = replace(data, models=(*data.models, toy_model("zz-new", 2100, ttft_ms=NO_SWAP)))
    second = by_name(plan(grown, {d.key: d for d in first.decisions}, method=method))
    assert [(second[d.name].slot, second[d.name].mode) for d in first.decisions] == \
        [(d.slot, d.mode) for d in first.decisions]
    assert second["zz-new"].mode == "elastic" and second["zz-new"].pool == "small"


def test_existing_gpus_are_filled_first_streaming_a_model_there_before_a_node_opens():
    # an existing GPU with room for one model whole and a second's elastic minimum: no node is opened
    fixed = [toy_slot(usable=3500)]
    result = plan(inputs(models(2), fixed, [pool()]), method="greedy")
    assert nodes_used(result) == set() and sorted(d.mode for d in result.decisions) == ["elastic", "resident"]


@pytest.mark.parametrize("method", ["exact", "greedy"])
def test_the_pool_that_costs_least_per_month_opens_the_node(method):
    cheap, dear = pool("cheap", product=OTHER), pool("dear")
    fleet = [toy_model("a", 5000, ttft_ms=NO_SWAP, product=None)]
    for prices, expected in (((("NVIDIA-OTHER", 1.0), (PRODUCT, 2.0)), "cheap"),
                             (((PRODUCT, 1.0), ("NVIDIA-OTHER", 2.0)), "dear")):
        result = plan(inputs(fleet, [], [cheap, dear], prices, profiles=(P, P_OTHER)), method=method)
        assert by_name(result)["a"].pool == expected, prices


def test_a_pool_without_a_price_opens_only_after_every_priced_one():
    priced, unpriced = pool("priced", product=OTHER), pool("unpriced")
    fleet = [toy_model("a", 5000, ttft_ms=NO_SWAP, product=None)]
    for method in ("exact", "greedy"):
        result = plan(inputs(fleet, [], [priced, unpriced], (("NVIDIA-OTHER", 50.0),), profiles=(P, P_OTHER)),
                      method=method)
        assert by_name(result)["a"].pool == "priced"


@pytest.mark.parametrize("method", ["exact", "greedy"])
def test_max_nodes_reached_refuses_with_the_pool_its_limit_and_the_bytes_missing(method):
    # one node of one 2,500-byte GPU: one model; the second is refused naming the pool
    result = plan(inputs(models(2), [], [pool(memory=2500, gpus=1, most=1)]), method=method)
    refused = [d for d in result.decisions if d.mode == "refused"]
    assert len(refused) == 1
    d = refused[0]
    assert d.reason_code == "PoolLimitReached"
    assert "pool small" in d.reason and "maxNodes 1" in d.reason and "(1 node(s) planned)" in d.reason
    assert f"Missing: {paste_quantity(900)}" in d.reason  # its elastic minimum 1,300 bytes, 400 left on its GPU
    assert "Raise maxNodes of pool small" in d.reason


def test_a_model_no_pool_node_can_hold_is_refused_for_capacity_not_for_the_limit():
    fleet = [toy_model("huge", 50_000, ttft_ms=NO_SWAP, context=40_000)]  # its elastic minimum exceeds a GPU
    result = plan(inputs(fleet, [toy_slot(usable=2500)], [pool(most=0)]))
    assert by_name(result)["huge"].reason_code in ("BudgetBelowElasticMinimum", "NoCapacity")


@pytest.mark.parametrize("method", ["exact", "greedy"])
def test_min_nodes_are_existing_capacity_filled_before_a_node_is_added_and_kept_empty(method):
    result = plan(inputs(models(1), [], [pool(least=1)]), method=method)
    assert by_name(result)["m0"].slot.startswith("pool-small-0/")
    empty = plan(inputs((), [], [pool(least=2)]), method=method)
    assert [s.node for s in empty.pool_slots] == ["pool-small-0"] * 2 + ["pool-small-1"] * 2


def test_the_clusters_idle_pool_nodes_are_used_before_a_node_is_added():
    # the cluster has two nodes of the pool: the plan keeps only those its models use
    result = plan(inputs(models(1), [], [pool()], nodes=(("small", 2),)), method="greedy")
    assert nodes_used(result) == {"pool-small-0"}
    assert {s.node for s in result.pool_slots} == {"pool-small-0"}


def test_a_pool_node_no_planned_model_uses_drops_out_of_the_plan():
    first = plan(inputs(models(3), [], [pool()]), method="greedy")
    assert {s.node for s in first.pool_slots} == {"pool-small-0"}
    gone = plan(inputs((), [], [pool()]), {d.key: d for d in first.decisions}, method="greedy")
    assert gone.pool_slots == ()


@pytest.mark.parametrize("method", ["exact", "greedy"])
def test_opening_capacity_never_moves_a_placed_model(method):
    fleet = models(4)
    first = plan(inputs(fleet, [toy_slot(usable=4500)], [pool()]), method=method)
    big = toy_model("new", 5000, ttft_ms=NO_SWAP, context=1000)
    second = plan(inputs([*fleet, big], [toy_slot(usable=4500)], [pool()]), {d.key: d for d in first.decisions},
                  method=method)
    after = by_name(second)
    for d in first.decisions:
        a = after[d.name]
        assert (a.slot, a.mode, a.resident_layers) == (d.slot, d.mode, d.resident_layers), d.name
    assert after["new"].mode != "refused" and after["new"].pool == "small"


def test_a_lowered_max_nodes_replans_the_models_of_the_nodes_beyond_it():
    first = plan(inputs(models(6), [], [pool(memory=2500, gpus=1, most=6)]), method="greedy")
    assert len(nodes_used(first)) == 6
    second = plan(inputs(models(6), [], [pool(memory=2500, gpus=1, most=4)]), {d.key: d for d in first.decisions},
                  method="greedy")
    assert len(nodes_used(second)) == 4
    assert sum(d.reason_code == "PoolLimitReached" for d in second.decisions) == 2


# ---------------------------------------------------------------------------------- properties

pool_fleet = st.lists(st.tuples(st.integers(600, 5000), st.integers(1, 300)), min_size=1, max_size=9)
pool_shapes = st.tuples(st.integers(1500, 6000), st.integers(1, 3), st.integers(0, 2), st.integers(0, 4))


def _pool_inputs(specs, shape, fixed=1) -> Inputs:
    memory, gpus, least, extra = shape
    fleet = [toy_model(f"m{i}", b, context=c, ttft_ms=NO_SWAP if i % 2 else None) for i, (b, c) in enumerate(specs)]
    return inputs(fleet, [toy_slot(f"fixed-{i}", 2500) for i in range(fixed)],
                  [pool(memory=memory, gpus=gpus, least=least, most=least + extra)])


@settings(max_examples=120, deadline=None)
@given(pool_fleet, pool_shapes, st.sampled_from(["auto", "greedy"]))
def test_pool_plans_never_overcommit_and_stay_within_max_nodes(specs, shape, method):
    data = _pool_inputs(specs, shape)
    result = plan(data, method=method)
    assert len(result.decisions) == len(data.models)
    usable = {s.id: s.usable_bytes for s in (*data.slots, *result.pool_slots)}
    used: dict[str, int] = {}
    swap: dict[str, int] = {}
    for d in result.decisions:
        if d.mode in ("resident", "elastic"):
            used[d.slot] = used.get(d.slot, 0) + d.footprint_bytes
        elif d.mode == "swap":
            swap[d.slot] = max(swap.get(d.slot, 0), d.need_bytes)
    for slot in set(used) | set(swap):
        assert used.get(slot, 0) + swap.get(slot, 0) <= usable[slot]
    assert len({s.node for s in result.pool_slots}) <= data.pools[0].max_nodes


@settings(max_examples=80, deadline=None)
@given(pool_fleet, pool_shapes, st.randoms(use_true_random=False))
def test_pool_plans_do_not_depend_on_input_order(specs, shape, rnd: random.Random):
    data = _pool_inputs(specs, shape, fixed=2)
    shuffled = replace(data, models=tuple(rnd.sample(data.models, len(data.models))),
                       slots=tuple(rnd.sample(data.slots, len(data.slots))))
    assert plan(shuffled, method="greedy") == plan(data, method="greedy")


@settings(max_examples=120, deadline=None)
@given(pool_fleet, pool_shapes, st.sampled_from(["auto", "greedy"]))
def test_replanning_a_pool_plan_with_its_own_decisions_changes_nothing(specs, shape, method):
    data = _pool_inputs(specs, shape)
    first = plan(data, method=method)
    assert plan(data, {d.key: d for d in first.decisions}, method=method) == first


@settings(max_examples=80, deadline=None)
@given(pool_fleet, pool_shapes, st.integers(600, 5000))
def test_a_new_model_never_moves_a_placed_one_when_a_pool_can_take_it(specs, shape, budget):
    data = _pool_inputs(specs, shape)
    data = replace(data, pools=(replace(data.pools[0], max_nodes=data.pools[0].max_nodes + len(specs) + 1),))
    first = plan(data, method="greedy")
    grown = replace(data, models=(*data.models, toy_model("zz-new", budget, ttft_ms=NO_SWAP)))
    second = by_name(plan(grown, {d.key: d for d in first.decisions}, method="greedy"))
    for d in first.decisions:
        if d.mode != "refused":
            a = second[d.name]
            assert (a.slot, a.mode, a.resident_layers) == (d.slot, d.mode, d.resident_layers), d.name
