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


def test_streaming_for_lack_of_room_does_not_ask_for_more_budget():
    text, got = explained([toy_model("e", 1200), toy_model("f", 2000)], [toy_slot(usable=1900)], "f")
    assert got["f"].reason_code == "ExceedsFreeSpace"
    assert "- no budget: it already covers the need" in text
    assert "keeps one more" not in text


def test_no_capacity_explains_why_not_elastic_with_the_minimum():
    text, got = explained([toy_model("e", 1299), toy_model("f", 2000)], [toy_slot(usable=1600)], "f")
    assert got["f"].reason_code == "NoCapacity"
    assert "Not elastic: its elastic minimum 500B is more than any slot has free" in text
    assert "lower memoryBudget to run elastic" not in got["f"].reason
