"""Offline mode: one reconcile pass against a git repository, with no cluster.

Owns the adapter between the pure pass and gitops: read the inputs from the
checked-out tree (controller.repo.read_repo: models/, gpus.yaml, profiles/,
compositions/; the last decisions/ and PLAN.md), run controller.reconcile.run_pass,
hold the commit when it would prune too much (controller.reconcile.prune_hold),
hand its files to gitops.publish. Called by `gpushare reconcile --offline` and
`gpushare demo` (controller.reconcile_cli), and by `gpushare validate` and `plan`
through `pass_over`.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from controller.load import load_decision_records
from controller.reconcile import (PassOutput, PruneHold, available_processes, prune_hold, prune_share_setting,
                                  run_pass)
from controller.repo import read_repo
from controller.repofiles import files_under, read_optional
from gitops import Change, PublishResult, Target, WorkingCopy, publish
from gitops.paths import DEFAULT_OWNED

PLAN_MD = Path("rendered") / "PLAN.md"


@dataclass(frozen=True)
class OfflineResult:
    published: PublishResult
    output: PassOutput | None  # None when nothing moved upstream and the pass was skipped
    hold: PruneHold | None = None  # the pass would have pruned too much: nothing was committed


def pass_over(root: Path, processes: int | None = None) -> PassOutput:
    """The pass over a checked-out GitOps tree (pure but for reading files)."""
    repo = read_repo(root)
    return run_pass(repo.inputs, load_decision_records(root), last_plan_md=read_optional(root, PLAN_MD.as_posix()),
                    compositions=repo.compositions, processes=processes or available_processes(),
                    last_good=repo.last_good, held=repo.held)


def owned_files(root: Path, owned: tuple[str, ...] = DEFAULT_OWNED) -> list[str]:
    """The files upstream holds under the owned prefixes (the work tree is at upstream while a pass renders)."""
    return [path for prefix in owned for path in files_under(root, prefix.rstrip("/"))]


def guarded_change(root: Path, files: dict[str, bytes], message: str, max_share: float,
                   owned: tuple[str, ...] = DEFAULT_OWNED, keep: frozenset[str] = frozenset()
                   ) -> tuple[Change, PruneHold | None]:
    """The Change of a pass, or, when it would prune more than `max_share` of the rendered objects, a Change
    that keeps every owned file as upstream has it (so nothing is committed) and the hold that says why."""
    before = owned_files(root, owned)
    hold = prune_hold(before, files, max_share)
    if hold is not None:
        return Change(files={}, message=message, keep=frozenset(before)), hold
    return Change(files=files, message=message, keep=keep), None


def reconcile_once(copy: WorkingCopy, target: Target | str = "direct",
                   previous: PublishResult | None = None, max_prune_share: float | None = None) -> OfflineResult:
    """Render on top of upstream, commit if the generated tree changed, push (retrying lost races)."""
    share = prune_share_setting() if max_prune_share is None else max_prune_share
    outputs: list[tuple[PassOutput, PruneHold | None]] = []

    def render(root: Path) -> Change:
        out = pass_over(root)
        change, hold = guarded_change(root, out.files, out.message, share)
        outputs.append((out, hold))
        return change

    published = publish(copy, render, target=target, previous=previous)
    output, hold = outputs[-1] if outputs else (None, None)
    return OfflineResult(published, output, hold)
