"""One reconcile pass, pure: inputs -> the generated tree, its commit message, what to report.

Owns the order of the stages (validate -> revive last good -> plan -> compose), the
commit message, and the two rules that keep a bad pass from taking the fleet down:
`kept_owners` (a model that fails to render keeps what the last pass generated for it)
and the prune guard (`prune_hold`, `guarded_change`: a pass that would shrink the
rendered objects by more than a share commits nothing and says why). No I/O: the
offline and cluster loops (controller.cli.offline, controller.passes.cluster_pass)
read the inputs through controller.inputs.reader, call `run_pass`, and hand the
guarded Change to gitops.publish.

Nothing is lost: a model whose document is broken now (its error names it, or its
whole file failed to parse) is planned and rendered from its last good spec, which
compose keeps beside each decision in decisions/<ns>/<name>.yaml; its error is still
reported; a broken gpus.yaml, profile or composition is read from its last good copy
(the reader's job; `PassOutput.last_good` writes the copies back). A model whose
document is gone is removed.
"""
from __future__ import annotations

import os
import posixpath
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from contract.quantity import format_bytes as fb
from controller.inputs.layout import GENERATED, OWNERS_FILE, PLAN_MD, RENDERED_DIR, RIGHTSIZING_DIR
from controller.inputs.load import DecisionRecord, revive_last_good
from controller.planning.plan import plan
from controller.rendering.compose import Rendered, compose
from controller.rendering.compose_errors import ComposeError
from controller.rendering.compositions import Composition
from controller.rendering.planmd import CHANGES_HEADING, Change, last_change_lines
from controller.rendering.yamlout import dump
from controller.rightsizing.planmd import section as rightsizing_section
from controller.rightsizing.planmd import with_section
from controller.rightsizing.records import Record as RightsizingRecord
from controller.types import ElasticModel, InputError, Inputs, Plan

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

    @property
    def files(self) -> dict[str, bytes]:
        files = {**self.rendered.files, **self.last_good, OWNERS_FILE: dump_owners(self.owners)}
        return {path: text.encode() for path, text in sorted(files.items())}

    @property
    def errors(self) -> tuple[InputError | ComposeError, ...]:
        return (*self.inputs.errors, *self.rendered.errors)


def run_pass(inputs: Inputs, records: Mapping[tuple[str, str], DecisionRecord], *, last_plan_md: str | None = None,
             compositions: Mapping[str, Composition] | None = None, processes: int = 1,
             last_good: Mapping[str, str] | None = None, held: tuple[str, ...] = (),
             owners: Mapping[str, tuple[str, ...]] | None = None, last_workers: Mapping[str, str] | None = None,
             rightsizing: Mapping[tuple[str, str], RightsizingRecord] | None = None,
             prices: Mapping[str, float] | None = None, last_paths: Collection[str] | None = None) -> PassOutput:
    """`records`: what the last pass wrote (decisions/); `last_plan_md`: its rendered/PLAN.md;
    `processes`: how many processes may render a large pass (see compose); `last_good`, `held` and `owners`:
    the input files' last good copies, the files read from them, and each model's generated paths after the
    last pass (controller.inputs.reader.read_tree): a model that fails to render now keeps those;
    `last_workers`: the last rendered worker Deployments and ConfigMaps (path -> text), to tell restarts from
    in-place changes (None: not known, no workers line); `rightsizing`, `prices`: the right-sizing records and
    GPU prices PLAN.md lists open recommendations from (the records under RIGHTSIZING_DIR are always kept);
    `last_paths`: every generated path the last pass left, which tell the profiler Jobs this pass creates
    (None: not known, every Job counts as created)."""
    planned, revived = revive_last_good(inputs, records)
    previous = {key: record.decision for key, record in records.items()}
    result = plan(planned, previous)
    sources = {(p.model, p.gpu_product): p.source for p in planned.profiles}
    rendered = compose(planned.models, result, planned.slots, previous, compositions=compositions,
                       last=last_change_lines(last_plan_md), processes=processes, profile_sources=sources,
                       previous_paths=last_paths, previous_workers=last_workers)
    rendered.files[PLAN_MD] = with_section(rendered.files[PLAN_MD], rightsizing_section(rightsizing or {}, result.decisions,
                                                                        planned.slots, prices or {}),
                                           CHANGES_HEADING)
    quiet = quiet_changes(records, planned.models, result)
    now, keep = kept_owners(rendered, owners or {})
    return PassOutput(planned, result, rendered, revived,
                      commit_message(rendered.changes, rendered, revived, quiet=quiet, held=held),
                      dict(last_good or {}), held, now, keep | {RIGHTSIZING_DIR + "/"})


def kept_owners(rendered: Rendered, before: Mapping[str, tuple[str, ...]]
                ) -> tuple[dict[str, tuple[str, ...]], frozenset[str]]:
    """(each model's generated paths now, the paths to keep as upstream holds them). A model that could not
    be rendered this pass (a composition that renders invalid objects, a name clash) keeps what the last
    pass generated for it, and its entry carries forward, so its running objects survive until it is fixed."""
    now: dict[str, set[str]] = {}
    for path, refs in rendered.owners.items():
        for ref in refs:
            now.setdefault(ref, set()).add(path)
    keep: set[str] = set()
    for ref in sorted({error.ref for error in rendered.errors}):
        if ref not in now and before.get(ref):
            safe = {path for path in before[ref] if _keepable(path)}
            keep |= safe
            now[ref] = safe
    return {ref: tuple(sorted(paths)) for ref, paths in sorted(now.items())}, frozenset(keep)


def _keepable(path: object) -> bool:
    """A path read back from the owners file (a file in git anyone may edit) is kept only if it is a clean
    relative path under a generated prefix (gitops checks every kept path again before writing)."""
    return (isinstance(path, str) and path.startswith(GENERATED) and posixpath.normpath(path) == path
            and not any(part in ("", ".git") for part in path.split("/")) and "\\" not in path and "\0" not in path)


def dump_owners(owners: Mapping[str, tuple[str, ...]]) -> str:
    return OWNERS_HEADER + dump({ref: list(paths) for ref, paths in sorted(owners.items())})


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
    a count and one line per change otherwise; with no decision moved, the `quiet` spec changes. Used only
    when the generated tree changed."""
    moved = [c for c in changes if c.before is not None and c.after is not None]
    own = moved[0].ref if len(moved) == 1 else None  # the moved model's own change explains it first
    causes = [cause for ref, cause in sorted(_causes(changes), key=lambda rc: rc[0] != own)]
    shown = causes[:3] + ([f"{len(causes) - 3} more"] if len(causes) > 3 else [])
    why = f" ({', '.join(shown)})" if causes else ""
    if len(moved) == 1:
        subject = moved[0].summary + why
    elif len(changes) == 1:
        subject = changes[0].summary
    elif changes:
        subject = f"gpushare: {len(changes)} decisions changed{why}"
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


def prune_hold(before: Iterable[str], after: Iterable[str], max_share: float) -> PruneHold | None:
    """The hold when the rendered objects (files under rendered/ but PLAN.md) would shrink from `before`
    (upstream's paths) to `after` (the paths the pass leaves) by more than `max_share` of `before`; None
    otherwise: removing exactly the share is allowed, and share 1 allows any removal. Distinct paths count,
    in exact arithmetic. Net numbers: a model that moves, or whose profiler Job gives way to its worker,
    replaces what it removes."""
    old, new = _objects(before), _objects(after)
    if old and Fraction(len(old) - len(new), len(old)) > exact_share(max_share):
        return PruneHold(len(old), len(new), max_share)
    return None


def _objects(paths: Iterable[str]) -> set[str]:
    return {p for p in paths if p.startswith(f"{RENDERED_DIR}/") and p != PLAN_MD}


@dataclass(frozen=True)
class Guarded:
    """What a pass hands to git: the files, the upstream paths kept as they are, and the hold if any."""

    files: Mapping[str, bytes]
    keep: frozenset[str]
    hold: PruneHold | None = None


def guarded_change(before: Iterable[str], files: Mapping[str, bytes], max_share: float,
                   keep: frozenset[str] = frozenset()) -> Guarded:
    """The files and kept paths of a pass, or, when it would shrink the rendered objects by more than
    `max_share`, no files and every path upstream holds under the generated prefixes (`before`) kept as it
    is, so nothing is committed, with the hold that says why. What the pass leaves is its files and the kept
    paths upstream holds (a kept path upstream lacks is no object)."""
    before = set(before)
    hold = prune_hold(before, set(files) | (keep & before), max_share)
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
