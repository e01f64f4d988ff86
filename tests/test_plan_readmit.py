"""The greedy regime makes room for what its first placement refused (issue 33, item 4; controller/planning/readmit.py).

Fleets of the issue's shape, too large for the exact search (9 models on 5 GPUs: 45 model×slot pairs), built from
the project's estimated profiles (examples/fleet/profiles, contract/estimate.py): five NVIDIA-L4 GPUs, one per
node with 64 GiB of host RAM, three Llama-3.1-8B, five Qwen2.5-32B and one Llama-3.1-70B, each with a TPOT
target. The 70B pins 137 GB of streamed layers, more than a node has: no plan serves it.

- "only-the-70b": the 8B models stream (their 16 GiB budget is below their 17.6 GB need at 4096 tokens × 2)
  and two of the 32B models have a 2 s TPOT target, which only a quiet GPU meets. Before the repair the greedy
  refused those two with LinkShareTooSmall and the 70B with HostMemoryFull, as the issue reports; now one 8B
  and one 6 s 32B share each of three GPUs and the 2 s ones stream alone: only the 70B is refused.
- "8b-resident-two-share-a-swap-group": the 8B models fit whole, as in the issue: before, each ran resident on
  a GPU of its own and two 32B models were refused with LinkShareTooSmall; now two 8B models share a swap group
  and a 32B model streams on the GPU that frees. The exact search, forced, refuses as many.

Each plan meets every limit (GPU bytes, host RAM, swap wait, link share), is a fixed point (re-planned with its
own decisions nothing moves) and does not depend on the order of the models.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.cli.report import as_json as plan_json
from controller.inputs.reader import load_repo
from controller.planning import plan as plan_module
from controller.planning.plan import plan
from controller.types import SLO, ElasticModel, GpuSlot, Inputs
from tests.test_plan_slo_limits import _assert_limits_agree

GiB = 1 << 30
L4 = "NVIDIA-L4"
PROFILES = tuple(p for p in load_repo(Path(__file__).resolve().parent.parent / "examples" / "fleet").profiles
                 if p.gpu_product == L4)
LLAMA_8B, QWEN_32B, LLAMA_70B = ("meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-32B-Instruct",
                                 "meta-llama/Llama-3.1-70B-Instruct")


def model(name: str, model_id: str, budget_gib: int, context: int, tpot_ms: float | None, *, concurrency: int = 1,
          ttft_ms: float | None = None) -> ElasticModel:
    return ElasticModel(name=name, namespace="llm", model=model_id, budget_bytes=budget_gib * GiB,
                        slo=SLO(context_tokens=context, concurrency=concurrency, ttft_ms=ttft_ms, tpot_ms=tpot_ms),
                        gpu_product=L4, has_slo=tpot_ms is not None or ttft_ms is not None)


def fleet(llamas: list[ElasticModel], qwens: list[ElasticModel]) -> Inputs:
    slots = tuple(GpuSlot(node=f"l4-{i}", index=0, product=L4, memory_bytes=23034 * 2**20, host_memory_bytes=64 * GiB)
                  for i in range(5))
    big = model("llama-70b", LLAMA_70B, 24, 4096, 10000.0)
    return Inputs(models=tuple(llamas + qwens + [big]), profiles=PROFILES, slots=slots)


CASES = {
    "only-the-70b": (fleet(
        [model(f"llama-8b-{i}", LLAMA_8B, 16, 4096, 150.0, concurrency=2, ttft_ms=3000.0) for i in range(3)],
        [model(f"qwen-32b-{i}", QWEN_32B, 24, 512, 6000.0) for i in range(3)]
        + [model(f"qwen-32b-{i}", QWEN_32B, 24, 512, 2000.0) for i in (3, 4)]), 1),
    "8b-resident-two-share-a-swap-group": (fleet(
        [model(f"llama-8b-{i}", LLAMA_8B, 24, 256, 150.0) for i in range(3)],
        [model("qwen-32b-0", QWEN_32B, 24, 256, 9000.0)]
        + [model(f"qwen-32b-{i}", QWEN_32B, 24, 256, 2000.0) for i in range(1, 5)]), 2),
}


def _refused(result) -> dict[str, str]:
    return {d.name: d.reason_code for d in result.decisions if d.mode == "refused"}


def test_the_issue_fleets_are_planned_by_the_greedy_regime():
    for inputs, _ in CASES.values():
        pairs = len(inputs.models) * len(inputs.slots)
        assert len(inputs.models) > plan_module.EXACT_MAX_MODELS or pairs > plan_module.EXACT_MAX_PAIRS


def test_only_the_70b_is_refused_and_every_model_the_issue_saw_refused_is_placed():
    inputs, _ = CASES["only-the-70b"]
    decisions = {d.name: d for d in plan(inputs).decisions}
    assert _refused(plan(inputs)) == {"llama-70b": "NoCapacity"}
    assert {decisions[f"qwen-32b-{i}"].mode for i in range(5)} == {"elastic"}
    for i in (3, 4):  # the 2 s targets stream alone on their GPU, and meet them
        alone = [d for d in decisions.values() if d.slot == decisions[f"qwen-32b-{i}"].slot]
        assert len(alone) == 1 and decisions[f"qwen-32b-{i}"].predicted.tpot_ms <= 2000.0


def test_two_8b_models_share_a_swap_group_to_let_a_32b_stream():
    inputs, refused = CASES["8b-resident-two-share-a-swap-group"]
    result = plan(inputs)
    llamas = [d for d in result.decisions if d.name.startswith("llama-8b")]
    swapped = [d for d in llamas if d.mode == "swap"]
    assert len(swapped) == 2 and swapped[0].slot == swapped[1].slot
    assert len(_refused(result)) == refused and "llama-70b" in _refused(result)
    assert len(_refused(plan(inputs, method="exact"))) >= refused  # the exact search refuses no fewer


@pytest.mark.parametrize("inputs, refused", list(CASES.values()), ids=list(CASES))
def test_the_plan_meets_every_limit(inputs, refused):
    result = plan(inputs)
    assert len(_refused(result)) == refused
    _assert_every_limit(inputs, result)


def _assert_every_limit(inputs: Inputs, result) -> None:
    """GPU bytes per slot (a swap group takes its largest member's), pinned host RAM per node, and the swap wait
    and link share on the decisions' own figures."""
    usable = {s.id: s.usable_bytes for s in inputs.slots}
    node = {s.id: s.node for s in inputs.slots}
    for slot in usable:
        here = [d for d in result.decisions if d.slot == slot]
        used = (sum(d.footprint_bytes for d in here if d.mode in ("resident", "elastic"))
                + max((d.footprint_bytes for d in here if d.mode == "swap"), default=0))
        assert used <= usable[slot], slot
    for s in inputs.slots:
        pinned = sum(d.host_bytes for d in result.decisions if d.slot and node[d.slot] == s.node)
        assert s.host_memory_bytes is None or pinned <= s.host_memory_bytes, s.node
    _assert_limits_agree(inputs, result.decisions)


@pytest.mark.parametrize("inputs, refused", list(CASES.values()), ids=list(CASES))
def test_replanned_with_its_own_decisions_nothing_moves(inputs, refused):
    first = plan(inputs)
    again = plan(inputs, {d.key: d for d in first.decisions})
    assert [(d.name, d.slot, d.mode, d.resident_layers) for d in again.decisions] == \
        [(d.name, d.slot, d.mode, d.resident_layers) for d in first.decisions]
    assert not any("moved from" in d.reason for d in again.decisions)


@pytest.mark.parametrize("inputs, refused", list(CASES.values()), ids=list(CASES))
def test_the_plan_is_byte_identical_whatever_the_order_of_the_models(inputs, refused):
    expected = plan_json(plan(inputs))
    for seed in (1, 2):
        models = list(inputs.models)
        random.Random(seed).shuffle(models)
        shuffled = Inputs(models=tuple(models), profiles=tuple(reversed(inputs.profiles)),
                          slots=tuple(reversed(inputs.slots)))
        assert plan_json(plan(shuffled)) == expected
    assert json.loads(expected)


def _fleets():
    """3-10 models of the shipped shapes on 3-6 L4 GPUs (one or two per node, 64 GiB, 128 GiB or no host RAM
    limit), budgets that make them whole or stream, contexts, concurrency and TTFT/TPOT targets drawn."""
    one = st.tuples(st.sampled_from([LLAMA_8B, QWEN_32B, LLAMA_70B, "Qwen/Qwen2.5-0.5B-Instruct"]),
                    st.sampled_from([2, 8, 12, 16, 24]), st.sampled_from([256, 1024, 4096]), st.sampled_from([1, 2]),
                    st.sampled_from([None, 150.0, 1000.0, 2000.0, 6000.0]), st.sampled_from([None, None, 3000.0]))
    return st.tuples(st.lists(one, min_size=3, max_size=10), st.integers(3, 6), st.sampled_from([1, 2]),
                     st.sampled_from([None, 64, 128])).map(_fleet_of)


def _fleet_of(drawn) -> Inputs:
    specs, gpus, per_node, host = drawn
    slots = tuple(GpuSlot(node=f"l4-{i // per_node}", index=i % per_node, product=L4, memory_bytes=23034 * 2**20,
                          host_memory_bytes=None if host is None else host * GiB) for i in range(gpus))
    models = tuple(model(f"m{i}", m, budget, context, tpot, concurrency=c, ttft_ms=ttft)
                   for i, (m, budget, context, c, tpot, ttft) in enumerate(specs))
    return Inputs(models=models, profiles=PROFILES, slots=slots)


@settings(max_examples=40, deadline=None)
@given(inputs=_fleets())
def test_the_repair_never_refuses_more_and_its_plans_hold_every_limit(inputs):
    """Over generated fleets: the greedy with the repair refuses no more than without it (it keeps a move only
    with one fewer refused), its plan meets every limit, and re-planned with its own decisions nothing moves."""
    result = plan(inputs, method="greedy")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("controller.planning.greedy.readmit", lambda refused, *args, **kwargs: refused)
        without = plan(inputs, method="greedy")
    assert len(_refused(result)) <= len(_refused(without))
    _assert_every_limit(inputs, result)
    again = plan(inputs, {d.key: d for d in result.decisions}, method="greedy")
    assert [(d.slot, d.mode, d.resident_layers) for d in again.decisions] == \
        [(d.slot, d.mode, d.resident_layers) for d in result.decisions]
