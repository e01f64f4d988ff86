"""Placement that meets SLOs (issue 23): the product chosen with the slot, SLO misses in the objective, and
the render-time rules known to the planner (one definition of a met SLO: tests/test_plan_slo_limits.py).

Each table case pins the slot its model must get, on both planners (exact and greedy), with a case id that says
what broke before. Real H200 and L4 profiles come from examples/fleet; the three-product case uses the toy
profile (tests/factories.py) on three products of different speeds.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from controller.inputs.reader import load_repo
from controller.planning import cost
from controller.planning.plan import plan
from controller.rendering.compose import compose
from controller.types import SLO, ElasticModel, GpuSlot, Inputs
from tests.factories import toy_model, toy_profile, toy_slot

FLEET = Path(__file__).resolve().parent.parent / "examples" / "fleet"
PROFILES = load_repo(FLEET).profiles
GiB = 1 << 30
H200, L4 = "NVIDIA-H200", "NVIDIA-L4"
METHODS = ["exact", "greedy"]
LLAMA_8B, QWEN_32B, QWEN_05B = ("meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-32B-Instruct",
                                "Qwen/Qwen2.5-0.5B-Instruct")


def real(name: str, model_id: str, budget_gib: float, *, product: str | None = H200, tpot: float | None = None,
         ttft: float | None = None, namespace: str = "llm", composition: str = "default") -> ElasticModel:
    return ElasticModel(name=name, namespace=namespace, model=model_id, budget_bytes=int(budget_gib * GiB),
                        slo=SLO(tpot_ms=tpot, ttft_ms=ttft), gpu_product=product, composition=composition,
                        has_slo=tpot is not None or ttft is not None)


def gpu(node: str, product: str = H200) -> GpuSlot:
    memory = {H200: 143771, L4: 23034}[product] * 2**20
    return GpuSlot(node, 0, product, memory)


def run(models, slots, profiles=PROFILES, method="auto"):
    result = plan(Inputs(models=tuple(models), profiles=tuple(profiles), slots=tuple(slots)), method=method)
    return {d.name if d.namespace == "llm" else f"{d.namespace}/{d.name}": d for d in result.decisions}, result


# ------------------------------------------------------------------- three products, toy profiles

FAST, SLOW, ROOMY = "NVIDIA-H200", "NVIDIA-L4", "NVIDIA-A100-SXM4-80GB"
TOYS = (toy_profile(product=FAST, decode_ms=5.0), toy_profile(product=SLOW, decode_ms=30.0),
        toy_profile(product=ROOMY, decode_ms=8.0),
        toy_profile("org/tiny", product=ROOMY, layers=1, layer_bytes=10, embedding=10, head=10, decode_ms=8.0))


CASES = [
    # id, models, slots, profiles, {name: expected slot} (or {method: {name: slot}}), {name: expected slo_met}
    ("8b-tpot-20ms-packed-beside-a-32b-while-a-second-h200-is-empty",
     [real("qwen-32b", QWEN_32B, 80), real("llama-8b", LLAMA_8B, 24, tpot=20)],
     [gpu("h200-a"), gpu("h200-b")], PROFILES,
     # the exact plan orders equally good slots by name; the greedy packs them together, then its SLO repair
     # moves the 8B out to the empty H200
     {"exact": {"llama-8b": "h200-a/gpu0", "qwen-32b": "h200-b/gpu0"},
      "greedy": {"llama-8b": "h200-b/gpu0", "qwen-32b": "h200-a/gpu0"}}, {"llama-8b": True}),
    ("small-model-without-a-product-went-to-the-busy-h200-not-the-empty-l4",
     [real("qwen-32b", QWEN_32B, 80), real("llama-8b", LLAMA_8B, 24), real("qwen-05b", QWEN_05B, 4, product=None,
                                                                           tpot=20)],
     [gpu("h200-a"), gpu("l4-a", L4)], PROFILES,
     {"qwen-32b": "h200-a/gpu0", "llama-8b": "h200-a/gpu0", "qwen-05b": "l4-a/gpu0"}, {"qwen-05b": True}),
    # the H200 (the largest GPU, preferred) has 400 bytes left (its elastic minimum is 500); the L4 is empty but
    # too slow for 20 ms; the A100 is 97 % free and meets it
    ("refused-on-the-h200-while-an-l4-is-empty-and-an-a100-is-97-percent-free",
     [toy_model("big", 1300, product=FAST), toy_model("tiny", 1000, model="org/tiny", product=ROOMY, context=10),
      toy_model("eight", 1300, product=None, tpot_ms=20)],
     [toy_slot("h200", 1700, product=FAST), toy_slot("l4", 1400, product=SLOW),
      toy_slot("a100", 1650, product=ROOMY)], TOYS,
     {"big": "h200/gpu0", "tiny": "a100/gpu0", "eight": "a100/gpu0"}, {"eight": True}),
    ("same-name-in-two-namespaces-packed-onto-one-worker-while-another-gpu-had-room",
     [real("chat", LLAMA_8B, 24), real("chat", LLAMA_8B, 24, namespace="zeta")],
     [gpu("h200-a"), gpu("h200-b")], PROFILES,
     {"chat": "h200-a/gpu0", "zeta/chat": "h200-b/gpu0"}, {}),
    ("two-compositions-packed-onto-one-gpu-while-another-had-room",
     [real("chat", LLAMA_8B, 24), real("coder", LLAMA_8B, 24, composition="hami")],
     [gpu("h200-a"), gpu("h200-b")], PROFILES,
     {"chat": "h200-a/gpu0", "coder": "h200-b/gpu0"}, {}),
]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("models,slots,profiles,where,met", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_model_gets_the_slot_that_meets_its_slo(method, models, slots, profiles, where, met):
    got, _ = run(models, slots, profiles, method)
    where = where.get(method, where)
    assert {n: got[n].slot for n in where} == where
    assert {n: got[n].slo_met for n in met} == met
    assert all(d.mode != "refused" for d in got.values())


def test_the_8b_alone_on_its_h200_is_predicted_at_its_own_step():
    got, _ = run([real("qwen-32b", QWEN_32B, 80), real("llama-8b", LLAMA_8B, 24, tpot=20)],
                 [gpu("h200-a"), gpu("h200-b")])
    profile = next(p for p in PROFILES
                   if p.model == LLAMA_8B and p.gpu_product == H200 and p.weight_dtype == "auto")
    assert got["llama-8b"].predicted.tpot_ms == cost.predict_resident(profile, SLO(tpot_ms=20)).tpot_ms


# ------------------------------------------------------------------- a rule the planner cannot place around

RULE_REFUSALS = [
    ("same-name-on-the-only-gpu-is-refused-with-the-rule",
     [real("chat", LLAMA_8B, 24), real("chat", LLAMA_8B, 24, namespace="zeta")], "zeta/chat", "ServedNameTaken",
     "change metadata.name or spec.servedNames"),
    ("second-composition-on-the-only-gpu-is-refused-with-the-rule",
     [real("chat", LLAMA_8B, 24), real("coder", LLAMA_8B, 24, composition="hami")], "coder", "MixedCompositions",
     "set spec.compositionRef.name to 'default'"),
]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("models,refused,code,fix", [c[1:] for c in RULE_REFUSALS], ids=[c[0] for c in RULE_REFUSALS])
def test_a_rule_no_slot_can_meet_refuses_with_its_reason_and_the_fix(method, models, refused, code, fix):
    got, result = run(models, [gpu("h200-a")], method=method)
    assert (got[refused].mode, got[refused].reason_code) == ("refused", code)
    assert fix in got[refused].reason
    # compose (what `validate` and a reconcile pass render) then has nothing left to refuse
    assert compose(models, result, [gpu("h200-a")]).errors == ()


# ------------------------------------------------------------------- explain

def test_explain_names_the_gpu_that_would_have_met_the_slo_and_why_it_is_not_there():
    """The 8B kept beside the 32B by the stability rule (its last decision given): explain names the empty H200
    that would have met its 20 ms and says the stability rule kept it."""
    from controller.planning.explain import explain
    models = [real("qwen-32b", QWEN_32B, 80), real("llama-8b", LLAMA_8B, 24, tpot=20)]
    slots = [gpu("h200-a"), gpu("h200-b")]
    inputs = Inputs(models=tuple(models), profiles=tuple(PROFILES), slots=tuple(slots[:1]))
    packed = plan(inputs)  # one H200 first: both on it
    result = plan(Inputs(models=tuple(models), profiles=tuple(PROFILES), slots=tuple(slots)),
                  {d.key: d for d in packed.decisions})
    eight = next(d for d in result.decisions if d.name == "llama-8b")
    assert (eight.slot, eight.slo_met) == ("h200-a/gpu0", False)
    text = explain(Inputs(models=tuple(models), profiles=tuple(PROFILES), slots=tuple(slots)), result, "llama-8b")
    assert "- h200-b/gpu0 (NVIDIA-H200) would have met it: TPOT" in text
    assert "the stability rule" in text


def test_the_bench_finds_a_model_refused_while_another_product_could_serve_it():
    """bench/plan_quality.py's check of "never a refusal while a GPU of another product could serve the model":
    a plan that kept the unpinned model on the full H200 (as if its product were fixed first) is caught, with the
    empty L4 it may run on; the planner's own plan is not. The big model is placed first (its last decision), and
    neither may stream beside the other (its TPOT target, the other's TTFT against a swap-in)."""
    from dataclasses import replace

    from bench.plan_quality import servable_elsewhere
    big = toy_model("big", 1300, product=FAST, tpot_ms=1000)
    other = toy_model("other", 1300, product=None, ttft_ms=1000)
    slots = (toy_slot("h200", 1400, product=FAST), toy_slot("l4", 1400, product=SLOW))
    first = plan(Inputs(models=(big,), profiles=TOYS, slots=slots))
    previous = {d.key: d for d in first.decisions}
    inputs = Inputs(models=(big, other), profiles=TOYS, slots=slots)
    fixed_first = plan(replace(inputs, models=(big, replace(other, gpu_product=FAST))), previous)
    assert [d.mode for d in fixed_first.decisions] == ["resident", "refused"]
    assert servable_elsewhere(inputs, fixed_first) == [("other", SLOW)]
    own = plan(inputs, previous)
    assert [d.slot for d in own.decisions] == ["h200/gpu0", "l4/gpu0"]
    assert servable_elsewhere(inputs, own) == []
