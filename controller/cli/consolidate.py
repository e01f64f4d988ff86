"""`gpushare consolidate`: the proposal that gives pool GPUs back, printed or published for review.

Owns the command and the shell around controller.planning.consolidate:
- `gpushare consolidate PATH` prints the proposal for a GitOps directory: the models that would move (from
  → to), the pool nodes and GPUs given back, the cost per month before → after, and why each other pool node
  stays; nothing is written.
- `gpushare consolidate --repo URL_OR_PATH --propose` publishes it as one reviewed change: the branch
  CONSOLIDATION_BRANCH (the tracked branch plus the pass rendered with the consolidated plan: manifests,
  decisions, PLAN.md), one commit whose message lists what moves and what it saves; with `--write-back
  pr:NAME`'s forge settings (`--pr`), its pull request too. Merged, its decisions are the last decisions the
  next pass keeps (the stability rule), so that pass commits nothing. Never pushed to the tracked branch.
- `ConsolidationSchedule`: the same proposal, periodically, from the cluster loop (controller.cli.cluster_loop,
  `--consolidate-interval`), on the leader, with the cluster's facts.
With clusters/ (`--cluster NAME`), one cluster's proposal: its plan, its paths, its own branch
(CONSOLIDATION_BRANCH/<cluster>).
The disruption bound is `--max-moves` (default controller.planning.consolidate.DEFAULT_MAX_MOVES); a model
inside its right-sizing upsize window or predicted to miss its SLO never moves. Exit codes: 0 ok (a proposal
or none), 1 the repository or git failed, 2 bad arguments.
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from contract.durations import duration_flag as duration
from controller.cli.report import fail
from controller.inputs.layout import SINGLE, Layout
from controller.inputs.reader import ClusterNotFound, read_repo
from controller.inputs.tree import Tree
from controller.passes.measured import ClusterFacts
from controller.passes.reconcile import PassOutput, guarded_change, plan_bill, prune_share_setting, run_pass
from controller.planning.bill import change_line
from controller.planning.consolidate import DEFAULT_MAX_MOVES, Proposal, consolidate, held_models
from controller.planning.plan import plan
from controller.types import Decision, Inputs, Plan
from gitops import Change, Checkout, GitError, PublishResult, Target, WorkingCopy, publish

log = logging.getLogger("gpushare.consolidate")
CONSOLIDATION_BRANCH = "gpushare/consolidation"
DEFAULT_INTERVAL_S = 3600  # the cluster loop's periodic proposal: hourly (0 turns it off)


def add_commands(sub) -> None:
    cmd = sub.add_parser("consolidate", help="propose the plan that serves the same models on fewer pool GPUs")
    cmd.add_argument("path", type=Path, nargs="?", help="a GitOps directory: print the proposal, write nothing")
    cmd.add_argument("--repo", help="the GitOps repository (a URL or a local path) to publish the proposal to, "
                                    "with --propose")
    cmd.add_argument("--branch", default="main", help="the tracked branch of --repo (default: main)")
    cmd.add_argument("--workdir", type=Path, help="--repo: the checkout to use (default: a cache dir per repo)")
    cmd.add_argument("--propose", action="store_true",
                     help=f"publish the proposal to the review branch {CONSOLIDATION_BRANCH} (never the tracked "
                          "branch)")
    cmd.add_argument("--max-moves", type=_positive, default=DEFAULT_MAX_MOVES, metavar="N",
                     help=f"the disruption bound: at most N models moved by one proposal (default: "
                          f"{DEFAULT_MAX_MOVES})")
    cmd.add_argument("--cluster", metavar="NAME",
                     help="in a repository with clusters/: the cluster whose pool GPUs to give back (its branch: "
                          f"{CONSOLIDATION_BRANCH}/NAME)")
    cmd.set_defaults(run=_run)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1; write e.g. 5")
    return value


def add_cluster_arguments(parser) -> None:
    parser.add_argument("--consolidate-interval", type=duration, default=DEFAULT_INTERVAL_S, metavar="DURATION",
                        help=f"cluster mode: the leader publishes a consolidation proposal to {CONSOLIDATION_BRANCH} "
                             "every DURATION when pool GPUs can be given back (default: 1h; 0: never)")
    parser.add_argument("--consolidate-max-moves", type=_positive, default=DEFAULT_MAX_MOVES, metavar="N",
                        help=f"cluster mode: at most N models moved per proposal (default: {DEFAULT_MAX_MOVES})")


@dataclass(frozen=True)
class Outcome:
    """One proposal: the pass rendered with it, and what was published (None: printed only, or nothing to do)."""

    proposal: Proposal
    output: PassOutput
    published: PublishResult | None = None


def proposing(max_moves: int, now: float, found: list[Proposal]) -> Callable[[Inputs, Mapping], Plan]:
    """The plan_with of controller.passes.reconcile.run_pass: the normal plan, consolidated; each proposal is
    appended to `found`."""
    def plan_with(inputs: Inputs, previous: Mapping[tuple[str, str], Decision]) -> Plan:
        current = plan(inputs, previous)
        held = held_models({m.key: m for m in inputs.models}, {d.key: d for d in current.decisions}, now)
        proposal = consolidate(inputs, current, max_moves=max_moves, held=held)
        found.append(proposal)
        return proposal.plan
    return plan_with


def propose_tree(tree: Tree, max_moves: int, now: float, facts: ClusterFacts | None = None,
                 install: Mapping[str, object] | None = None) -> Outcome:
    """The pass over `tree` rendered with the consolidated plan (pure but for the clock given as `now`)."""
    found: list[Proposal] = []
    output = run_pass(tree, facts, install=install, plan_with=proposing(max_moves, now, found))
    return Outcome(found[-1], output)


def message(outcome: Outcome) -> str:
    """The proposal's commit message: what is given back and saved, then each move and each node that stays."""
    proposal, inputs = outcome.proposal, outcome.output.inputs
    before, after = plan_bill(inputs, proposal.before.decisions), plan_bill(inputs, proposal.plan.decisions)
    n, gpus, moves = len(proposal.freed_nodes), proposal.freed_gpus, len(proposal.moves)
    subject = (f"gpushare consolidate: give back {n} pool node{'s' * (n != 1)} ({gpus} GPU{'s' * (gpus != 1)}), "
               f"{moves} model{'s' * (moves != 1)} move; {change_line(before, after)}")
    body = [f"{m.ref}: {_where(m.before)} → {_where(m.after)}" for m in proposal.moves]
    body += [f"given back: {node} (its workers leave; the autoscaler removes the node)" for node in proposal.freed_nodes]
    body += [f"stays: {node}: {why}" for node, why in proposal.kept]
    body += ["", "Merging applies it: the next pass keeps these decisions (the stability rule) and commits nothing; "
                 "a normal pass never moves a model to give a GPU back."]
    return subject + "\n\n" + "\n".join(body) + "\n"


def _where(d: Decision) -> str:
    layers = f" {d.resident_layers}/{d.total_layers} layers" if d.mode == "elastic" else ""
    return f"{d.mode}{layers} on {d.slot}"


def lines(outcome: Outcome) -> list[str]:
    """What `gpushare consolidate PATH` prints."""
    if not outcome.proposal.changed:
        kept = [f"  {node}: {why}" for node, why in outcome.proposal.kept]
        return ["nothing to give back: every pool node the plan keeps is needed"
                + (" (or held):" if kept else "."), *kept]
    return message(outcome).rstrip("\n").splitlines()


def publish_proposal(copy: WorkingCopy, max_moves: int, now: float, *, facts: ClusterFacts | None = None,
                     install: Mapping[str, object] | None = None, guard: Callable[[], None] = lambda: None,
                     branch: str = CONSOLIDATION_BRANCH, max_prune_share: float | None = None,
                     layout: Layout = SINGLE) -> Outcome | None:
    """Publish the proposal to `branch` (with clusters/, `layout`'s own: `branch`/<cluster>) as one commit on top of
    the tracked branch; None when nothing can be given back on the tracked branch's head (nothing is pushed). The
    prune guard holds it like any pass (logged)."""
    share = prune_share_setting() if max_prune_share is None else max_prune_share
    heads = copy.sync()
    owned = layout.cluster_generated
    checkout = Checkout.at(copy, heads[copy.branch], owned)
    if not _propose_on(checkout, max_moves, now, facts, install, layout).proposal.changed:
        return None
    found: list[Outcome] = []

    def render(checkout: Checkout) -> Change:
        outcome = _propose_on(checkout, max_moves, now, facts, install, layout)
        found.append(outcome)
        guarded = guarded_change(checkout.generated, outcome.output.files, share, keep=outcome.output.keep,
                                 layout=layout)
        if guarded.hold is not None:
            log.warning("consolidation proposal held: %s Fix: %s", guarded.hold.message, guarded.hold.fix)
        guard()
        text = message(outcome) if outcome.proposal.changed else (
            "gpushare consolidate: nothing to give back any more (the tracked branch moved)\n\n"
            "This branch holds the normal pass; close its pull request.\n")
        return Change(files=guarded.files, message=text, keep=guarded.keep)

    published = publish(copy, render, owned=layout.generated, target=Target(layout.branch(branch)))
    return Outcome(found[-1].proposal, found[-1].output, published)


def _propose_on(checkout: Checkout, max_moves: int, now: float, facts: ClusterFacts | None,
                install: Mapping[str, object] | None, layout: Layout) -> Outcome:
    tree = read_repo(checkout.root, generated=checkout.generated, committed=checkout, cluster=layout.cluster)
    return propose_tree(tree, max_moves, now, facts, install)


class ConsolidationSchedule:
    """The cluster loop's periodic proposal: due every `interval_s`; a failure is logged and retried next time."""

    def __init__(self, interval_s: float, max_moves: int, *, clock: Callable[[], float] = time.time,
                 review: Callable[[bool, PublishResult], None] | None = None, layout: Layout = SINGLE):
        self.interval_s, self.max_moves, self.clock, self.review = interval_s, max_moves, clock, review
        self.layout = layout  # with clusters/: the cluster whose proposal this is
        self.next_at: float | None = None

    def due(self) -> bool:
        return self.interval_s > 0 and (self.next_at is None or self.clock() >= self.next_at)

    def run_if_due(self, copy: WorkingCopy, facts: ClusterFacts, install: Mapping[str, object] | None,
                   guard: Callable[[], None]) -> Outcome | None:
        if not self.due():
            return None
        now = self.clock()
        self.next_at = now + self.interval_s
        try:
            outcome = publish_proposal(copy, self.max_moves, now, facts=facts, install=install, guard=guard,
                                       layout=self.layout)
        except (GitError, ClusterNotFound) as exc:
            log.error("consolidation proposal failed: [%s] %s Fix: %s", exc.reason, exc.message, exc.fix)
            return None
        if outcome is not None and outcome.published is not None:
            log.info("consolidation proposal on %s: %s", outcome.published.branch,
                     outcome.published.message.splitlines()[0])
            if self.review is not None and outcome.published.changed:
                self.review(True, outcome.published)
        return outcome


def _run(args) -> int:
    if bool(args.path) == bool(args.repo) or (args.repo and not args.propose) or (args.path and args.propose):
        print("gpushare: consolidate takes a GitOps directory PATH (print the proposal), or --repo URL_OR_PATH "
              "--propose (publish it for review)", file=sys.stderr)
        return 2
    now = time.time()
    if args.path:
        if not (args.path / "models").is_dir():
            print(f"gpushare: {args.path} has no models/ directory; pass the root of a GitOps repo", file=sys.stderr)
            return 1
        try:
            tree = read_repo(args.path, cluster=args.cluster)
        except ClusterNotFound as exc:
            return fail(exc, 2)
        print("\n".join(lines(propose_tree(tree, args.max_moves, now))))
        return 0
    from controller.cli.common import controller_copy, default_workdir
    layout = Layout(args.cluster)
    try:
        copy = controller_copy(args.repo, args.branch,
                               args.workdir or default_workdir(args.repo, args.branch, args.cluster), layout=layout)
        outcome = publish_proposal(copy, args.max_moves, now, layout=layout)
    except GitError as exc:
        return fail(exc)
    except ClusterNotFound as exc:
        return fail(exc, 2)
    if outcome is None:
        print("nothing to give back: every pool node the plan keeps is needed; nothing published")
        return 0
    print("\n".join(lines(outcome)))
    published = outcome.published
    print(f"\npublished {published.commit[:12]} to {published.branch}" if published.changed
          else f"\nno change: {published.branch} already holds this proposal")
    return 0
