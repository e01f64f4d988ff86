"""One reconcile pass, pure: inputs -> the generated tree, its commit message, what to report.

Owns the order of the stages (validate -> revive last good -> plan -> compose), the
commit message, and the two rules that keep a bad pass from taking the fleet down:
`kept_owners` (a model that fails to render keeps what the last pass generated for it)
and the prune guard (`prune_hold`, `guarded_change`: a pass that would shrink the
rendered objects by more than a share commits nothing and says why). No I/O: the
offline and cluster loops (controller.cli.offline, controller.passes.cluster_pass) and
`gpushare validate` and `plan` read the tree through controller.inputs.reader and call
`run_pass` alike, with the cluster's facts or none; the loops hand the guarded Change to
gitops.publish.

Nothing is lost: a model whose document is broken now (its error names it, or its
whole file failed to parse) is planned and rendered from its last good spec, which
compose keeps beside each decision in decisions/<ns>/<name>.yaml; its error is still
reported; a broken gpus.yaml, profile or composition is read from its last good copy
(the reader's job; `PassOutput.last_good` writes the copies back). A model whose
document is gone is removed.
"""
from __future__ import annotations

import json
import os
import posixpath
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction

from contract.quantity import format_bytes as fb
from controller.inputs.layout import SINGLE, Layout
from controller.inputs.load import DecisionRecord, revive_last_good
from controller.inputs.pools import split_pool_nodes
from controller.inputs.tree import Tree
from controller.passes.measured import ClusterFacts, measured_profiles, profile_requests
from controller.planning.bill import Bill, bill
from controller.planning.plan import plan
from controller.rendering.compose import Rendered, compose, elastic_model_path
from controller.rendering.compose_errors import ComposeError
from controller.rendering.planmd import Change
from controller.rendering.site import with_install_parameters
from controller.rightsizing.planmd import section as rightsizing_section
from controller.types import Decision, ElasticModel, GpuSlot, InputError, Inputs, Plan

OWNERS_HEADER = ("# Written by the gpushare controller: the generated files of each ElasticModel after the last "
                 "pass.\n# A model that fails to render keeps these files. Do not edit by hand.\n")


@dataclass(frozen=True)
class PassOutput:
    inputs: Inputs  # as planned: valid models plus the revived ones
    plan: Plan
    rendered: Rendered
    revived: tuple[str, ...]  # namespace/name served from their last good spec
    message: str
    last_good: Mapping[str, str] = field(default_factory=dict)  # decisions/_last-good/<input file> -> its text
    held: tuple[str, ...] = ()  # input files broken now and read from their last good copy
    owners: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # namespace/name -> its generated paths
    keep: frozenset[str] = frozenset()  # paths of models that failed to render now, kept as the last pass left them
    measured: Mapping[str, str] = field(default_factory=dict)  # cluster mode: profiles/measured/<path> -> its text
    ignored: tuple[tuple[str, str], ...] = ()  # cluster mode: (reason, message) of profile ConfigMaps not used
    layout: Layout = SINGLE  # whose tree: the single-cluster layout, or one cluster's under clusters/
    clusters: tuple[str, ...] = ()  # with clusters/: every cluster of the repository

    @property
    def reads(self) -> tuple[str, ...] | None:
        """What the pass read, as git pathspecs (gitops.Change.reads): None in the single-cluster layout."""
        return self.layout.reads(self.clusters)

    @property
    def files(self) -> dict[str, bytes]:
        files = {**self.rendered.files, **self.last_good, self.layout.owners: dump_owners(self.owners),
                 **self.measured}
        return {path: text.encode() for path, text in sorted(files.items())}

    @property
    def slots(self) -> tuple[GpuSlot, ...]:
        """Every GPU the plan keeps: the fixed nodes' and those of each pool node it keeps."""
        return (*self.inputs.slots, *self.plan.pool_slots)

    @property
    def shown_plan(self) -> Plan:
        """The plan as reported: a model whose objects could not be rendered is never shown as placed (its error
        says why)."""
        failed = {error.ref for error in self.rendered.errors}
        return replace(self.plan, decisions=tuple(d for d in self.plan.decisions
                                                  if f"{d.namespace}/{d.name}" not in failed))

    @property
    def errors(self) -> tuple[InputError, ...]:
        """Every error of the pass, as `gpushare validate`, `plan` and the status report it: the inputs', then
        each model whose objects could not be rendered, against its model's file."""
        models = {m.ref: m for m in self.inputs.models}
        return (*self.inputs.errors,
                *(render_error(e, models.get(e.ref), self.layout) for e in self.rendered.errors))


def render_error(problem: ComposeError, model: ElasticModel | None, layout: Layout = SINGLE) -> InputError:
    """A model's render-time error as an InputError against the file (and document) that defines it (naming the
    cluster it failed in, with clusters/)."""
    source = model.source if model is not None else None
    where = "" if layout.cluster is None else f" in {layout.label}"
    return InputError(file=source.file if source else "models/", document=source.document if source else None,
                      path="spec", message=f"its objects could not be rendered{where}: {problem.message}",
                      fix=problem.fix, reason=problem.reason, object=problem.ref)


PlanWith = Callable[[Inputs, Mapping[tuple[str, str], Decision]], Plan]


def run_pass(tree: Tree, facts: ClusterFacts | None = None, *, install: Mapping[str, object] | None = None,
             processes: int = 1, plan_with: PlanWith | None = None) -> PassOutput:
    """The pass over a tree as the reader returns it (controller.inputs.reader.read_repo), with the cluster's
    `facts` in cluster mode (None offline: gpus.yaml's slots, git's profiles). Cluster mode plans on the nodes'
    slots and with the profiles its profiler Jobs published, committed under profiles/measured/ (they replace
    git's copy of the same file). `install`: the install's composition parameters (controller.rendering.site)
    over the defaults compositions leave unset; `processes`: how many processes may render a large pass;
    `plan_with(inputs, previous)`: the plan to render instead of the planner's (a consolidation proposal,
    controller.cli.consolidate), None for the normal pass."""
    if facts is not None:  # the cluster says whether it serves PodMonitors; a composition that sets podMonitor wins
        install = {"podMonitor": facts.pod_monitors, **(install or {})}
    compositions = with_install_parameters(tree.compositions, install) if install else tree.compositions
    measured = None
    if facts is None:
        inputs, last_good = tree.inputs, dict(tree.last_good)
    else:
        fixed, pools, pool_nodes, pool_errors = split_pool_nodes(facts.slots, facts.node_labels, tree.pools)
        measured = measured_profiles(facts.profiles, profile_requests(tree.models, facts.slots, pools),
                                     tree.layout.measured)
        replaced = frozenset(measured.files)
        inputs = tree.combined(fixed, measured.profiles, replaced, [*facts.errors, *pool_errors, *measured.errors],
                               pools, pool_nodes)
        last_good = tree.last_good_except(replaced)
    last, layout = tree.last, tree.layout
    planned, revived = revive_last_good(inputs, last.records)
    result = (plan_with or plan)(planned, last.previous)
    sources = {(p.model, p.gpu_product, p.weight_dtype): p.source for p in planned.profiles}
    slots = (*planned.slots, *result.pool_slots)  # the fixed nodes' GPUs and those of every pool node kept
    rendered = compose(planned.models, result, slots, last, compositions=compositions, processes=processes,
                       profile_sources=sources,
                       sections=rightsizing_section(tree.rightsizing, result.decisions, slots, tree.prices),
                       bills=(plan_bill(planned, last.previous.values()), plan_bill(planned, result.decisions)),
                       layout=layout)
    quiet = quiet_changes(last.records, planned.models, result)
    now, keep = kept_owners(rendered, last.owners, layout)
    if layout.cluster is not None:  # a model whose ElasticModel is not rendered now keeps the one it had
        now, keep = _kept_objects(planned.models, rendered, last.paths or (), now, keep, layout)
    message = commit_message(rendered.changes, rendered, revived, quiet=quiet, held=tree.held)
    committed = {}
    if measured is not None:
        committed = measured.files
        new = [path for path, text in measured.files.items() if tree.measured_profiles.get(path) != text]
        message = _with_profiles(message, rendered, new, measured.sources)
    if layout.cluster is not None:  # one branch holds every cluster's commits: each subject says whose it is
        message = cluster_subject(message, layout.cluster)
    return PassOutput(planned, result, rendered, revived, message, last_good, tree.held, now,
                      keep | {layout.rightsizing + "/"}, committed, measured.ignored if measured else (), layout,
                      tree.clusters)


def cluster_subject(message: str, cluster: str) -> str:
    """The commit message with its subject naming its cluster: `gpushare(eu-1): 2 decisions changed`,
    `eu-1: llm/chat: resident on n/gpu0 → swap on n/gpu0`."""
    if message.startswith("gpushare: "):
        return f"gpushare({cluster}): {message.removeprefix('gpushare: ')}"
    return f"{cluster}: {message}"


def _kept_objects(models: Sequence[ElasticModel], rendered: Rendered, before: Iterable[str],
                  owners: dict[str, tuple[str, ...]], keep: frozenset[str], layout: Layout
                  ) -> tuple[dict[str, tuple[str, ...]], frozenset[str]]:
    """The owners and kept paths with the rendered ElasticModel of each planned model that has none rendered now
    kept as upstream holds it: a model served from its last good spec (its document is broken now), or whose
    object the API server would refuse; so the cluster keeps the last good object, never loses it."""
    upstream, owners, kept = set(before), dict(owners), set(keep)
    done = {ref for path in rendered.models for ref in rendered.owners.get(path, ())}
    for model in models:
        if model.ref in done:
            continue
        try:
            path = elastic_model_path(model, layout)
        except ComposeError:  # a name that makes no path: nothing was ever rendered there
            continue
        if path not in rendered.files and path in upstream:
            kept.add(path)
            owners[model.ref] = tuple(sorted({*owners.get(model.ref, ()), path}))
    return dict(sorted(owners.items())), frozenset(kept)


def plan_bill(inputs: Inputs, decisions: Iterable[Decision]) -> Bill:
    """What `decisions` keep and cost on the inputs' fixed nodes and pools (controller.planning.bill)."""
    return bill(tuple(decisions), inputs.slots, inputs.pools, dict(inputs.prices),
                dict(inputs.pool_nodes) if inputs.pool_nodes else None)


def _with_profiles(message: str, rendered: Rendered, new_profiles: list[str], sources: Mapping[str, str]) -> str:
    """The pass's message; profiles committed are named in the body (and the subject when no decision moved)."""
    if not new_profiles:
        return message
    lines = [f"profile committed: {path} (from {sources[path]})" for path in new_profiles]
    subject, _, body = message.partition("\n")
    if not rendered.changes:
        what = new_profiles[0] if len(new_profiles) == 1 else f"{len(new_profiles)} profiles"
        subject = f"gpushare: commit measured {what}"
    rest = [line for line in body.strip().splitlines() if line]
    return subject + "\n\n" + "\n".join(lines + rest) + "\n"


def kept_owners(rendered: Rendered, before: Mapping[str, tuple[str, ...]], layout: Layout = SINGLE
                ) -> tuple[dict[str, tuple[str, ...]], frozenset[str]]:
    """(each model's generated paths now, the paths to keep as upstream holds them). A model that could not
    be rendered this pass (a composition that renders invalid objects, a name clash) keeps what the last
    pass generated for it, and its entry carries forward, so its running objects survive until it is fixed
    (with clusters/, beside the ElasticModel object rendered for it now)."""
    now: dict[str, set[str]] = {}
    for path, refs in rendered.owners.items():
        for ref in refs:
            now.setdefault(ref, set()).add(path)
    keep: set[str] = set()
    for ref in sorted({error.ref for error in rendered.errors}):
        if not now.get(ref, set()) - rendered.models and before.get(ref):
            safe = {path for path in before[ref] if _keepable(path, layout)}
            keep |= safe - now.get(ref, set())
            now[ref] = safe | now.get(ref, set())
    return {ref: tuple(sorted(paths)) for ref, paths in sorted(now.items())}, frozenset(keep)


def _keepable(path: object, layout: Layout = SINGLE) -> bool:
    """A path read back from the owners file (a file in git anyone may edit) is kept only if it is a clean
    relative path under a generated prefix (gitops checks every kept path again before writing)."""
    return (isinstance(path, str) and path.startswith(layout.generated) and posixpath.normpath(path) == path
            and not any(part in ("", ".git") for part in path.split("/")) and "\\" not in path and "\0" not in path)


def dump_owners(owners: Mapping[str, tuple[str, ...]]) -> str:
    """The owners file: its header, then JSON (which is YAML too), one model a line: it grows with the fleet and
    is read back on every pass, and JSON reads some hundred times faster than YAML (controller.inputs.reader)."""
    lines = [f"{json.dumps(ref, ensure_ascii=False)}: {json.dumps(list(paths), ensure_ascii=False)}"
             for ref, paths in sorted(owners.items())]
    return OWNERS_HEADER + ("{\n" + ",\n".join(lines) + "\n}\n" if lines else "{}\n")


def quiet_changes(records: Mapping[tuple[str, str], DecisionRecord], models: Sequence[ElasticModel],
                  result: Plan) -> tuple[str, ...]:
    """What changed for models whose placement did not move: their spec fields and planned bytes, one line each
    (`llm/chat: memoryBudget 4.0Gi → 6.0Gi`), so a commit without a decision change still says why."""
    decisions = {d.key: d for d in result.decisions}
    lines = []
    for model in sorted(models, key=lambda m: m.key):
        record = records.get(model.key)
        if record is None:
            continue
        before, after = record.model, model
        moved = []
        if before is not None:
            budgets = (fb(before.budget_bytes), fb(after.budget_bytes))
            if budgets[0] == budgets[1]:  # a change below the shown precision: exact bytes
                budgets = (f"{before.budget_bytes} bytes", f"{after.budget_bytes} bytes")
            for label, old, new in (("memoryBudget", *budgets),
                                    ("model", before.model, after.model), ("revision", before.revision, after.revision),
                                    ("slo", before.slo, after.slo), ("gpu", before.gpu_product, after.gpu_product),
                                    ("compositionRef", before.composition, after.composition)):
                if old != new:
                    moved.append(f"{label} changed" if label == "slo" else f"{label} {old} → {new}")
        decision, last = decisions.get(model.key), record.decision
        if not moved and decision is not None and decision.need_bytes != last.need_bytes:
            moved.append(f"need {fb(last.need_bytes)} → {fb(decision.need_bytes)}")
        if moved:
            lines.append(f"{model.ref}: {', '.join(moved)}")
    return tuple(lines)


def available_processes() -> int:
    """The CPUs this process may run on (at most 4): how many processes render a large pass."""
    return max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


def commit_message(changes: tuple[Change, ...], rendered: Rendered, revived: tuple[str, ...], *,
                   quiet: tuple[str, ...] = (), held: tuple[str, ...] = ()) -> str:
    """`llm/chat-small: resident on n/gpu0 → swap on n/gpu0 (llm/coder-32b admitted)` for one change;
    a count and one line per change otherwise, each model whose predictions or SLO verdict changed included
    (`llm/summarizer: TPOT 8.1 → 139.0 ms (all busy); SLO newly missed (all busy)`); with no decision moved,
    the `quiet` spec changes. Used only when the generated tree changed."""
    placed = [c for c in changes if c.moved]
    affected = [c for c in changes if not c.moved]  # only its predictions or SLO verdict changed
    moved = [c for c in placed if c.before is not None and c.after is not None]
    own = moved[0].ref if len(moved) == 1 else None  # the moved model's own change explains it first
    causes = [cause for ref, cause in sorted(_causes(changes), key=lambda rc: rc[0] != own)]
    shown = causes[:3] + ([f"{len(causes) - 3} more"] if len(causes) > 3 else [])
    why = f" ({', '.join(shown)})" if causes else ""
    also = f"; {len(affected)} more model{'s' * (len(affected) != 1)} affected" if placed and affected else ""
    if len(moved) == 1:
        subject = moved[0].placement + why + "".join(f"; {e}" for e in moved[0].effects) + also
    elif len(placed) == 1:
        subject = placed[0].summary + also
    elif placed:
        subject = f"gpushare: {len(placed)} decisions changed{why}{also}"
    elif len(affected) == 1:
        subject = f"gpushare: {affected[0].summary}{why}"
    elif affected:
        subject = f"gpushare: {len(affected)} models' predictions changed{why}"
    elif len(quiet) == 1:
        subject = f"gpushare: re-render {quiet[0]} (no decision moved)"
    elif quiet:
        subject = f"gpushare: re-render {len(quiet)} models whose spec or need changed (no decision moved)"
    else:
        subject = "gpushare: re-render (templates, compositions or profiles changed; no decision moved)"
    rollouts = rendered.rollouts  # which workers restart and which reconfigure in place
    body = [rollouts.line] if rollouts.any else []
    body += [c.summary for c in changes] if len(changes) > 1 else []
    body += list(quiet) if len(quiet) > 1 or (quiet and changes) else []
    body += [f"served from its last good spec (its document is broken): {ref}" for ref in revived]
    body += [f"read from its last good copy (the file is broken): {file}" for file in held]
    body += [f"not rendered: {e.ref}: [{e.reason}] {e.message}" for e in rendered.errors]
    return subject + ("\n\n" + "\n".join(body) if body else "") + "\n"


def _causes(changes: tuple[Change, ...]) -> list[tuple[str, str]]:
    """(ref, why) for each change that explains the others: admissions, removals, new budgets or needs."""
    causes = []
    for c in changes:
        if c.before is None and c.after is not None:
            causes.append((c.ref, f"{c.ref} admitted"))
        elif c.after is None and not c.awaiting_profile:
            causes.append((c.ref, f"{c.ref} removed"))
        elif c.before is not None and c.after is not None:
            if c.before.budget_bytes != c.after.budget_bytes:
                causes.append((c.ref, f"{c.ref} budget changed"))
            elif c.before.need_bytes != c.after.need_bytes:
                causes.append((c.ref, f"{c.ref} need changed"))
    return causes


PRUNE_SHARE_DEFAULT = 0.5
PRUNE_SETTING = "--max-prune-share (or GPUSHARE_MAX_PRUNE_SHARE)"


@dataclass(frozen=True)
class PruneHold:
    """A pass held back because it would remove more than `max_share` of the rendered objects upstream holds."""

    before: int
    after: int
    max_share: float

    @property
    def message(self) -> str:
        gone = self.before - self.after
        removed, limit = _percents(Fraction(gone, self.before), exact_share(self.max_share))
        return (f"this pass would shrink the rendered objects from {self.before} to {self.after}: it removes {gone} of "
                f"{self.before} ({removed}), more than the limit of {limit} ({PRUNE_SETTING} = {self.max_share:g}); "
                "nothing is committed (an Argo CD prune would take those workloads down)")

    fix = ("check gpus.yaml, profiles/ and compositions/ for a mistake; if the removal is intended, run one "
           "pass with --max-prune-share 1 (or GPUSHARE_MAX_PRUNE_SHARE=1)")


def exact_share(share: float) -> Fraction:
    """The share as the decimal it was written as (0.29, not the binary float just below it), so the guard's
    boundary is exact: removing exactly that share of the objects is allowed."""
    return Fraction(repr(float(share)))


def _percents(removed: Fraction, limit: Fraction) -> tuple[str, str]:
    """Both shares as percentages, with as many decimals as it takes to show that they differ."""
    for digits in range(0, 7):
        shown = tuple(f"{float(x * 100):.{digits}f}%" for x in (removed, limit))
        if shown[0] != shown[1]:
            return shown
    return f"{removed.numerator}/{removed.denominator}", f"{float(limit):g}"


def prune_hold(before: Iterable[str], after: Iterable[str], max_share: float, layout: Layout = SINGLE
               ) -> PruneHold | None:
    """The hold when the rendered objects (files under rendered/ but PLAN.md) would shrink from `before`
    (upstream's paths) to `after` (the paths the pass leaves) by more than `max_share` of `before`; None
    otherwise: removing exactly the share is allowed, and share 1 allows any removal. Distinct paths count,
    in exact arithmetic. Net numbers: a model that moves, or whose profiler Job gives way to its worker,
    replaces what it removes."""
    old, new = _objects(before, layout), _objects(after, layout)
    if old and Fraction(len(old) - len(new), len(old)) > exact_share(max_share):
        return PruneHold(len(old), len(new), max_share)
    return None


def _objects(paths: Iterable[str], layout: Layout) -> set[str]:
    """The rendered objects among `paths`: `layout`'s own (another cluster's never count as its removals)."""
    under = layout.rendered + "/"
    return {p for p in paths if p.startswith(under) and p != layout.plan_md}


@dataclass(frozen=True)
class Guarded:
    """What a pass hands to git: the files, the upstream paths kept as they are, and the hold if any."""

    files: Mapping[str, bytes]
    keep: frozenset[str]
    hold: PruneHold | None = None


def guarded_change(before: Iterable[str], files: Mapping[str, bytes], max_share: float,
                   keep: frozenset[str] = frozenset(), layout: Layout = SINGLE) -> Guarded:
    """The files and kept paths of a pass, or, when it would shrink the rendered objects by more than
    `max_share`, no files and every path upstream holds under the generated prefixes (`before`) kept as it
    is, so nothing is committed, with the hold that says why. What the pass leaves is its files and the kept
    paths upstream holds (a kept path upstream lacks is no object)."""
    before = set(before)
    hold = prune_hold(before, set(files) | (keep & before), max_share, layout)
    if hold is not None:
        return Guarded({}, frozenset(before), hold)
    return Guarded(files, keep)


def prune_share_setting(environ=os.environ) -> float:
    """GPUSHARE_MAX_PRUNE_SHARE (0 to 1), else PRUNE_SHARE_DEFAULT."""
    try:
        share = float(environ.get("GPUSHARE_MAX_PRUNE_SHARE", PRUNE_SHARE_DEFAULT))
    except ValueError:
        return PRUNE_SHARE_DEFAULT
    return share if 0 <= share <= 1 else PRUNE_SHARE_DEFAULT
