"""One reconcile pass, pure: inputs -> the generated tree, its commit message, what to report.

Owns the order of the stages (validate -> revive last good -> plan -> compose) and the
commit message. No I/O: the offline and cluster loops (controller.cli.reconcile_cmd,
controller.cli.cluster_loop) read the inputs through their adapters, call `run_pass`, and
hand `PassOutput.files` to gitops.publish.

Nothing is lost: a model whose document is broken now (its error names it, or its
whole file failed to parse) is planned and rendered from its last good spec, which
compose keeps beside each decision in decisions/<ns>/<name>.yaml; its error is still
reported. A model whose document is gone is removed.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from controller.rendering.compose import PLAN_FILE, Rendered, compose
from controller.rendering.compose_errors import ComposeError
from controller.rendering.compositions import Composition
from controller.inputs.load import DecisionRecord, revive_last_good
from controller.planning.plan import plan
from controller.rendering.planmd import CHANGES_HEADING, Change, last_change_lines
from controller.rendering.rollouts import Rollouts, last_line, with_line, worker_rollouts
from controller.rightsizing.planmd import section as rightsizing_section
from controller.rightsizing.planmd import with_section
from controller.rightsizing.records import Record as RightsizingRecord
from controller.types import InputError, Inputs, Plan


@dataclass(frozen=True)
class PassOutput:
    inputs: Inputs  # as planned: valid models plus the revived ones
    plan: Plan
    rendered: Rendered
    revived: tuple[str, ...]  # namespace/name served from their last good spec
    message: str

    @property
    def files(self) -> dict[str, bytes]:
        return {path: text.encode() for path, text in self.rendered.files.items()}

    @property
    def errors(self) -> tuple[InputError | ComposeError, ...]:
        return (*self.inputs.errors, *self.rendered.errors)


def run_pass(inputs: Inputs, records: Mapping[tuple[str, str], DecisionRecord], *, last_plan_md: str | None = None,
             compositions: Mapping[str, Composition] | None = None, processes: int = 1,
             last_workers: Mapping[str, str] | None = None,
             rightsizing: Mapping[tuple[str, str], RightsizingRecord] | None = None,
             prices: Mapping[str, float] | None = None) -> PassOutput:
    """`records`: what the last pass wrote (decisions/); `last_plan_md`: its rendered/PLAN.md;
    `processes`: how many processes may render a large pass (see compose); `last_workers`: the last
    rendered worker Deployments and ConfigMaps (path -> text), to tell restarts from in-place changes
    (None: not known, no workers line);
    `rightsizing`, `prices`: the right-sizing records and GPU prices PLAN.md lists open recommendations from."""
    planned, revived = revive_last_good(inputs, records)
    previous = {key: record.decision for key, record in records.items()}
    result = plan(planned, previous)
    rendered = compose(planned.models, result, planned.slots, previous, compositions=compositions,
                       last_changes=last_change_lines(last_plan_md), processes=processes)
    rollouts = worker_rollouts(last_workers, rendered.files) if last_workers is not None else Rollouts()
    plan_md = with_line(rendered.files[PLAN_FILE], rollouts.line if rollouts.any else last_line(last_plan_md))
    rendered.files[PLAN_FILE] = with_section(plan_md, rightsizing_section(rightsizing or {}, result.decisions,
                                                                          planned.slots, prices or {}),
                                             CHANGES_HEADING)
    message = commit_message(rendered.changes, rendered, revived, rollouts)
    return PassOutput(planned, result, rendered, revived, message)


def available_processes() -> int:
    """The CPUs this process may run on (at most 4): how many processes render a large pass."""
    return max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


def commit_message(changes: tuple[Change, ...], rendered: Rendered, revived: tuple[str, ...],
                   rollouts: Rollouts = Rollouts()) -> str:
    """`llm/chat-small: resident on n/gpu0 → swap on n/gpu0 (llm/coder-32b admitted)` for one change;
    a count and one line per change otherwise. Used only when the generated tree changed."""
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
    else:
        subject = "gpushare: re-render (templates, compositions or profiles changed; no decision moved)"
    if rollouts.restart or rollouts.in_place:
        subject += f" · workers: {rollouts.summary}"
    body = [c.summary for c in changes] if len(changes) > 1 else []
    body += [rollouts.line] if rollouts.any else []
    body += [f"served from its last good spec (its document is broken): {ref}" for ref in revived]
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
