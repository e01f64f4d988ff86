"""rendered/PLAN.md: the summary a reviewer reads in the pull request, and what changed.

Owns the text of PLAN.md (a terraform-style summary line that counts the models a change
affects; per GPU slot: models, mode, bytes, layers, predicted TTFT and TPOT alone and with
all co-tenants busy, the SLO verdict on the all-busy figures, bytes used out of capacity as
a bar; the GPUs kept and their cost per month, before → after; then models awaiting a profile, refusals,
objects not rendered, and the
changes since the last decision, each before → after, neighbours included),
`decision_changes`, which the commit message also uses, `created_jobs` (the profiler Jobs a tree adds to the last one)
and `last_change_lines` (what a quiet pass carries from the last PLAN.md). Called
by controller.rendering.compose. Pure and deterministic: no clock, everything sorted.
"""
from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from controller.rendering.compose_errors import ComposeError
from controller.rendering.rollouts import LINE_PREFIX as WORKERS_PREFIX
from controller.rendering.rollouts import Rollouts
from controller.planning.bill import Bill, change_line, money
from controller.planning.occupancy import device_bytes
from contract.quantity import format_bytes
from controller.inputs.layout import PLAN_MD, RENDERED_DIR
from controller.types import Decision, ElasticModel, GpuSlot, Plan

BAR_WIDTH = 40


@dataclass(frozen=True)
class Change:
    """One model whose mode, slot or resident layers differ from its last decision (`moved`), or whose predicted
    TTFT or TPOT with all co-tenants busy, or SLO verdict, does (`effects`): a neighbour's change shows here."""

    ref: str
    before: Decision | None
    after: Decision | None
    awaiting_profile: bool = False

    @property
    def moved(self) -> bool:
        """Added, removed, or its mode, slot or resident layers changed."""
        return self.before is None or self.after is None or _placement(self.before) != _placement(self.after)

    @property
    def effects(self) -> tuple[str, ...]:
        """What its predictions and SLO verdict did, before → after: `TPOT 8.1 → 139.0 ms (all busy)`,
        `SLO newly missed (all busy)`; for a new model, its SLO verdict when it misses."""
        if self.after is None:
            return ()
        if self.before is None:
            return ("SLO missed (all busy)",) if self.after.slo_met is False else ()
        return prediction_effects(self.before, self.after)

    @property
    def placement(self) -> str:
        """`llm/chat: resident on n/gpu0 → swap on n/gpu0` (`new, ...`, `→ removed`); the bare ref when it did not
        move."""
        if self.before is None:
            return f"{self.ref}: new, {_state(self.after)}"
        if self.after is None:
            gone = "awaiting a profile" if self.awaiting_profile else "removed"
            return f"{self.ref}: {_state(self.before)} → {gone}"
        return f"{self.ref}: {_state(self.before)} → {_state(self.after)}" if self.moved else self.ref

    @property
    def summary(self) -> str:
        """The placement, then each effect: `llm/summarizer: TPOT 8.1 → 139.0 ms (all busy)`."""
        effects = "; ".join(self.effects)
        if not effects:
            return self.placement
        return f"{self.placement}{'; ' if self.moved else ': '}{effects}"


def prediction_effects(before: Decision, after: Decision) -> tuple[str, ...]:
    """The predicted latencies with all co-tenants busy (the SLO verdict's figures) that differ at the shown
    precision, and a verdict that turned, each `before → after`."""
    out = []
    if before.predicted is not None and after.predicted is not None:
        for name, old, new in (("TTFT", before.predicted.ttft_ms, after.predicted.ttft_ms),
                               ("TPOT", before.predicted.tpot_ms, after.predicted.tpot_ms)):
            if f"{old:.1f}" != f"{new:.1f}":
                out.append(f"{name} {old:.1f} → {new:.1f} ms (all busy)")
    if before.slo_met is not after.slo_met and after.slo_met is not None:
        out.append("SLO newly missed (all busy)" if after.slo_met is False else "SLO now met (all busy)")
    return tuple(out)


def decision_changes(previous: Mapping[tuple[str, str], Decision], plan: Plan) -> tuple[Change, ...]:
    """The changes from `previous` to `plan`, sorted by namespace/name: every model moved, added or removed,
    and every model whose predictions or SLO verdict changed (a neighbour's change included)."""
    current = {d.key: d for d in plan.decisions}
    pending = {p.key for p in plan.pending}
    changes = []
    for key in sorted(set(previous) | set(current)):
        before, after = previous.get(key), current.get(key)
        if (before is not None and after is not None and _placement(before) == _placement(after)
                and not prediction_effects(before, after)):
            continue
        ref = f"{key[0]}/{key[1]}"
        changes.append(Change(ref, before, after, awaiting_profile=after is None and key in pending))
    return tuple(changes)


CHANGES_HEADING = "## Latest decision changes"
SUMMARY_PREFIX = "**Plan:** "
CAPACITY_PREFIX = "**GPUs and cost:** "


@dataclass(frozen=True)
class LastPlan:
    """What a pass carries from the previous PLAN.md when it changes nothing the summary counts (no decision
    moved, no profiler Job created): that PLAN.md's summary line and change lines, as they were written, so
    that such a pass regenerates identical bytes and commits nothing."""

    summary: str | None = None
    changes: tuple[str, ...] = ()
    workers: str | None = None  # its workers line (which workers restart, which reconfigure in place)
    capacity: str | None = None  # its GPUs and cost line, before → after


def last_change_lines(plan_md: str | None) -> LastPlan:
    """The summary line and change lines of a previous PLAN.md (nothing when there is none)."""
    if not plan_md:
        return LastPlan()
    head = plan_md.split("\n## ", 1)[0].splitlines()
    summary = next((line for line in head if line.startswith(SUMMARY_PREFIX)), None)
    workers = next((line for line in head if line.startswith(WORKERS_PREFIX)), None)
    capacity = next((line for line in head if line.startswith(CAPACITY_PREFIX)), None)
    section = plan_md.split(CHANGES_HEADING, 1)[1].split("\n## ", 1)[0] if CHANGES_HEADING in plan_md else ""
    return LastPlan(summary, tuple(line for line in section.splitlines() if line.startswith("- ")), workers, capacity)


def created_jobs(previous: Collection[str] | None, current: Iterable[str], rendered: str = RENDERED_DIR
                 ) -> tuple[str, ...]:
    """The profiler Job files (`<rendered>/<namespace>/job-<name>.yaml`; `rendered` a cluster's rendered/<cluster>
    with clusters/) of the `current` tree that the `previous` rendered tree's paths lack: a Job already there is not
    created again, one whose name changed with its inputs is. When the previous tree is unknown (None), every Job
    is created."""
    return tuple(sorted(path for path in current if _is_job(path, rendered)
                        and (previous is None or path not in previous)))


def _jobs(plan: Plan) -> int:
    """The profiler Jobs a plan runs: one per namespace, model id, revision and GPU product awaiting a profile."""
    return len({(p.namespace, p.model, p.revision, p.gpu_product) for p in plan.pending})


def _is_job(path: str, rendered: str) -> bool:
    if not path.startswith(rendered + "/"):
        return False
    parts = path[len(rendered) + 1:].split("/")
    return len(parts) == 2 and parts[1].startswith("job-")


def review_summary(plan_md: str, commit: str, base: str, plan_path: str = PLAN_MD) -> str:
    """The pull request body: PLAN.md's summary line, its workers line (which restart, and the models down
    meanwhile), its latest changes, and where the whole plan is (`plan_path`: a cluster's own PLAN.md)."""
    plan = last_change_lines(plan_md)
    body = [plan.summary or "", *(["", plan.capacity] if plan.capacity else []),
            *(["", plan.workers] if plan.workers else []), "", CHANGES_HEADING.removeprefix("## ") + ":", "",
            *(plan.changes or ["None."]), "",
            f"The whole plan: `{plan_path}` at {commit[:12]}. Merging applies it: Argo CD syncs {base}, "
            "and each ElasticModel turns Synced and Ready once the merged tree's content is live (a squash merge "
            "counts)."]
    return "\n".join(line for line in body).strip() + "\n"


def plan_markdown(models: Sequence[ElasticModel], plan: Plan, slots: Sequence[GpuSlot],
                  changes: Sequence[Change], errors: Sequence[ComposeError],
                  last: LastPlan | None = None, sources: Mapping[tuple[str, str, str], str] | None = None, *,
                  jobs_created: int | None = None, rollouts: Rollouts | None = None,
                  sections: Sequence[str] = (), bills: tuple[Bill, Bill] | None = None,
                  cluster: str | None = None) -> str:
    """`last`: what the previous PLAN.md said; `sources`: each (model id, GPU product, weight dtype)'s profile source
    (estimated, measured), shown per model; `jobs_created`: the profiler Jobs new in this tree (`created_jobs`),
    None when the previous tree is not known: then every profiler Job the plan runs counts; `rollouts`: which
    workers this tree restarts and which reconfigure in place (None when the previous tree is not known);
    `sections`: further lines (the open right-sizing recommendations), placed before the changes; `bills`: what
    the last decisions and this plan keep and cost (controller.planning.bill), shown before → after whenever the
    summary is (a quiet pass carries the last line) and this plan's per product and pool; `cluster`: the cluster
    it plans, named in the title (with clusters/)."""
    by_key = {m.key: m for m in models}
    last = last or LastPlan()
    sources = sources or {}
    decisions = sorted(plan.decisions, key=lambda d: d.key)
    failed = {e.ref for e in errors}  # not rendered: listed as such, never as placed
    placed = [d for d in decisions if d.mode != "refused" and f"{d.namespace}/{d.name}" not in failed]
    refused = [d for d in decisions if d.mode == "refused"]
    on_slot: dict[str | None, list[Decision]] = {}
    for d in placed:
        on_slot.setdefault(d.slot, []).append(d)
    node_of = {s.id: s.node for s in slots}
    pinned: dict[str, int] = {}
    for d in placed:
        pinned[node_of.get(d.slot, "")] = pinned.get(node_of.get(d.slot, ""), 0) + d.host_bytes
    ordered = sorted(slots, key=lambda s: (s.node, s.index))
    views = [_SlotView.of(slot, on_slot.get(slot.id, [])) for slot in ordered]
    jobs = _jobs(plan) if jobs_created is None else jobs_created
    quiet = not changes and not jobs_created and not (rollouts and rollouts.any) and last.summary
    if quiet:  # nothing the summary counts changed: the last summary, cost and workers lines, as they were written
        head = ([last.summary] + (["", last.capacity] if last.capacity else [])
                + (["", last.workers] if last.workers else []))
    else:
        head = ([summary_line(changes, jobs, rollouts)]
                + (["", CAPACITY_PREFIX + change_line(*bills)] if bills else [])
                + (["", rollouts.line] if rollouts and rollouts.any else []))
    lines = [
        "# gpushare plan" + (f": cluster {cluster}" if cluster else ""),
        "",
        *head,
        "",
        f"{len(placed)} placed on {len(slots)} GPU slots · {len(plan.pending)} awaiting a profile · "
        f"{len(refused)} refused · {len(errors)} not rendered.",
        "",
        "## GPUs",
        "",
        "One line per GPU: a letter per model (its share of the usable memory), `~` the swap area its swap "
        "models share one at a time, `.` free.",
        "",
        "```",
        *_gpu_lines(views),
        "```",
    ]
    lines += _bill_section(bills[1]) if bills else []
    for view in views:
        lines += _slot_section(view, by_key, sources, pinned.get(view.slot.node, 0))
    lines += _section("Awaiting a profile", ("model", "model id", "GPU product", "reason"),
                      [(f"{p.namespace}/{p.name}", p.model, p.gpu_product, p.reason)
                       for p in sorted(plan.pending, key=lambda p: p.key)])
    lines += _section("Refused", ("model", "reason code", "reason"),
                      [(f"{d.namespace}/{d.name}", d.reason_code, d.reason) for d in refused])
    lines += _section("Not rendered", ("model", "reason", "what failed"),
                      [(e.ref, e.reason, f"{e.message}; fix: {e.fix}")
                       for e in sorted(errors, key=lambda e: (e.ref, e.reason, e.message))])
    lines += [*sections, "", CHANGES_HEADING, ""]
    lines += [f"- {_cell(c.summary)}" for c in changes] or list(last.changes) or ["None yet."]
    return "\n".join(lines) + "\n"


def summary_line(changes: Sequence[Change], jobs_created: int, rollouts: Rollouts | None) -> str:
    """terraform's summary: models added, changed, removed or refused by the latest decision changes; workers
    restarting and reconfigured in place (`rollouts`: this tree's worker objects against the last tree's;
    None: not known); profiler Jobs this tree creates."""
    added = sum(1 for c in changes if c.before is None and c.after is not None and c.after.mode != "refused")
    changed = sum(1 for c in changes if c.before is not None and c.after is not None and c.after.mode != "refused"
                  and c.moved)
    removed = sum(1 for c in changes if c.after is None)
    refused = sum(1 for c in changes if c.after is not None and c.after.mode == "refused" and c.moved)
    affected = len(changes)  # every model the change touches: added, moved, removed, or predicted otherwise
    workers = rollouts.plan_words if rollouts is not None else "workers not compared (no previous tree)"
    return (f"{SUMMARY_PREFIX}{added} to add, {changed} to change, {removed} to remove, {refused} refused · "
            f"{affected} model{'s' * (affected != 1)} affected · "
            f"{workers} · {jobs_created} profiler Job{'s' * (jobs_created != 1)} created.")


@dataclass(frozen=True)
class _Part:
    mark: str  # the bar letter, `~` the swap area, `.` free
    label: str
    gib: str  # tenths of GiB, summing with the slot's other parts to its usable memory
    tenths: int


@dataclass(frozen=True)
class _SlotView:
    slot: GpuSlot
    decisions: tuple[Decision, ...]
    parts: tuple[_Part, ...]
    marks: Mapping[tuple[str, str], str]  # model key -> its mark
    used: int

    @classmethod
    def of(cls, slot: GpuSlot, decisions: list[Decision]) -> "_SlotView":
        fixed = [d for d in decisions if d.mode in ("resident", "elastic")]
        swap = [d for d in decisions if d.mode == "swap"]
        marks = {d.key: MARKS[i % len(MARKS)] for i, d in enumerate(fixed)} | {d.key: "~" for d in swap}
        raw = [(marks[d.key], f"{d.namespace}/{d.name}", d.footprint_bytes) for d in fixed]
        if swap:
            members = ", ".join(f"{d.namespace}/{d.name}" for d in swap)
            raw.append(("~", f"swap area ({members}: one at a time)", max(d.footprint_bytes for d in swap)))
        used = device_bytes(decisions)
        raw.append((".", "free", max(0, slot.usable_bytes - used)))
        tenths = _tenths([b for _, _, b in raw], slot.usable_bytes)
        parts = tuple(_Part(m, label, _gib(t), t) for (m, label, _), t in zip(raw, tenths))
        return cls(slot, tuple(decisions), parts, marks, used)


MARKS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _tenths(values: list[int], total: int) -> list[int]:
    """Each value in tenths of GiB, rounded so that they add up to `total` rounded (largest remainders)."""
    exact = [v * 10 / (1 << 30) for v in values]
    floors = [int(x) for x in exact]
    goal = round(total * 10 / (1 << 30))
    order = sorted(range(len(values)), key=lambda i: (-(exact[i] - floors[i]), i))
    for i in order[:max(0, goal - sum(floors))]:
        floors[i] += 1
    return floors


def _gib(tenths: int) -> str:
    return f"{tenths // 10}.{tenths % 10}Gi"


def _gpu_lines(views: Sequence[_SlotView]) -> list[str]:
    width = max((len(v.slot.id) for v in views), default=0)
    product = max((len(v.slot.product) for v in views), default=0)
    return [f"{v.slot.id:<{width}}  {v.slot.product:<{product}}  |{_bar(v)}|  {_used(v)} of {_usable(v)} usable"
            for v in views]


def _used(view: _SlotView) -> str:
    return _gib(sum(p.tenths for p in view.parts if p.mark != "."))


def _usable(view: _SlotView) -> str:
    return _gib(sum(p.tenths for p in view.parts))


def _bar(view: _SlotView) -> str:
    """BAR_WIDTH characters; each part at least one when it holds anything, the rest by share."""
    total = sum(p.tenths for p in view.parts) or 1
    counts = [max(1 if p.tenths else 0, round(p.tenths * BAR_WIDTH / total)) for p in view.parts]
    free = len(counts) - 1  # the free part absorbs the rounding, never below zero
    counts[free] = max(0, BAR_WIDTH - sum(counts[:free]))
    return "".join(p.mark * n for p, n in zip(view.parts, counts))[:BAR_WIDTH].ljust(BAR_WIDTH, ".")


def _slot_section(view: _SlotView, by_key: Mapping, sources: Mapping[tuple[str, str, str], str],
                  node_pinned: int) -> list[str]:
    slot = view.slot
    header = ("bar", "model", "mode", "budget", "need", "GPU footprint", "layers", "profile",
              "TTFT alone / all busy", "TPOT alone / all busy", "SLO (on all busy)")
    area = {p.label: p.gib for p in view.parts}
    rows = []
    for d in sorted(view.decisions, key=lambda d: (d.mode == "swap", d.key)):  # in the bar's order
        ref = f"{d.namespace}/{d.name}"
        footprint = "in the swap area" if d.mode == "swap" else area[ref]
        rows.append((view.marks[d.key], ref, d.mode, format_bytes(d.budget_bytes), format_bytes(d.need_bytes),
                     footprint, f"{d.resident_layers}/{d.total_layers}",
                     sources.get((d.model, d.gpu_product or "", d.weight_dtype), "-")
                     + ("" if d.weight_dtype == "auto" else f" ({d.weight_dtype})"),
                     _figures(d, "ttft"), _figures(d, "tpot"), _slo(by_key.get(d.key), d)))
    rows += [(p.mark, p.label, "", "", "", p.gib, "", "", "", "", "") for p in view.parts
             if p.mark == "~" or p.mark == "."]
    rows.append(("", "total", "", "", "", f"{_usable(view)} usable", "", "", "", "", ""))
    chart = [f'    "{p.mark} {p.label.split(" (")[0]}" : {p.tenths / 10:.1f}' for p in view.parts if p.tenths]
    return [
        "", f"## {slot.id} · {slot.product}", "",
        f"`|{_bar(view)}|` {_used(view)} of {_usable(view)} usable",
        *_table(header, rows),
        "",
        f"Host RAM pinned here: {format_bytes(sum(d.host_bytes for d in view.decisions))}; node {slot.node}: "
        f"{format_bytes(node_pinned)} of "
        f"{format_bytes(slot.host_memory_bytes) if slot.host_memory_bytes else 'unknown (not planned)'}.",
        "",
        "```mermaid",
        "pie showData",
        f"    title {slot.id} {slot.product}: GiB of {sum(p.tenths for p in view.parts) / 10:.1f} usable",
        *chart,
        "```",
    ] if view.decisions else ["", f"## {slot.id} · {slot.product}", "", "No models."]


def _bill_section(now: Bill) -> list[str]:
    """The GPUs this plan keeps and their cost per month (GPUs × pricePerGpuHour × 730), per product and pool."""
    rows = [(p.product, str(p.gpus_used), str(p.gpus_idle), "-" if p.price is None else f"{p.price:g}",
             money(p.cost_per_month)) for p in now.products]
    pools = [(p.name, p.product, f"{p.nodes} (min {p.min_nodes}, max {p.max_nodes})", str(p.gpus),
              money(p.cost_per_month)) for p in now.pools]  # not the nodes the cluster has: git holds the plan
    cost = (f", {money(now.cost_per_month)} per month" if now.cost_per_month is not None else
            "; their cost is not known until gpus.yaml gives pricePerGpuHour for each product")
    return (["", "## GPUs and cost", "", f"{now.gpus} GPU{'s' * (now.gpus != 1)} kept{cost} (a node is billed whole; idle: kept, no model "
             "on it)."]
            + _table(("GPU product", "GPUs kept", "idle", "price per GPU-hour", "per month"), rows)
            + (_table(("pool", "GPU product", "nodes needed", "GPUs", "per month"), pools) if pools else []))


def _section(title: str, header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    return ["", f"## {title}", *(_table(header, rows) if rows else ["", "None."])]


def _table(header: tuple[str, ...], rows: Iterable[tuple[str, ...]]) -> list[str]:
    return ["", "| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(_cell(v) for v in row) + " |" for row in rows)]


def _cell(text: str) -> str:
    """Table-safe text: a user's value cannot end the cell or the row."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _figures(d: Decision, which: str) -> str:
    """`8.1 / 44.5 ms`: the prediction alone on the GPU, then with every co-tenant busy (`-` alone when the
    decision predates that figure); `(estimated)` from an estimated profile."""
    if d.predicted is None:
        return "-"
    busy, alone = getattr(d.predicted, f"{which}_ms"), getattr(d.predicted, f"alone_{which}_ms")
    shown = f"{'-' if alone is None else f'{alone:.1f}'} / {busy:.1f} ms"
    return shown + (" (estimated)" if d.estimated else "")


def _slo(model: ElasticModel | None, d: Decision) -> str:
    """The targets and the verdict, judged on the all-busy figures."""
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
