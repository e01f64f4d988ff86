"""Where a recommended budget fits: in place, on another slot of the product (a re-plan), or NeedsCapacity."""
from __future__ import annotations

import pytest

from controller.rightsizing.placement import where_it_fits
from controller.types import Decision
from factories import PRODUCT, toy_slot


def decision(name: str, slot: str | None, footprint: int, need: int, mode: str = "resident") -> Decision:
    return Decision(name=name, namespace="llm", model="org/toy", gpu_product=PRODUCT, slot=slot, mode=mode,
                    resident_layers=0, total_layers=10, need_bytes=need, budget_bytes=footprint,
                    footprint_bytes=footprint, predicted=None, slo_met=None, reason="", reason_code="Placed")


SLOTS = [toy_slot("node-a", 10_000), toy_slot("node-b", 10_000)]
NEIGHBOUR = decision("other", "node-a/gpu0", 6_000, 6_000)


@pytest.mark.parametrize("footprint,need,new_budget,b_used,expected", [
    (3_000, 3_000, 2_000, 0, ("InPlace", "node-a/gpu0", 0)),          # a downsize always fits
    (3_000, 5_000, 4_000, 0, ("InPlace", "node-a/gpu0", 0)),          # grows into the 4,000 left beside the neighbour
    (3_000, 8_000, 8_000, 0, ("Move", "node-b/gpu0", 0)),             # 8,000 > 4,000 here; node-b has 10,000
    (3_000, 9_000, 9_000, 5_000, ("NeedsCapacity", None, 4_000)),     # best room anywhere is 5,000
    (3_000, 3_000, 9_000, 0, ("InPlace", "node-a/gpu0", 0)),          # a budget is a cap: the need stays 3,000
], ids=["downsize-in-place", "upsize-in-place", "upsize-moves", "upsize-needs-capacity", "cap-above-need"])
def test_where_a_new_budget_fits(footprint, need, new_budget, b_used, expected):
    me = decision("chat", "node-a/gpu0", footprint, need)
    others = [NEIGHBOUR] + ([decision("big", "node-b/gpu0", b_used, b_used)] if b_used else [])
    fit = where_it_fits(me, new_budget, [me] + others, SLOTS)
    assert (fit.kind, fit.slot, fit.missing_bytes) == expected
    if fit.kind == "NeedsCapacity":
        assert fit.product == PRODUCT and PRODUCT in fit.message
