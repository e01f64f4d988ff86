"""Offline mode: one reconcile pass against a git repository, with no cluster.

Owns the adapter between the pure pass and gitops: read the inputs from the
checked-out tree (models/, gpus.yaml, profiles/, the last decisions/ and PLAN.md),
run controller.reconcile.run_pass, hand its files to gitops.publish. Called by
`gpushare reconcile --offline` and `gpushare demo` (controller.reconcile_cli).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from controller.compositions import Composition
from controller.load import load_decision_records, load_repo
from controller.reconcile import PassOutput, available_processes, run_pass
from gitops import Change, PublishResult, Target, WorkingCopy, publish

PLAN_MD = Path("rendered") / "PLAN.md"


@dataclass(frozen=True)
class OfflineResult:
    published: PublishResult
    output: PassOutput | None  # None when nothing moved upstream and the pass was skipped


def pass_over(root: Path, compositions: Mapping[str, Composition] | None = None) -> PassOutput:
    """The pass over a checked-out GitOps tree (pure but for reading files); `compositions`: the shipped
    ones when None."""
    plan_md = root / PLAN_MD
    return run_pass(load_repo(root), load_decision_records(root),
                    last_plan_md=plan_md.read_text(encoding="utf-8") if plan_md.is_file() else None,
                    compositions=compositions, processes=available_processes())


def reconcile_once(copy: WorkingCopy, target: Target | str = "direct",
                   previous: PublishResult | None = None, *,
                   compositions: Mapping[str, Composition] | None = None) -> OfflineResult:
    """Render on top of upstream, commit if the generated tree changed, push (retrying lost races)."""
    outputs: list[PassOutput] = []

    def render(root: Path) -> Change:
        out = pass_over(root, compositions)
        outputs.append(out)
        return Change(files=out.files, message=out.message)

    published = publish(copy, render, target=target, previous=previous)
    return OfflineResult(published, outputs[-1] if outputs else None)
