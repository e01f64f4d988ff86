"""Offline mode: one reconcile pass against a git repository, with no cluster.

Owns the adapter between the pure pass and gitops: read the checked-out tree
(controller.inputs.reader: models/, gpus.yaml, profiles/, compositions/, the last
decisions/ and PLAN.md, with the generated paths as git lists them: the working copy
checks out only what a pass reads as files, the rest is read from git), run controller.passes.reconcile.run_pass, hold the commit
when it would prune too much (controller.passes.reconcile.guarded_change), hand its
files to gitops.publish. With clusters/, one cluster's pass: its own paths only (Layout), what it read
named in the Change so another cluster's commit never makes it render again. Called by `gpushare
reconcile --offline` and `gpushare demo` (controller.cli.reconcile_cmd), and by `gpushare validate`
through `pass_over`.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from controller.cpu import gc_paused, in_background
from controller.inputs.layout import Layout
from controller.inputs.reader import Committed, read_repo
from controller.rendering.compose import warm_up
from controller.passes.reconcile import (PassOutput, PruneHold, available_processes, guarded_change,
                                         prune_share_setting, run_pass)
from gitops import Change, Checkout, PublishResult, Target, WorkingCopy, publish


@dataclass(frozen=True)
class OfflineResult:
    published: PublishResult
    output: PassOutput | None  # None when nothing moved upstream and the pass was skipped
    hold: PruneHold | None = None  # the pass would have pruned too much: nothing was committed


def pass_over(root: Path, processes: int | None = None, install: Mapping[str, object] | None = None,
              generated: Sequence[str] | None = None, committed: Committed | None = None,
              cluster: str | None = None) -> PassOutput:
    """The pass over a checked-out GitOps tree (pure but for reading files), called as cluster mode calls it
    but with no cluster facts; `install`: the install's composition parameters (controller.rendering.site),
    in place of the defaults the compositions leave unset; `generated`: the generated paths as git lists them
    (controller.inputs.reader.read_repo; None: a plain directory, listed as it is) and `committed` the commit in
    git, for the files the controller's sparse work tree leaves out (gitops.Checkout); `cluster`: the cluster planned, in
    a repository with clusters/ (controller.inputs.reader.ClusterNotFound when it has none of that name)."""
    processes = processes or available_processes()
    with gc_paused():
        tree = read_repo(root, processes, generated=generated, committed=committed, cluster=cluster)
        return run_pass(tree, install=install, processes=processes)


def reconcile_once(copy: WorkingCopy, target: Target | str = "direct",
                   previous: PublishResult | None = None, max_prune_share: float | None = None, *,
                   install: Mapping[str, object] | None = None,
                   progress: Callable[[str], None] = lambda phase: None, cluster: str | None = None) -> OfflineResult:
    """Render on top of upstream, commit if the generated tree changed, push (retrying lost races); hold the
    commit when it would shrink the rendered objects by more than `max_prune_share` (default: the setting).
    `progress` hears each phase (a terminal shows it). `cluster`: with clusters/, the one cluster planned and
    written (its paths only: rendered/<cluster>/, decisions/<cluster>/)."""
    share = prune_share_setting() if max_prune_share is None else max_prune_share
    outputs: list[tuple[PassOutput, PruneHold | None]] = []
    layout = Layout(cluster)

    def render(checkout: Checkout) -> Change:
        progress("reading, planning and rendering the checkout")
        warmed()
        out = pass_over(checkout.root, install=install, generated=checkout.generated, committed=checkout,
                        cluster=cluster)
        guarded = guarded_change(checkout.generated, out.files, share, keep=out.keep, layout=layout)
        outputs.append((out, guarded.hold))
        progress(f"planned {len(out.plan.decisions)} model(s); committing and pushing what changed")
        return Change(files=guarded.files, message=out.message, keep=guarded.keep, reads=out.reads)

    progress(f"fetching {copy.branch}")
    warmed = in_background(warm_up)  # compiled while git fetches
    try:
        published = publish(copy, render, owned=layout.generated, target=target, previous=previous)
    finally:
        warmed()  # never left running into a later pass's forks
    output, hold = outputs[-1] if outputs else (None, None)
    return OfflineResult(published, output, hold)
