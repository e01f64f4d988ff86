"""Bytes one GPU slot's models occupy on the device, by the planner's rule.

Owns the sum that PLAN.md's bars and the GPU-sharing compositions' memory asks
(KAI gpu-memory, HAMi gpumem) both use: resident and elastic footprints add up,
a swap group occupies the area of its largest member. Called by controller.rendering.compose
and controller.rendering.planmd.
"""
from __future__ import annotations

from collections.abc import Iterable

from controller.types import Decision


def device_bytes(decisions: Iterable[Decision]) -> int:
    """GPU bytes the placed decisions occupy together (refused ones occupy nothing)."""
    placed = [d for d in decisions if d.mode != "refused"]
    fixed = sum(d.footprint_bytes for d in placed if d.mode in ("resident", "elastic"))
    swap_area = max((d.footprint_bytes for d in placed if d.mode == "swap"), default=0)
    return fixed + swap_area
