"""Human and machine renderings of a plan: the per-slot table, JSON and YAML, and error lists.

Owns presentation only; a repository with clusters/ gets one table per cluster, and JSON whose fields are the
single-cluster plan's (every decision and pending model tagged with its `cluster`) plus `clusters`, each
cluster's own plan (docs/plan-json.md). Called by the CLI (`plan`, `validate`, `reconcile`).
"""
from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping, Sequence

import yaml

from contract.quantity import format_bytes as fb
from controller.serialize import error_to_dict, plan_to_dict
from controller.types import Decision, GpuSlot, InputError, Plan, Predicted, Profile

# Predictions as ALONE/ALL-BUSY: alone on the GPU, then with every co-tenant busy; the SLO verdict uses the latter.
COLUMNS = ("NAME", "MODEL", "BUDGET", "NEED", "MODE", "LAYERS", "TPOT(ALONE/ALL-BUSY)", "SLO(ALL-BUSY)")
WIDE = ("NAME", "MODEL", "BUDGET", "NEED", "FOOTPRINT", "MODE", "LAYERS", "TTFT(ALONE/ALL-BUSY)",
        "TPOT(ALONE/ALL-BUSY)", "SWAP-IN", "SLO(ALL-BUSY)", "PROFILE")


def as_json(plan: Plan, errors: tuple[InputError, ...] = (), capacity: dict | None = None) -> str:
    """Strict JSON: a number that is not finite (a prediction that overflowed) is written as null."""
    return json.dumps(_finite(plan_to_dict(plan, errors, capacity)), indent=2, sort_keys=True, ensure_ascii=False,
                      allow_nan=False) + "\n"


def _finite(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def as_yaml(plan: Plan, errors: tuple[InputError, ...] = (), capacity: dict | None = None) -> str:
    return yaml.safe_dump(plan_to_dict(plan, errors, capacity), sort_keys=True, allow_unicode=True)


def clusters_to_dict(outputs: Mapping, errors: tuple[InputError, ...], capacities: Mapping | None = None) -> dict:
    """The plan of several clusters (cluster -> controller.passes.reconcile.PassOutput): the single-cluster fields,
    each decision and pending entry with its `cluster`, every error once; `capacity` (with `capacities`, each
    cluster's): every cluster's products and pools tagged with it, and the fleet's GPUs and cost per month (None
    when a cluster's is unpriced); and `clusters`, each one's own plan."""
    capacities = capacities or {}
    own = {name: plan_to_dict(output.shown_plan, output.errors, capacities.get(name))
           for name, output in outputs.items()}
    whole = plan_to_dict(Plan(), errors)
    for part in ("decisions", "pending"):
        whole[part] = [{**entry, "cluster": name} for name, plan in own.items() for entry in plan[part]]
    whole["errors"] = [error_to_dict(e) for e in errors]
    if capacities:
        costs = [c["costPerMonth"] for c in capacities.values()]
        whole["capacity"] = {
            **{part: [{**entry, "cluster": name} for name, c in capacities.items() for entry in c[part]]
               for part in ("products", "pools")},
            "gpusUsed": sum(c["gpusUsed"] for c in capacities.values()),
            "costPerMonth": None if None in costs else round(sum(costs), 2)}
    whole["clusters"] = {name: {k: v for k, v in plan.items() if k not in ("apiVersion", "kind")}
                         for name, plan in own.items()}
    return whole


def clusters_json(outputs: Mapping, errors: tuple[InputError, ...], capacities: Mapping | None = None) -> str:
    return json.dumps(_finite(clusters_to_dict(outputs, errors, capacities)), indent=2, sort_keys=True,
                      ensure_ascii=False, allow_nan=False) + "\n"


def clusters_yaml(outputs: Mapping, errors: tuple[InputError, ...], capacities: Mapping | None = None) -> str:
    return yaml.safe_dump(clusters_to_dict(outputs, errors, capacities), sort_keys=True, allow_unicode=True)


def clusters_table(outputs: Mapping, errors: tuple[InputError, ...], *, wide: bool = False) -> str:
    """One table per cluster under its name, then every error once."""
    out = []
    for name, output in outputs.items():
        profiles = output.inputs.profiles if wide else None
        table = as_table(output.shown_plan, output.slots, (), output.revived, profiles=profiles)
        out += [f"== cluster {name} ==", table.rstrip(), ""]
    if not outputs:
        out += ["no cluster: clusters/ holds no usable cluster folder", ""]
    if errors:
        out.append(f"{len(errors)} input error(s):")
        out += [f"  {line}" for line in error_lines(errors)]
    return "\n".join(out).rstrip() + "\n"


def as_table(plan: Plan, slots: tuple[GpuSlot, ...], errors: tuple[InputError, ...] = (),
             revived: tuple[str, ...] = (), *, profiles: Sequence[Profile] | None = None) -> str:
    """`revived`: namespace/name planned from their last good spec (their document is broken now).
    With `profiles` (`-o wide`), more columns: footprint, TTFT, swap-in and the profile's source."""
    sources = None if profiles is None else {(p.model, p.gpu_product, p.weight_dtype): p.source for p in profiles}
    columns = COLUMNS if sources is None else WIDE

    def table(rows: list[Decision]) -> list[str]:
        return _table([_row(d, revived, sources) for d in rows], columns)

    by_slot: dict[str | None, list[Decision]] = {}
    for d in plan.decisions:
        by_slot.setdefault(d.slot, []).append(d)
    out: list[str] = []
    for slot in sorted(slots, key=lambda s: s.id):
        rows = by_slot.get(slot.id, [])
        used = _slot_used(rows)
        out.append(f"{slot.id} ({slot.product}): {fb(used)} of {fb(slot.usable_bytes)} usable")
        out += table(rows) if rows else ["  (empty)"]
        out.append("")
    if by_slot.get(None):
        out.append("refused:")
        out += table(by_slot[None])
        out += [f"  {d.namespace}/{d.name}: {d.reason}" for d in by_slot[None]]
        out.append("")
    if plan.pending:
        out.append("awaiting a profile (a profiler Job measures each first):")
        out += [f"  {p.namespace}/{p.name}: {p.model}{'' if p.weight_dtype == 'auto' else f' ({p.weight_dtype})'} "
                f"on {p.gpu_product}" for p in plan.pending]
        out.append("")
    if errors:
        out.append(f"{len(errors)} input error(s):")
        out += [f"  {line}" for line in error_lines(errors)]
    return "\n".join(out).rstrip() + "\n"


def error_lines(errors: tuple[InputError, ...]) -> list[str]:
    lines = []
    for e in errors:
        where = e.file + (f" (document {e.document})" if e.document is not None else "")
        path = f" at {e.path}" if e.path else ""
        lines.append(f"{where}{path}: [{e.reason}] {e.message} Fix: {e.fix}")
    return lines


def _slot_used(rows: list[Decision]) -> int:
    swap = max((d.need_bytes for d in rows if d.mode == "swap"), default=0)
    return sum(d.footprint_bytes for d in rows if d.mode in ("resident", "elastic")) + swap


def _row(d: Decision, revived: tuple[str, ...] = (), sources: Mapping[tuple[str, str, str], str] | None = None
         ) -> tuple[str, ...]:
    layers = f"{d.resident_layers}/{d.total_layers}" if d.total_layers else "-"
    estimated = " (est.)" if d.estimated else ""  # predictions from an estimated profile
    tpot = _figures(d.predicted, "tpot") + estimated if d.predicted else "-"
    slo = {True: "met", False: "MISSED", None: "-"}[d.slo_met] + (estimated if d.slo_met is not None else "")
    name = f"{d.namespace}/{d.name}" + (" (last good spec)" if f"{d.namespace}/{d.name}" in revived else "")
    need = fb(d.need_bytes) if d.need_bytes else "-"
    model = d.model if d.weight_dtype == "auto" else f"{d.model} ({d.weight_dtype})"  # spec.weights.dtype
    if sources is None:
        return (name, model, fb(d.budget_bytes), need, d.mode, layers, tpot, slo)
    ttft = _figures(d.predicted, "ttft") if d.predicted else "-"
    swap_in = f"{d.predicted.swap_in_ms:g}ms" if d.predicted and d.predicted.swap_in_ms is not None else "-"
    footprint = fb(d.footprint_bytes) if d.footprint_bytes else "-"
    return (name, model, fb(d.budget_bytes), need, footprint, d.mode, layers, ttft, tpot, swap_in, slo,
            sources.get((d.model, d.gpu_product, d.weight_dtype), "-"))


def _figures(predicted: Predicted, which: str) -> str:
    """`8.1/44.528ms`: alone on the GPU, then with every co-tenant busy (`-` alone when not known)."""
    alone = getattr(predicted, f"alone_{which}_ms")
    return f"{'-' if alone is None else f'{alone:g}'}/{getattr(predicted, f'{which}_ms'):g}ms"


def _table(rows: list[tuple[str, ...]], columns: tuple[str, ...] = COLUMNS) -> list[str]:
    widths = [max(len(r[i]) for r in [columns, *rows]) for i in range(len(columns))]
    fmt = "  " + "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*columns).rstrip()] + [fmt.format(*r).rstrip() for r in rows]


def fail(exc, status: int = 1) -> int:
    """A typed error (its PascalCase reason, message and fix) on stderr, as every command prints one; `status`
    is the command's exit status, returned."""
    print(f"gpushare: [{exc.reason}] {exc.message}\n  fix: {exc.fix}", file=sys.stderr)
    return status
