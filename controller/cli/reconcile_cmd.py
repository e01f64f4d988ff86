"""`gpushare reconcile` and `gpushare demo`: the loops around the pure pass.

Owns flag parsing for the two commands and the offline polling pass (the
timing is controller.cli.loop's; what a pass prints is controller.cli.common's). Offline passes go through
controller.cli.offline; cluster passes (`--kube`) through controller.cli.cluster_loop. With --prometheus,
a right-sizing pass (controller.cli.rightsizing_loop) runs before a reconcile pass whenever it is due.
A repository with clusters/ is reconciled one cluster at a time, each in its own working copy and on its own
paths (`--cluster NAME`: that cluster only, as its installed controller runs; offline without it: every
cluster in turn); its review branches are the cluster's own (`NAME/<cluster>`).
Called by controller.cli.commands.
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from controller.cli.fleet import cluster_name
from controller.cli.common import (cluster_target, controller_copy, credentials_from, default_workdir,
                                   forge_from_settings, from_directory, install_values, outcome_line, reviewers, show)
from controller.cli.logs import Progress
from controller.cli.report import fail
from controller.cli.loop import Outcome, run_loop
from controller.cli.offline import OfflineResult, reconcile_once
from controller.cli.rightsizing_loop import RightsizingFlagInvalid, prometheus_url, schedule_from
from controller.cli.rightsizing_loop import add_arguments as add_rightsizing_arguments
from controller.inputs.layout import SINGLE, Layout
from controller.inputs.reader import ClusterNotFound, repository_clusters
from controller.rightsizing.cli import print_pass as show_rightsizing
from controller.rendering.site import InstallParameterInvalid
from contract.durations import duration_flag
from gitops import Checkout, GitError, Identity, PublishResult, parse_target
from gitops.forge import KINDS
from gitops.git import Git

log = logging.getLogger("gpushare.reconcile")
duration = duration_flag  # the one duration syntax (contract.durations)
CLUSTER_SETTING = "GPUSHARE_CLUSTER"  # the install's CLUSTER (deploy/overlays/many-clusters): --cluster's default


def share(text: str) -> float:
    """A share between 0 and 1 (the --max-prune-share flag)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a share between 0 and 1; write e.g. 0.5")
    return value


def _target(text: str):
    try:
        return parse_target(text)
    except GitError as exc:
        raise argparse.ArgumentTypeError(f"{exc.message}; {exc.fix}") from None


def example_fleet() -> Path:
    """examples/fleet: package data (gpushare_examples) in a wheel or an image, the checkout's directory
    in an editable install made before pyproject.toml mapped it (`make` reinstalls when pyproject.toml changes)."""
    try:
        from gpushare_examples import FLEET
    except ImportError:
        return Path(__file__).resolve().parents[2] / "examples" / "fleet"
    return FLEET


EXAMPLE_FLEET = example_fleet()


def add_commands(sub) -> None:
    rec = sub.add_parser("reconcile", help="plan, render and commit back to git (offline or against a cluster)")
    where = rec.add_mutually_exclusive_group(required=True)
    where.add_argument("--offline", action="store_true", help="inventory from gpus.yaml, profiles from the repo")
    where.add_argument("--kube", action="store_true", help="facts from the Kubernetes API, status onto ElasticModels")
    rec.add_argument("--repo", default=".", help="the GitOps repository: a URL or a local path (default: .)")
    rec.add_argument("--branch", default="main", help="the tracked branch (default: main)")
    rec.add_argument("--write-back", type=_target, default=parse_target("direct"), metavar="direct|branch:NAME|pr:NAME",
                     help="commit to the tracked branch, or to a review branch for pull requests")
    rec.add_argument("--workdir", type=Path, help="the controller's checkout (default: a cache dir per repo; with "
                     "clusters/ and no --cluster, one more per cluster beside it, DIR-<cluster>)")
    rec.add_argument("--cluster", metavar="NAME", type=cluster_name, default=os.environ.get(CLUSTER_SETTING) or None,
                     help="in a repository with clusters/: plan and write this cluster's paths only (rendered/NAME/, "
                          "decisions/NAME/, profiles/measured/NAME/), its review branch NAME/<cluster> (default: "
                          f"{CLUSTER_SETTING}; offline without it: every cluster, one after another)")
    loop = rec.add_mutually_exclusive_group()
    loop.add_argument("--once", action="store_true", help="one pass, then exit (the default offline)")
    loop.add_argument("--interval", type=duration, help="poll: one pass every DURATION (e.g. 30s), with jitter")
    rec.add_argument("--worker-image", metavar="IMAGE",
                     help="the image workers and profiler Jobs run, for every composition that does not set its "
                          "own `image` (the install sets it from WORKER_IMAGE; default: the schema's default)")
    rec.add_argument("--forge", choices=KINDS, help="pr:NAME: the forge's API (default: github for github.com, "
                     "gitlab for gitlab.* hosts)")
    rec.add_argument("--forge-api-url", metavar="URL", help="pr:NAME: the forge's API base URL (default: "
                     "https://api.github.com, https://HOST/api/v4 for GitLab, https://HOST/api/v1 for Gitea)")
    rec.add_argument("--max-prune-share", type=share, default=None, metavar="SHARE",
                     help="hold a pass that would remove more than this share (0 to 1) of the rendered objects "
                          "(default: GPUSHARE_MAX_PRUNE_SHARE, else 0.5; 1 turns the guard off)")
    rec.add_argument("--git-token-file", type=Path, help="HTTPS token, read from a file (a mounted Secret)")
    rec.add_argument("--git-username", default="x-access-token")
    rec.add_argument("--git-ssh-key-file", type=Path)
    rec.add_argument("--git-credentials-dir", type=Path, metavar="DIR",
                     help="a mounted Secret: its `token` (HTTPS) or `ssh-privatekey` and `known_hosts` (SSH)")
    rec.add_argument("--git-known-hosts-file", type=Path)
    from controller.cli.cluster_loop import add_cluster_arguments

    add_cluster_arguments(rec)
    add_rightsizing_arguments(rec)
    rec.set_defaults(run=_reconcile)

    demo = sub.add_parser("demo", help="the main job on the embedded example: a throwaway git repo, one pass")
    demo.add_argument("--from", dest="source", type=Path, default=EXAMPLE_FLEET,
                      help="the GitOps tree to seed the throwaway repo with (default: examples/fleet)")
    demo.add_argument("--keep", action="store_true", help="keep the throwaway repo and print where it is")
    demo.set_defaults(run=_demo)


def warn_direct(args) -> bool:
    """A polling controller (--kube or --interval) that commits straight to the tracked branch says so in its log:
    `direct` is an explicit choice, never a silent default of the install."""
    if args.write_back.review is not None or not (args.kube or args.interval):
        return False
    logging.getLogger("gpushare.reconcile").warning(
        "--write-back direct: every pass commits straight to %s, which Argo CD syncs (and prunes) without review; "
        "the install's default is a review branch (WRITE_BACK in deploy/default/settings.env, docs/guide.md)",
        args.branch)
    return True


def _reconcile(args) -> int:
    from_directory(args)  # before anything reads a credential flag (the forge's token too)
    forge_from_settings(args)
    try:
        install = install_values(args)
    except InstallParameterInvalid as exc:
        print(f"gpushare: [{exc.reason}] {exc.message}", file=sys.stderr)
        return 2
    try:
        prometheus_url(args)  # refuse a bad --prometheus or --rightsize-window before touching git
    except RightsizingFlagInvalid as exc:
        print(f"gpushare: [{exc.reason}] {exc}", file=sys.stderr)
        return 2
    warn_direct(args)
    if args.kube:
        from controller.cli.cluster_loop import run_cluster

        return run_cluster(args)
    passes: dict[str | None, Callable[[PublishResult | None], OfflineResult]] = {}

    def every_pass(previous: dict[str | None, PublishResult] | None) -> _Each:
        """Each cluster's pass. The clusters are read at the first pass (not before the loop: a git failure
        while reading them is that pass's, retried as any other), and kept for the process's life."""
        if not passes:
            passes.update((cluster, _offline_pass(args, cluster, install)) for cluster in _offline_clusters(args))
        results = {}
        for cluster, one_pass in passes.items():
            if len(passes) > 1 and not args.interval:
                print(f"== cluster {cluster} ==")
            results[cluster] = one_pass((previous or {}).get(cluster))
        return _Each(results)

    if not args.interval:
        try:
            each = every_pass(None)
        except GitError as exc:
            return fail(exc)
        except ClusterNotFound as exc:
            return fail(exc, 2)
        return 1 if any(result.hold is not None for result in each.results.values()) else 0
    return poll(every_pass, args.interval)


@dataclass(frozen=True)
class _Each:
    """The passes of every cluster an offline run reconciles, in order, by cluster."""

    results: dict[str | None, OfflineResult]

    @property
    def published(self) -> dict[str | None, PublishResult]:
        return {cluster: result.published for cluster, result in self.results.items()}


def _offline_clusters(args) -> list[str | None]:
    """The clusters an offline run reconciles: --cluster, else every cluster of the repository's tracked branch
    (read through a working copy of the single-cluster layout), else the one implicit cluster (None)."""
    if args.cluster is not None:
        return [args.cluster]
    probe = controller_copy(args.repo, args.branch, args.workdir or default_workdir(args.repo, args.branch),
                            credentials_from(args))
    head = probe.sync()[probe.branch]
    names = repository_clusters(probe.root, Checkout.at(probe, head, ()))
    if names is None:
        return [None]
    if not names:
        raise ClusterNotFound(f"{args.repo} has clusters/ but no usable cluster folder in it",
                              "add clusters/<name>/gpus.yaml (`gpushare validate` lists what is wrong)")
    return list(names)


def _offline_pass(args, cluster: str | None, install):
    """One cluster's offline pass (right-sizing first when due), in its own working copy."""
    layout = SINGLE if cluster is None else Layout(cluster)
    workdir = args.workdir or default_workdir(args.repo, args.branch)
    if cluster is not None and args.cluster is None:  # every cluster in turn: one copy each, beside --workdir's
        workdir = workdir.with_name(f"{workdir.name}-{cluster}")
    elif cluster is not None and args.workdir is None:
        workdir = default_workdir(args.repo, args.branch, cluster)
    copy = controller_copy(args.repo, args.branch, workdir, credentials_from(args), layout)
    target = cluster_target(args.write_back, layout)
    review, propose = reviewers(args, copy, target, layout)
    rightsizing = schedule_from(args, review=propose, cluster=cluster)

    def one_pass(previous: PublishResult | None) -> OfflineResult:
        if rightsizing is not None:  # before the reconcile pass, which then plans with its records
            done = rightsizing.run_if_due(copy)
            if done is not None and not args.interval:
                show_rightsizing(done)
        if args.interval:  # polling: timestamped log lines, no table per pass
            result = reconcile_once(copy, target, previous, args.max_prune_share, install=install, cluster=cluster)
            log.info("%s%s", f"{cluster}: " if cluster else "", outcome_line(result.published))
            if result.hold is not None:
                log.warning("held: %s Fix: %s", result.hold.message, result.hold.fix)
        else:
            progress = Progress()
            try:
                result = reconcile_once(copy, target, previous, args.max_prune_share, install=install,
                                        progress=progress, cluster=cluster)
            finally:
                progress.done()
            show(result)
        review(result.published)
        return result

    return one_pass


def poll(one_pass, interval_s: float, *, sleep=time.sleep, passes: int | None = None) -> int:
    """Offline polling on the shared loop (controller.cli.loop): a failed pass is reported and retried (`one_pass`
    is given the result of the last pass that succeeded, None at first).
    No exception ends the loop: an unexpected one (a bug, a file nobody foresaw) is reported with its type
    and backed off like a git error, and the next pass renders again whatever moved."""
    previous: list = [None]

    def attempt() -> Outcome:
        try:
            result = one_pass(previous[0])  # it shows (or logs) the pass
        except (GitError, ClusterNotFound) as exc:
            log.error("[%s] %s Fix: %s", exc.reason, exc.message, exc.fix)
            return Outcome(False)
        except Exception as exc:  # noqa: BLE001 - the loop must outlive any one pass
            log.error("pass failed unexpectedly", exc_info=True)
            text = str(exc).splitlines()[0][:200] if str(exc) else ""
            print(f"gpushare: [PassCrashed] the pass raised {type(exc).__name__}: {text}\n"
                  "  fix: report this as a bug with the log above; the loop goes on", file=sys.stderr)
            previous[0] = None
            return Outcome(False)
        previous[0] = result.published
        return Outcome(True)

    return run_loop(attempt, interval_s, wait=sleep, passes=passes,
                    on_retry=lambda seconds: log.warning("retrying in %.0f s", seconds))


def _demo(args) -> int:
    source = args.source.resolve()
    if not (source / "models").is_dir():
        print(f"gpushare: {source} has no models/ directory; pass --from a GitOps tree", file=sys.stderr)
        return 2
    base = Path(tempfile.mkdtemp(prefix="gpushare-demo-"))
    try:
        remote = seed_remote(source, base)
        print(f"seeded a throwaway git repository from {source}: {remote}\n")
        for cluster in repository_clusters(source) or (None,):  # with clusters/: each cluster's controller in turn
            if cluster is not None:
                print(f"== cluster {cluster} ==")
            where = base / ("controller" if cluster is None else f"controller-{cluster}")
            copy = controller_copy(str(remote), "main", where, layout=Layout(cluster))
            first = reconcile_once(copy, cluster=cluster)
            show(first)
            if first.published.changed:
                commit = first.published.commit
                log = Git(where, identity=Identity()).text("show", "--stat=100", "--format=%h %s%n%n%b", commit)
                print(f"\n$ git show --stat {commit[:12]}\n{log}")
            print("\nA second pass over the same inputs commits nothing:")
            show(reconcile_once(copy, cluster=cluster), table=False)
    except GitError as exc:
        return fail(exc)
    finally:
        if args.keep:
            print(f"\nkept: {base} (the controller's checkout is {base / 'controller'})")
        else:
            shutil.rmtree(base, ignore_errors=True)
    return 0


def seed_remote(source: Path, base: Path) -> Path:
    """A bare repository whose main branch holds `source`'s files, committed by a user."""
    remote, seed = base / "fleet.git", base / "seed"
    user = Identity("platform-engineer", "platform@example.com")
    Git(base, identity=user).run("init", "-q", "--bare", "-b", "main", str(remote))
    shutil.copytree(source, seed, symlinks=True,  # a link is committed as a link (the reader refuses one out)
                    ignore=shutil.ignore_patterns("rendered", "decisions"))
    git = Git(seed, identity=user)
    git.run("init", "-q", "-b", "main")
    git.run("add", "--all")
    git.run("commit", "-q", "-m", "fleet: models, GPU inventory and profiles")
    git.run("push", "-q", str(remote), "main")
    return remote
