"""Where a recommended budget fits: in place on the model's GPU, on another GPU (a re-plan), or
nowhere yet (`NeedsCapacity`, with the bytes missing and the GPU product).

A budget is a cap: the model's footprint under a new budget is min(need, budget).
Growth beyond the room its slot has left (the planner's occupancy rule) needs
another slot of the same product with room for the whole footprint. Pure: called by
the right-sizing pass for PLAN.md, commit messages and the NeedsCapacity condition.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

from controller.planning.occupancy import device_bytes
from contract.quantity import format_bytes
from controller.types import Decision, GpuSlot


@dataclass(frozen=True)
class Fit:
    kind: Literal["InPlace", "Move", "NeedsCapacity"]
    slot: str | None
    missing_bytes: int
    product: str | None
    message: str


def where_it_fits(decision: Decision, new_budget: int, decisions: Sequence[Decision],
                  slots: Sequence[GpuSlot]) -> Fit:
    footprint = min(decision.need_bytes, new_budget)
    current = next((s for s in slots if s.id == decision.slot), None)
    product = current.product if current else decision.gpu_product
    if current is not None:
        others = [d for d in decisions if d.slot == current.id and d.key != decision.key]
        room = current.usable_bytes - device_bytes(others)
        if footprint <= room:
            return Fit("InPlace", current.id, 0, product,
                       f"fits in place on {current.id}: {format_bytes(footprint)} of {format_bytes(room)} left")
    candidates = [s for s in slots if s.product == product and (current is None or s.id != current.id)]
    best, best_room = None, -1
    for slot in sorted(candidates, key=lambda s: s.id):
        room = slot.usable_bytes - device_bytes([d for d in decisions if d.slot == slot.id])
        if room > best_room:
            best, best_room = slot, room
    if best is not None and footprint <= best_room:
        return Fit("Move", best.id, 0, product, f"moves to {best.id}, which has {format_bytes(best_room)} left "
                   f"for {format_bytes(footprint)}")
    room_here = max(best_room, 0) if current is None else max(
        best_room, current.usable_bytes - device_bytes([d for d in decisions if d.slot == current.id
                                                          and d.key != decision.key]))
    missing = footprint - max(room_here, 0)
    return Fit("NeedsCapacity", None, missing, product,
               f"no {product or 'GPU'} slot has room for {format_bytes(footprint)}: "
               f"{format_bytes(missing)} missing on {product or 'any product'}; add a GPU of that product or "
               "lower other budgets")
