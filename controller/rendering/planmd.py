"""rendered/PLAN.md: the summary a reviewer reads in the pull request, and what changed.

Owns the text of PLAN.md (per GPU slot: models, mode, bytes, layers, predicted
TPOT against the SLO, bytes used out of capacity as a bar; then models awaiting a
profile, refusals, objects not rendered, and the changes since the last decision)
and `decision_changes`, which gitops also uses for commit messages. Called by
controller.rendering.compose. Pure and deterministic: no clock, everything sorted.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from controller.rendering.compose_errors import ComposeError
from controller.planning.occupancy import device_bytes
from contract.quantity import format_bytes
from controller.types import Decision, ElasticModel, GpuSlot, Plan

BAR_WIDTH = 20


@dataclass(frozen=True)
class Change:
    """One model whose mode, slot or resident layers differ from its last decision."""

    ref: str
    before: Decision | None
    after: Decision | None
    awaiting_profile: bool = False

    @property
    def summary(self) -> str:
        if self.before is None:
            return f"{self.ref}: new, {_state(self.after)}"
        if self.after is None:
            gone = "awaiting a profile" if self.awaiting_profile else "removed"
            return f"{self.ref}: {_state(self.before)} → {gone}"
        return f"{self.ref}: {_state(self.before)} → {_state(self.after)}"


def decision_changes(previous: Mapping[tuple[str, str], Decision], plan: Plan) -> tuple[Change, ...]:
    """The changes from `previous` to `plan`, sorted by namespace/name."""
    current = {d.key: d for d in plan.decisions}
    pending = {p.key for p in plan.pending}
    changes = []
    for key in sorted(set(previous) | set(current)):
        before, after = previous.get(key), current.get(key)
        if before is not None and after is not None and _placement(before) == _placement(after):
            continue
        ref = f"{key[0]}/{key[1]}"
        changes.append(Change(ref, before, after, awaiting_profile=after is None and key in pending))
    return tuple(changes)


CHANGES_HEADING = "## Latest decision changes"


def last_change_lines(plan_md: str | None) -> tuple[str, ...]:
    """The change lines of a previous PLAN.md, carried forward by a pass in which no decision moved
    (so that such a pass regenerates identical bytes and commits nothing)."""
    if not plan_md or CHANGES_HEADING not in plan_md:
        return ()
    section = plan_md.split(CHANGES_HEADING, 1)[1].split("\n## ", 1)[0]
    return tuple(line for line in section.splitlines() if line.startswith("- "))


def plan_markdown(models: Sequence[ElasticModel], plan: Plan, slots: Sequence[GpuSlot],
                  changes: Sequence[Change], errors: Sequence[ComposeError],
                  last_changes: Sequence[str] = ()) -> str:
    by_key = {m.key: m for m in models}
    decisions = sorted(plan.decisions, key=lambda d: d.key)
    placed = [d for d in decisions if d.mode != "refused"]
    refused = [d for d in decisions if d.mode == "refused"]
    lines = [
        "# gpushare plan",
        "",
        f"{len(placed)} placed on {len(slots)} GPU slots · {len(plan.pending)} awaiting a profile · "
        f"{len(refused)} refused · {len(errors)} not rendered.",
    ]
    on_slot: dict[str | None, list[Decision]] = {}
    for d in placed:
        on_slot.setdefault(d.slot, []).append(d)
    node_of = {s.id: s.node for s in slots}
    pinned: dict[str, int] = {}
    for d in placed:
        pinned[node_of.get(d.slot, "")] = pinned.get(node_of.get(d.slot, ""), 0) + d.host_bytes
    for slot in sorted(slots, key=lambda s: (s.node, s.index)):
        lines += _slot_section(slot, on_slot.get(slot.id, []), by_key, pinned.get(slot.node, 0))
    lines += _section("Awaiting a profile", ("model", "model id", "GPU product", "reason"),
                      [(f"{p.namespace}/{p.name}", p.model, p.gpu_product, p.reason)
                       for p in sorted(plan.pending, key=lambda p: p.key)])
    lines += _section("Refused", ("model", "reason code", "reason"),
                      [(f"{d.namespace}/{d.name}", d.reason_code, d.reason) for d in refused])
    lines += _section("Not rendered", ("model", "reason", "what failed"),
                      [(e.ref, e.reason, f"{e.message}; fix: {e.fix}")
                       for e in sorted(errors, key=lambda e: (e.ref, e.reason, e.message))])
    lines += ["", CHANGES_HEADING, ""]
    lines += [f"- {_cell(c.summary)}" for c in changes] or list(last_changes) or ["None yet."]
    return "\n".join(lines) + "\n"


def _slot_section(slot: GpuSlot, decisions: list[Decision], by_key: Mapping, node_pinned: int) -> list[str]:
    used, capacity = device_bytes(decisions), slot.usable_bytes
    share = used / capacity if capacity else 0.0
    filled = min(BAR_WIDTH, round(share * BAR_WIDTH))
    header = ("model", "mode", "need", "footprint", "layers", "TPOT predicted", "SLO")
    rows = [(
        f"{d.namespace}/{d.name}", d.mode, format_bytes(d.need_bytes), format_bytes(d.footprint_bytes),
        f"{d.resident_layers}/{d.total_layers}",
        "-" if d.predicted is None else f"{d.predicted.tpot_ms:.1f} ms" + (" (estimated)" if d.estimated else ""),
        _slo(by_key.get(d.key), d),
    ) for d in decisions]
    return [
        "", f"## {slot.id} · {slot.product}", "",
        f"`[{'#' * filled}{'.' * (BAR_WIDTH - filled)}]` {format_bytes(used)} of {format_bytes(capacity)} "
        f"usable ({share:.0%})",
        "",
        f"Host RAM pinned here: {format_bytes(sum(d.host_bytes for d in decisions))}; node {slot.node}: "
        f"{format_bytes(node_pinned)} of "
        f"{format_bytes(slot.host_memory_bytes) if slot.host_memory_bytes else 'unknown (not planned)'}",
        *(_table(header, rows) if rows else ["", "No models."]),
    ]


def _section(title: str, header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    return ["", f"## {title}", *(_table(header, rows) if rows else ["", "None."])]


def _table(header: tuple[str, ...], rows: Iterable[tuple[str, ...]]) -> list[str]:
    return ["", "| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(_cell(v) for v in row) + " |" for row in rows)]


def _cell(text: str) -> str:
    """Table-safe text: a user's value cannot end the cell or the row."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _slo(model: ElasticModel | None, d: Decision) -> str:
    targets = (("TTFT", model.slo.ttft_ms), ("TPOT", model.slo.tpot_ms)) if model is not None else ()
    terms = [f"{name} ≤ {value:g} ms" for name, value in targets if value is not None]
    if not terms:
        return "-"  # no latency target set
    verdict = {True: "met", False: "missed", None: "not predicted"}[d.slo_met]
    if d.estimated and d.slo_met is not None:
        verdict += " by an estimate"  # never a bare "met" from an estimated profile
    return f"{', '.join(terms)} ({verdict})"


def _placement(d: Decision) -> tuple:
    return (d.mode, d.slot, d.resident_layers)


def _state(d: Decision) -> str:
    if d.mode == "refused":
        return "refused"
    layers = f" {d.resident_layers}/{d.total_layers} layers" if d.mode == "elastic" else ""
    return f"{d.mode}{layers} on {d.slot}"
