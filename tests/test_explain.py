"""`explain` and refusal reasons give advice that can work: no budget where the GPU is the limit."""
from __future__ import annotations

from controller.planning.explain import explain
from controller.planning.plan import plan
from controller.types import Inputs
from tests.factories import toy_model, toy_profile, toy_slot

P = toy_profile()  # need 1,300 at 100 tokens; elastic minimum 500


def explained(models, slots, name):
    inputs = Inputs(models=tuple(models), profiles=(P,), slots=tuple(slots))
    result = plan(inputs)
    return explain(inputs, result, name), {d.name: d for d in result.decisions}


def test_elastic_minimum_beyond_the_gpu_says_no_budget_helps():
    text, got = explained([toy_model("a", 10_000)], [toy_slot(usable=499)], "a")
    assert got["a"].reason_code == "BudgetBelowElasticMinimum"
    assert "No budget helps" in got["a"].reason and "Raise memoryBudget" not in got["a"].reason
    assert "- no budget: even streaming every layer needs" in text


def test_budget_below_minimum_on_a_big_enough_gpu_names_the_budget_to_ask_for():
    text, got = explained([toy_model("a", 499)], [toy_slot(usable=10_000)], "a")
    assert "Raise memoryBudget to at least 500 bytes" in got["a"].reason
    assert "- at 500B (500 bytes) or more it runs elastic" in text


def test_streaming_for_lack_of_room_names_the_neighbour_that_holds_it():
    # e (budget 1,299 < need) and f (fits its budget) on 1,600: both stream; f would run whole if e moved
    text, got = explained([toy_model("e", 1299), toy_model("f", 2000)], [toy_slot(usable=1600)], "f")
    assert got["f"].reason_code == "ExceedsFreeSpace"
    assert "- no budget: it already covers the need" in text
    assert "keeps one more" not in text
    assert "Neighbours on node-a/gpu0: llm/e (elastic, 800B)" in text
    assert "To run resident it needs 1.3Ki on node-a/gpu0, where 1.1Ki is left to it (elastic neighbours at their " \
           "minimum): 200 bytes short." in text
    assert "- it fits if llm/e (elastic, 800B) moves to another GPU\n" in text  # its minimum alone is too big


def test_no_capacity_names_the_neighbours_and_the_bytes_short():
    text, got = explained([toy_model("e", 1299), toy_model("f", 2000)], [toy_slot(usable=900)], "f")
    assert got["f"].reason_code == "NoCapacity"
    assert "Not elastic: its elastic minimum 500B is more than any slot has free" in text
    assert "lower memoryBudget to run elastic" not in got["f"].reason
    assert "Neighbours on node-a/gpu0: llm/e (elastic, 900B)" in text
    # the refusal's own numbers and the neighbours' agree: e at its minimum (500) leaves 400 of 900
    assert "the most any slot had left is 400B (1 slots): 100 bytes missing" in got["f"].reason
    assert "where 400B is left to it (elastic neighbours at their minimum): 100 bytes short" in text
    assert "- it fits if llm/e (elastic, 900B) moves to another GPU" in text


def test_link_share_refusal_names_the_streaming_neighbours_and_the_budget_that_admits_it():
    models = [toy_model(n, 500, tpot_ms=2500) for n in ("a", "b", "c")]
    text, got = explained(models, [toy_slot(usable=3000)], "c")
    assert got["c"].reason_code == "LinkShareTooSmall"
    assert "The link of node-a/gpu0 would be shared 3 ways: 3.33333e-07 GB/s each (streaming there: llm/a, llm/b)" in text
    assert "- or relax slo.tpotMs to 3000 ms" in text
    text_a, _ = explained(models, [toy_slot(usable=3000)], "a")
    assert "Link: streams at 5e-07 GB/s, its share of the 1e-06 GB/s host→device link with the elastic models " \
           "llm/a, llm/b" in text_a


def test_host_ram_is_shown_for_a_swap_member():
    from dataclasses import replace
    slot = replace(toy_slot(usable=1300), host_memory_bytes=10_000)
    text, got = explained([toy_model("a", 2000), toy_model("b", 2000)], [slot], "a")
    assert got["a"].mode == "swap" and got["a"].host_bytes == 1200
    assert "Host RAM: pins 1.2Ki; node node-a pins 2.3Ki of 9.8Ki" in text
    assert "- or its one swap partner llm/b moves to another GPU: it then runs resident" in text
    assert "SLO" not in text.split("Neighbours")[0].split("Predicted")[0]
