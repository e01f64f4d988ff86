"""The bounds a right-sized budget never leaves, and whether more memory can answer a latency breach.

Owns `Limits`, computed once per model per pass from what the planner knows, pure:
- **ceiling**: the least of the largest usable memory of a GPU of the model's product (a budget
  above it could never be placed), `maxBudget`, and INT64_MAX (the budget is an int64 in every
  document that carries it);
- **floor**: the larger of the model's elastic minimum (every layer streamed: below it the worker
  refuses the model, contract.footprint) and `minBudget`. The recommender also never goes below
  the window's observed peak plus headroom (controller.rightsizing.recommender), unless the ceiling
  is lower: a `maxBudget` below the peak plus headroom is the budget, as the user capped it.
  A floor above the ceiling means any budget would be refused or unplaceable: the loop holds
  (WouldBeRefused) and says which bounds cross;
- **latency**: whether the planner's own predictions (controller.planning.cost) say more bytes
  lower the model's latency where it is placed: an elastic model keeping more layers resident
  predicts a lower TPOT/TTFT, a swap member made resident loses its swap-in. A resident model,
  or an elastic one whose step (not its streaming) sets its TPOT, gets nothing from memory: a
  latency breach then holds (MemoryWontHelp) with what would help instead.
Called by controller.rightsizing.step for each model; the recommender applies the Limits.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from contract.footprint import elastic_minimum
from contract.quantity import format_bytes
from controller.planning.cost import elastic_slice_at, predict_elastic, predict_resident, predict_swap
from controller.types import Decision, ElasticModel, GpuSlot, Profile

from controller.policy import Rightsizing

MIB = 1 << 20
INT64_MAX = (1 << 63) - 1
INT64_MAX_MIB = INT64_MAX // MIB * MIB  # budgets are whole MiB: the largest that is still an int64
MEMORY_BREACHES = frozenset({"KvNearReservation", "WorkerRefusal", "OutOfMemory"})  # more bytes fix these


@dataclass(frozen=True)
class Limits:
    ceiling: int = INT64_MAX_MIB
    floor: int = 0
    ceiling_why: str = "the int64 limit"
    floor_why: str = "zero"
    latency_helps: bool = False
    latency_why: str = "the planner has not placed the model, so it cannot say whether more memory lowers latency"

    def within(self, policy: Rightsizing) -> Limits:
        """These limits tightened by the policy's maxBudget and minBudget."""
        out = self
        if policy.max_budget is not None and policy.max_budget < out.ceiling:
            out = replace(out, ceiling=policy.max_budget, ceiling_why="maxBudget")
        if policy.min_budget is not None and policy.min_budget > out.floor:
            out = replace(out, floor=policy.min_budget, floor_why="minBudget")
        return out

    @property
    def crossed(self) -> str | None:
        """Why no budget can satisfy both bounds, or None."""
        if self.floor <= self.ceiling:
            return None
        return (f"the floor {format_bytes(self.floor)} ({self.floor_why}) is above the ceiling "
                f"{format_bytes(self.ceiling)} ({self.ceiling_why}): any budget would be refused or could not "
                "be placed; raise maxBudget, lower minBudget or the SLO's contextTokens/concurrency, or use a "
                "larger GPU product")


def limits_for(model: ElasticModel, policy: Rightsizing, decision: Decision | None, slots: Sequence[GpuSlot],
               profile: Profile | None) -> Limits:
    ceiling, ceiling_why = INT64_MAX_MIB, "the int64 limit"
    product = decision.gpu_product if decision is not None and decision.gpu_product else model.gpu_product
    usable = [s.usable_bytes for s in slots if s.product == product] if product else [s.usable_bytes for s in slots]
    if usable and max(usable) // MIB * MIB < ceiling:
        ceiling = max(usable) // MIB * MIB
        ceiling_why = f"the largest usable memory of a {product} GPU" if product else "the largest usable GPU memory"
    floor, floor_why = 0, "zero"
    if profile is not None:
        minimum = elastic_minimum(profile.terms, model.slo.context_tokens, model.slo.concurrency).total
        floor, floor_why = -(-minimum // MIB) * MIB, "the elastic minimum: every layer streamed"
    helps, why = latency_effect(model, decision, profile)
    return Limits(ceiling, floor, ceiling_why, floor_why, helps, why).within(policy)


def latency_effect(model: ElasticModel, decision: Decision | None, profile: Profile | None) -> tuple[bool, str]:
    """(more bytes lower the predicted latency, why) for the model as the planner placed it."""
    if decision is None or profile is None or decision.mode == "refused":
        return False, ("the planner has not placed the model with a profile, so it cannot say whether more memory "
                       "lowers latency; memory breaches (refusals, KV, OOM) still upsize")
    slo = model.slo
    if decision.mode == "swap":
        now, resident = predict_swap(profile, slo), predict_resident(profile, slo)
        if resident.ttft_ms < now.ttft_ms:
            return True, (f"as a swap member its predicted TTFT is {now.ttft_ms:g} ms; resident it would be "
                          f"{resident.ttft_ms:g} ms")
    if decision.mode == "elastic" and decision.resident_layers < decision.total_layers:
        now = predict_elastic(profile, slo, elastic_slice_at(profile, slo, decision.resident_layers))
        more = predict_elastic(profile, slo, elastic_slice_at(profile, slo, decision.resident_layers + 1))
        if more.tpot_ms < now.tpot_ms or more.ttft_ms < now.ttft_ms:
            return True, (f"with {decision.resident_layers + 1} of {decision.total_layers} layers resident its "
                          f"predicted TPOT goes from {now.tpot_ms:g} to {more.tpot_ms:g} ms")
        return False, (f"its predicted TPOT ({now.tpot_ms:g} ms) is set by its decode step, not by streaming: more "
                       "resident layers would not lower it. What would: a less loaded GPU, fewer co-tenants, or a "
                       "lower spec.slo.concurrency")
    return False, (f"it runs {decision.mode} with every layer on the GPU, so more memory cannot lower its latency. "
                   "What would: a less loaded GPU (fewer co-tenants sharing its steps), a faster GPU product, or a "
                   "lower spec.slo.concurrency")
