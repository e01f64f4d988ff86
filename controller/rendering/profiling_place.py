"""Where a profiler Job runs: a whole free GPU of the product, or beside the workers.

Owns the rule that keeps profiling from waiting forever: a GPU slot is held when the plan
places any model on it (its worker requests the GPU). When a slot of the product is not
held, the Job asks for a whole GPU (`nvidia.com/gpu: 1`) as before. When every slot of the
product is held, the Job runs beside the workers on the held slot with the most free memory
(memory minus the plan's device bytes and the slot's reserve; ties by slot id) and gets that
much of it: the composition's templates say how (for the whole-GPU device plugin the GPU the worker
was given, by the UUID its verdicts report, else by index until it has reported, a `gpu-memory` share for KAI, an `nvidia.com/gpumem` vGPU for HAMi). Pure; called by
controller.compose for each model awaiting a profile.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from controller.planning.occupancy import device_bytes
from controller.types import Decision, GpuSlot

MIB = 1 << 20


@dataclass(frozen=True)
class Beside:
    """The held slot a profiler shares, and the GPU memory it may take there (MiB, rounded down)."""

    slot: GpuSlot
    free_mib: int

    def context(self) -> dict:
        return {"slot": self.slot.id, "node": self.slot.node, "gpuIndex": str(self.slot.index),
                "gpuUuid": self.slot.device_uuid or "", "gpuMemoryMiB": str(self.free_mib)}


def profiling_place(product: str, slots: Sequence[GpuSlot], decisions: Sequence[Decision]) -> Beside | None:
    """None: a whole GPU of `product` is free (or the product has no slot; the Job then waits for one).
    Else the held slot with the most free memory."""
    on_slot: dict[str, list[Decision]] = defaultdict(list)
    for decision in decisions:
        if decision.slot is not None and decision.mode != "refused":
            on_slot[decision.slot].append(decision)
    candidates = [s for s in slots if s.product == product and s.pool is None]  # a pool node has no fixed name
    if not candidates or any(s.id not in on_slot for s in candidates):
        return None

    def free(slot: GpuSlot) -> int:
        return max(0, slot.memory_bytes - slot.reserved_bytes - device_bytes(on_slot[slot.id]))

    best = min(candidates, key=lambda s: (-free(s), s.id))
    return Beside(best, free(best) // MIB)
