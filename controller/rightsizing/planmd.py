"""PLAN.md's "Open right-sizing recommendations": each open record with the memory it frees or needs, its
monthly cost effect (from gpus.yaml's pricePerGpuHour and the model's share of its GPU) and the KV-cache
reservation the loop recommends when it differs from the worker's.

Pure and deterministic (records and slots sorted; no clock). Called by controller.passes.reconcile, which
hands the lines to PLAN.md's one writer (controller.rendering.planmd.plan_markdown).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from contract.quantity import format_bytes
from controller.types import Decision, GpuSlot

from controller.inputs.rightsizing_records import Record
from .step import monthly_cost

HEADING = "## Open right-sizing recommendations"


def section(records: Mapping[tuple[str, str], Record], decisions: Sequence[Decision], slots: Sequence[GpuSlot],
            prices: Mapping[str, float]) -> list[str]:
    """The section's lines, or [] when no recommendation is open."""
    open_ = sorted((r for r in records.values() if r.open or r.kv_differs), key=lambda r: r.key)
    if not open_:
        return []
    by_key = {d.key: d for d in decisions}
    by_slot = {s.id: s for s in slots}
    rows, total_bytes, total_cost = [], 0, 0.0
    for r in open_:
        decision = by_key.get(r.key)
        slot = by_slot.get(decision.slot) if decision is not None and decision.slot else None
        delta = r.budget_bytes - r.spec_budget_bytes
        cost = monthly_cost(delta, slot, prices) if r.open else None
        total_bytes += delta
        total_cost += cost or 0.0
        state = ("applied (Auto)" if r.policy == "Auto" else f"review `{r.review_branch}`") if r.open else "advice"
        budget = (f"{format_bytes(r.spec_budget_bytes)} → {format_bytes(r.budget_bytes)}" if r.open
                  else f"{format_bytes(r.budget_bytes)} (kept)")
        memory = f"{'frees' if delta < 0 else 'needs'} {format_bytes(abs(delta))}" if r.open else "-"
        rows.append(f"| {r.namespace}/{r.name} | {budget} | {memory} | "
                    f"{'-' if cost is None else f'{cost:+.2f}'} | {(r.reason or '-') if r.open else '-'} | "
                    f"{(r.fit or {}).get('kind', '-') if r.open else '-'} | {_kv_cell(r)} | {state} |")
    return ["", HEADING, "",
            f"{len(open_)} open · {'frees' if total_bytes < 0 else 'needs'} {format_bytes(abs(total_bytes))} · "
            f"monthly cost {total_cost:+.2f} (priced products only).", "",
            "| model | budget | memory | monthly cost | reason | fits | KV reservation | state |",
            "|---|---|---|---|---|---|---|---|", *rows]


def _kv_cell(record: Record) -> str:
    """The KV reservation the loop recommends, when it differs from the worker's: `64.0Mi → 128.0Mi (4 × 2048)`."""
    if not record.kv_differs:
        return "-"
    kv = record.kv
    return (f"{format_bytes(kv['reservedBytes'])} → {format_bytes(kv['recommendedBytes'])} "
            f"({kv['sequences']} × {kv['contextTokens']} tokens)")
