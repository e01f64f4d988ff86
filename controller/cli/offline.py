"""Offline mode: one reconcile pass against a git repository, with no cluster.

Owns the adapter between the pure pass and gitops: read the checked-out tree
(controller.inputs.reader), run controller.passes.reconcile.run_pass, hand its files to gitops.publish. Called by
`gpushare reconcile --offline` and `gpushare demo` (controller.cli.reconcile_cmd).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from controller.inputs.layout import GENERATED
from controller.inputs.reader import read_repo
from controller.passes.reconcile import PassOutput, available_processes, run_pass
from controller.rendering.compositions import Composition
from gitops import Change, PublishResult, Target, WorkingCopy, publish


@dataclass(frozen=True)
class OfflineResult:
    published: PublishResult
    output: PassOutput | None  # None when nothing moved upstream and the pass was skipped


def pass_over(root: Path, compositions: Mapping[str, Composition] | None = None) -> PassOutput:
    """The pass over a checked-out GitOps tree (pure but for reading files); `compositions`: the shipped
    ones when None."""
    snapshot = read_repo(root)
    return run_pass(snapshot.inputs, snapshot.records, last_plan_md=snapshot.last_plan_md,
                    compositions=compositions, processes=available_processes())


def reconcile_once(copy: WorkingCopy, target: Target | str = "direct",
                   previous: PublishResult | None = None, *,
                   compositions: Mapping[str, Composition] | None = None,
                   progress: Callable[[str], None] = lambda phase: None) -> OfflineResult:
    """Render on top of upstream, commit if the generated tree changed, push (retrying lost races);
    `progress` hears each phase (a terminal shows it)."""
    outputs: list[PassOutput] = []

    def render(root: Path) -> Change:
        progress("reading, planning and rendering the checkout")
        out = pass_over(root, compositions)
        outputs.append(out)
        progress(f"planned {len(out.plan.decisions)} model(s); committing and pushing what changed")
        return Change(files=out.files, message=out.message)

    progress(f"fetching {copy.branch}")
    published = publish(copy, render, owned=GENERATED, target=target, previous=previous)
    return OfflineResult(published, outputs[-1] if outputs else None)
