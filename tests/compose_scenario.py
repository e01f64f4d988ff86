"""A small fixed pass for compose tests: resident, swap, elastic, refused and pending models,
three compositions, decisions built by hand so the golden tree does not move with the planner."""
from __future__ import annotations

from dataclasses import replace

from controller.inputs.load import DecisionRecord
from controller.inputs.tree import LastPass
from controller.types import SLO, Decision, ElasticModel, GpuSlot, Pending, Plan, Predicted

GIB = 1 << 30
H200, L4 = "NVIDIA-H200", "NVIDIA-L4"
SLOTS = (
    GpuSlot(node="node-a", index=0, product=H200, memory_bytes=141 * GIB),
    GpuSlot(node="node-b", index=0, product=L4, memory_bytes=24 * GIB),
    GpuSlot(node="node-b", index=1, product=L4, memory_bytes=24 * GIB),
)


def model(name: str, namespace: str = "llm", *, hub: str = "Qwen/Qwen2.5-0.5B-Instruct", budget: int = 8 * GIB,
          composition: str = "default", product: str | None = H200, tpot_ms: float | None = None) -> ElasticModel:
    return ElasticModel(name=name, namespace=namespace, model=hub, budget_bytes=budget,
                        slo=SLO(context_tokens=4096, concurrency=4, tpot_ms=tpot_ms), gpu_product=product,
                        composition=composition, has_slo=tpot_ms is not None)


def decide(m: ElasticModel, mode: str, slot: GpuSlot | None, *, need: int, footprint: int, layers: tuple[int, int] = (24, 24),
           tpot: float | None = 10.0, slo_met: bool | None = None, reason_code: str = "Fits") -> Decision:
    return Decision(
        name=m.name, namespace=m.namespace, model=m.model, gpu_product=slot.product if slot else m.gpu_product,
        slot=slot.id if slot else None, mode=mode, resident_layers=layers[0], total_layers=layers[1],
        need_bytes=need, budget_bytes=m.budget_bytes, footprint_bytes=footprint,
        predicted=None if tpot is None else Predicted(ttft_ms=120.0, tpot_ms=tpot, swap_in_ms=None),
        slo_met=slo_met, reason=f"{mode}: need {need} bytes", reason_code=reason_code,
        profile=f"profiles/{m.model.replace('/', '--')}--{slot.product if slot else 'none'}.yaml",
    )


CHAT = model("chat-small", tpot_ms=50.0)
CODER = model("coder", hub="Qwen/Qwen2.5-Coder-7B-Instruct", budget=20 * GIB)
SUMMARIZER = model("summarizer", hub="meta-llama/Llama-3.1-8B-Instruct", budget=20 * GIB)
BIG = model("big-70b", "research", hub="meta-llama/Llama-3.3-70B-Instruct", budget=20 * GIB, composition="kai", product=L4)
TINY = model("tiny", "research", hub="HuggingFaceTB/SmolLM2-135M", budget=2 * GIB, composition="hami", product=L4)
HUGE = model("huge", hub="deepseek-ai/DeepSeek-V3", budget=40 * GIB)
FRESH = model("fresh", hub="mistralai/Mistral-7B-Instruct-v0.3")
MODELS = (CHAT, CODER, SUMMARIZER, BIG, TINY, HUGE, FRESH)

DECISIONS = (
    decide(CHAT, "resident", SLOTS[0], need=2 * GIB, footprint=2 * GIB, tpot=8.5, slo_met=True),
    decide(CODER, "swap", SLOTS[0], need=18 * GIB, footprint=18 * GIB, layers=(28, 28)),
    decide(SUMMARIZER, "swap", SLOTS[0], need=19 * GIB, footprint=19 * GIB, layers=(32, 32)),
    decide(BIG, "elastic", SLOTS[1], need=150 * GIB, footprint=20 * GIB, layers=(9, 80), tpot=2600.0),
    decide(TINY, "resident", SLOTS[2], need=GIB, footprint=GIB, layers=(30, 30)),
    decide(HUGE, "refused", None, need=700 * GIB, footprint=0, layers=(0, 61), tpot=None, reason_code="BudgetTooSmall"),
)
PENDING = (Pending(name=FRESH.name, namespace=FRESH.namespace, model=FRESH.model, gpu_product=H200, revision="main",
                   reason="no profile of mistralai/Mistral-7B-Instruct-v0.3 on NVIDIA-H200 yet"),)
PLAN = Plan(decisions=DECISIONS, pending=PENDING)

RETIRED = model("retired")
PREVIOUS = {
    CHAT.key: replace(DECISIONS[0], mode="swap"),
    CODER.key: DECISIONS[1],
    RETIRED.key: decide(RETIRED, "resident", SLOTS[0], need=GIB, footprint=GIB),
}


def last_pass(previous: dict) -> LastPass:
    """The last pass as compose takes it, holding only these decisions (no spec, PLAN.md or tree)."""
    return LastPass(records={key: DecisionRecord(decision, None) for key, decision in previous.items()})


LAST = last_pass(PREVIOUS)
