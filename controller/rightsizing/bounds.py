"""The bounds a right-sized budget never leaves, and whether more memory can answer a latency breach.

Owns `Limits`, computed once per model per pass from what the planner knows, pure:
- **ceiling**: the least of the largest usable memory of a GPU of the model's product (a budget
  above it could never be placed), `maxBudget`, and INT64_MAX (the budget is an int64 in every
  document that carries it);
- **floor**: the larger of the model's elastic minimum (every layer streamed: below it the worker
  refuses the model, contract.footprint) and `minBudget`. The recommender also never goes below
  the observed peak plus headroom (controller.rightsizing.recommender): a downsize that a ceiling
  below it would cut there holds instead (MaxBudgetBelowUsage). A floor above the ceiling means any budget would be refused or unplaceable: the loop holds
  (WouldBeRefused) and says which bounds cross;
- **latency**: whether the planner's own predictions (controller.planning.cost) say more bytes
  lower the model's latency where it is placed: an elastic model keeping more layers resident
  predicts a lower TPOT/TTFT. A resident model, an elastic one whose step (not its streaming)
  sets its TPOT, and a swap member (its budget already holds it whole: it swaps for want of room
  beside its co-tenants, which a bigger budget only makes harder) get nothing from memory;
- **what a budget moves** (`relief`, from the footprint arithmetic, contract.footprint): the KV
  reservation is kvBytesPerToken x contextTokens x concurrency whatever the budget, so KV pressure
  never upsizes (KvReservationFull: a larger spec.slo.concurrency or contextTokens would help); a
  refusal upsizes only while the budget is below what the model needs in its planned mode (its
  elastic minimum when elastic, its whole footprint otherwise: RefusedWithinBudget beyond, the GPU
  has no room or the profile does not match); a latency breach upsizes only where `latency` says
  so, and never past the budget at which every layer is resident (`resident_bytes`); an
  out-of-memory failure always upsizes (the arithmetic under-counted). Without a profile the loop
  cannot tell what the model needs, and a refusal upsizes.
Called by controller.rightsizing.step for each model; the recommender applies the Limits.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from contract.footprint import elastic_minimum
from contract.quantity import format_bytes
from controller.planning.cost import elastic_slice_at, need, predict_elastic, predict_resident, predict_swap
from controller.types import Decision, ElasticModel, GpuSlot, Profile

from controller.policy import KV_NEAR_FRACTION, Rightsizing

MIB = 1 << 20
INT64_MAX = (1 << 63) - 1
INT64_MAX_MIB = INT64_MAX // MIB * MIB  # budgets are whole MiB: the largest that is still an int64
LATENCY_BREACHES = frozenset({"TtftOverSlo", "TpotOverSlo", "QueueWaitGrowing"})


@dataclass(frozen=True)
class Limits:
    ceiling: int = INT64_MAX_MIB
    floor: int = 0
    ceiling_why: str = "the int64 limit"
    floor_why: str = "zero"
    latency_helps: bool = False
    latency_why: str = "the planner has not placed the model, so it cannot say whether more memory lowers latency"
    need_bytes: int | None = None  # the least budget its planned mode is admitted with (None: no profile)
    resident_bytes: int | None = None  # its footprint with every layer resident: more bytes than this move nothing

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


    def relief(self, breaches: Sequence[str], budget: int, sample) -> tuple[tuple[str, ...], tuple[str, str] | None]:
        """(the breaches a bigger budget relieves, in order; None or (reason, message) for why none does)."""
        helpful, why = [], []
        for breach in breaches:
            if breach == "KvNearReservation":
                why.append(("KvReservationFull", _kv_full(sample)))
            elif breach == "WorkerRefusal" and self.need_bytes is not None and budget >= self.need_bytes:
                why.append(("RefusedWithinBudget", (
                    f"the worker refused it although its budget {format_bytes(budget)} covers what it needs as "
                    f"planned ({format_bytes(self.need_bytes)}): the GPU has no room left beside its co-tenants, or "
                    "its profile does not match the checkpoint (the worker's message says which), and a bigger "
                    "budget would not help. What would: another GPU with room (a move, or more capacity), fewer "
                    "co-tenants, or a new profile")))
            elif breach in LATENCY_BREACHES and not self.latency_helps:
                why.append(("MemoryWontHelp", f"{breach}, but {self.latency_why}"))
            elif breach in LATENCY_BREACHES and self.resident_bytes is not None and budget >= self.resident_bytes:
                why.append(("MemoryWontHelp", (
                    f"{breach}, but at {format_bytes(budget)} every layer is resident ({format_bytes(self.resident_bytes)} "
                    "is all it can use), so more memory cannot lower its latency. What would: a less loaded GPU, "
                    "fewer co-tenants, a faster GPU product, or a lower spec.slo.concurrency")))
            else:
                helpful.append(breach)
        if helpful or not why:
            return tuple(helpful), None
        return (), (why[0][0], "; ".join(w[1] for w in why) + "; the budget is left alone")


def _kv_full(sample) -> str:
    """The hold's words: what they name is fixed while the pressure lasts (no record churns pass by pass)."""
    reserved = f" ({format_bytes(sample.kv_reserved_bytes)})" if sample.kv_reserved_bytes else ""
    return (f"KvNearReservation: the KV cache in use is at {KV_NEAR_FRACTION:.0%} or more of its reservation{reserved}, "
            "which spec.slo fixes at contextTokens x concurrency whatever the budget, so a bigger budget would not "
            "relieve it. What would: a larger spec.slo.concurrency (more sequences) or spec.slo.contextTokens "
            "(longer ones): the record's kvReservation says how much")


def limits_for(model: ElasticModel, policy: Rightsizing, decision: Decision | None, slots: Sequence[GpuSlot],
               profile: Profile | None) -> Limits:
    ceiling, ceiling_why = INT64_MAX_MIB, "the int64 limit"
    product = decision.gpu_product if decision is not None and decision.gpu_product else model.gpu_product
    usable = [s.usable_bytes for s in slots if s.product == product] if product else [s.usable_bytes for s in slots]
    if usable and max(usable) // MIB * MIB < ceiling:
        ceiling = max(usable) // MIB * MIB
        ceiling_why = f"the largest usable memory of a {product} GPU" if product else "the largest usable GPU memory"
    floor, floor_why, need_bytes, resident = 0, "zero", None, None
    if profile is not None:
        minimum = elastic_minimum(profile.terms, model.slo.context_tokens, model.slo.concurrency).total
        floor, floor_why = -(-minimum // MIB) * MIB, "the elastic minimum: every layer streamed"
        resident = -(-need(profile, model.slo).total // MIB) * MIB
        placed = decision is not None and decision.mode in ("resident", "swap")
        need_bytes = resident if placed else floor  # elastic, unplaced or refused: the least it is admitted with
    helps, why = latency_effect(model, decision, profile)
    return Limits(ceiling, floor, ceiling_why, floor_why, helps, why, need_bytes, resident).within(policy)


def latency_effect(model: ElasticModel, decision: Decision | None, profile: Profile | None) -> tuple[bool, str]:
    """(more bytes lower the predicted latency, why) for the model as the planner placed it."""
    if decision is None or profile is None or decision.mode == "refused":
        return False, ("the planner has not placed the model with a profile, so it cannot say whether more memory "
                       "lowers latency. What would tell: its profile (the profiler Job measures it) and a plan that "
                       "places it; an out-of-memory failure still upsizes")
    slo = model.slo
    if decision.mode == "swap":
        now, resident = predict_swap(profile, slo), predict_resident(profile, slo)
        return False, (f"as a swap member its predicted TTFT is {now.ttft_ms:g} ms (resident: {resident.ttft_ms:g} "
                       "ms), but its budget already holds it whole: it swaps because its GPU cannot keep it beside "
                       "its co-tenants, and a bigger budget would make that harder. What would: a GPU with room for "
                       "it (another GPU, or fewer co-tenants)")
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
