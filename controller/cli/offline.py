"""Offline mode: one reconcile pass against a git repository, with no cluster.

Owns the adapter between the pure pass and gitops: read the checked-out tree
(controller.inputs.reader), run controller.passes.reconcile.run_pass, hand its files to gitops.publish. Called by
`gpushare reconcile --offline` and `gpushare demo` (controller.cli.reconcile_cmd).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from controller.inputs.layout import GENERATED, RIGHTSIZING_DIR
from controller.inputs.reader import read_repo
from controller.passes.reconcile import PassOutput, available_processes, run_pass
from gitops import Change, PublishResult, Target, WorkingCopy, publish


@dataclass(frozen=True)
class OfflineResult:
    published: PublishResult
    output: PassOutput | None  # None when nothing moved upstream and the pass was skipped


def pass_over(root: Path) -> PassOutput:
    """The pass over a checked-out GitOps tree (pure but for reading files)."""
    snapshot = read_repo(root)
    return run_pass(snapshot.inputs, snapshot.records, last_plan_md=snapshot.last_plan_md,
                    processes=available_processes(), last_workers=snapshot.tree.last_workers,
                    rightsizing=snapshot.tree.rightsizing, prices=snapshot.tree.prices)


def reconcile_once(copy: WorkingCopy, target: Target | str = "direct",
                   previous: PublishResult | None = None) -> OfflineResult:
    """Render on top of upstream, commit if the generated tree changed, push (retrying lost races)."""
    outputs: list[PassOutput] = []

    def render(root: Path) -> Change:
        out = pass_over(root)
        outputs.append(out)
        return Change(files=out.files, message=out.message, keep=frozenset({RIGHTSIZING_DIR + "/"}))

    published = publish(copy, render, owned=GENERATED, target=target, previous=previous)
    return OfflineResult(published, outputs[-1] if outputs else None)
