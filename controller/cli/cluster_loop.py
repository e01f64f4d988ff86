"""Cluster mode (`gpushare reconcile --kube`): the same pass, with facts from the Kubernetes API.

Owns the shell around the pass in a cluster: `ClusterReconciler.reconcile_once()` is one
pass (leader check -> the right-sizing pass when due (controller.cli.rightsizing_loop;
the leader only, its pushes guarded by the Lease) -> facts from the API -> render and
publish to git -> the fleet's bill on /metrics -> worker pods' host memory resized in place
(controller.kube.resize) -> observe -> status -> the consolidation proposal when due, to its review branch
(controller.cli.consolidate)), `ClusterReconciler.run()` the polling loop (jittered interval, exponential
backoff with jitter after API or git errors, Lease renewals while it waits), and
`run_cluster(args)` builds the adapters from the command line. Every I/O adapter is
passed in (Cluster, WorkingCopy, the election, clock, sleep), so tests drive a pass
against the API server double and a real git remote. Git is the source of truth for
ElasticModels (models/); the cluster's ElasticModel objects only receive status.
With clusters/ in the repository, a reconciler serves one cluster (`--cluster NAME`): it reads that
cluster's models and writes that cluster's paths only (controller.inputs.layout.Layout), names what its
render read so another cluster's commit costs it no render (gitops.Change.reads), and reads its own
Argo CD Application (default argocd/gpushare-<cluster>, the ApplicationSet's name for it), from the
cluster Argo CD runs in when that is another one (`--argocd-kubeconfig`).
Called by controller.cli.reconcile_cmd; the pure pieces live in controller.passes.cluster_pass.
"""
from __future__ import annotations

import argparse
import datetime
import logging
import random
import signal
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from kubernetes import config

from contract import kube
from controller.cpu import gc_paused, in_background
from controller.kube.cluster import Cluster
from controller.observe.facts import ClusterError, VerdictKey, app_state, gpu_slots, node_labels
from controller.inputs.layout import Layout
from controller.inputs.reader import ClusterNotFound, read_repo
from controller.inputs.rightsizing_records import observed_models
from controller.passes.measured import ClusterFacts
from controller.passes.cluster_pass import (LiveObject, ModelView, application_for, model_views,
                                     not_in_git, render_in_cluster, status_model, verdict_sources)
from controller.kube.leader import LeaderElection
from controller.kube.resize import WorkerResizer
from controller.cli.metrics import ControllerMetrics, Health, MetricsServer
from controller.cli.report import fail
from controller.cli.offline import OfflineResult
from controller.passes.reconcile import PassOutput, available_processes, plan_bill, prune_share_setting
from controller.planning.bill import namespace_costs
from controller.rendering.compose import warm_up
from controller.cli.common import (cluster_target, controller_copy, credentials_from, default_workdir,
                                   install_values, reviewers, show)
from controller.cli.loop import BACKOFF_BASE_S, MAX_BACKOFF_S, Outcome, backoff_s, run_loop
from controller.cli.consolidate import ConsolidationSchedule
from controller.cli.consolidate import add_cluster_arguments as add_consolidation_arguments
from controller.cli.rightsizing_loop import RightsizingSchedule, schedule_from
from controller.observe.status import (JobState, Observed, WorkerVerdict, WorkloadState, conditions_for, needs_write,
                               status_patch)
from gitops import Change, Checkout, GitError, PublishResult, Target, WorkingCopy, parse_target, publish
from gitops.errors import RevisionNotFound

log = logging.getLogger("gpushare.cluster")

DEFAULT_APPLICATION = ("argocd", "gpushare-rendered")
DEFAULT_INTERVAL_S = 30.0
RENEW_EVERY_S = 2.0  # how often a waiting leader renews its Lease (client-go's retry period)
CACHE_ENTRIES = 10_000  # git answers remembered across passes (commit per path set, ancestry per pair)


def default_applications(cluster: str | None) -> tuple[tuple[str, str], ...]:
    """The Application a controller reads by default: the install's, or its cluster's from the ApplicationSet
    (config/argocd/applicationset.yaml names each `gpushare-<cluster>`)."""
    return (DEFAULT_APPLICATION,) if cluster is None else ((DEFAULT_APPLICATION[0], f"gpushare-{cluster}"),)


def application_ref(text: str) -> tuple[str, str] | None:
    """`NAMESPACE/NAME` of an Argo CD Application (the --argocd-application flag); empty: the default one (an
    install setting left empty: with --cluster, the cluster's own Application)."""
    if not text.strip():
        return None
    namespace, _, name = text.partition("/")
    if not namespace or not name or "/" in name:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAMESPACE/NAME; write e.g. argocd/gpushare-rendered")
    return namespace, name


def add_cluster_arguments(parser) -> None:
    group = parser.add_argument_group("cluster mode (--kube)")
    group.add_argument("--kubeconfig", type=Path, help="default: in-cluster config, else ~/.kube/config")
    group.add_argument("--argocd-application", action="append", default=[], metavar="NAMESPACE/NAME",
                       type=application_ref,
                       help="the Argo CD Application that syncs the rendered tree (repeatable; "
                            "default argocd/gpushare-rendered, with --cluster argocd/gpushare-<cluster>)")
    group.add_argument("--argocd-kubeconfig", type=Path, metavar="FILE",
                       help="the cluster Argo CD's Applications live in, when it is not this one (a hub that "
                            "deploys to many clusters); default: the same cluster as --kubeconfig")
    group.add_argument("--lease-namespace", default="gpushare-system", help="where the leader-election Lease lives")
    group.add_argument("--identity", help="this replica's holder identity (default: the pod's hostname)")
    group.add_argument("--metrics-port", type=int, default=8080,
                       help="Prometheus /metrics, /healthz and /readyz while polling (0: no server)")
    add_consolidation_arguments(group)


class Election(Protocol):
    """What the reconciler needs of controller.kube.leader.LeaderElection."""

    @property
    def is_leader(self) -> bool: ...

    def try_acquire_or_renew(self) -> bool: ...

    def release(self) -> None: ...


class LeadershipLost(Exception):
    reason = "LeadershipLost"

    def __init__(self) -> None:
        super().__init__("the Lease was not renewed in time during the pass; another replica may lead now, "
                         "so this one stopped writing")
        self.message = str(self)


@dataclass
class PassReport:
    """What one pass did. `leader` False: a standby pass that only tried to take the Lease."""

    leader: bool = False
    published: PublishResult | None = None
    output: PassOutput | None = None
    status_writes: int = 0
    waiting: list[str] = field(default_factory=list)  # cluster spec differs from git: status left for later
    errors: list[tuple[str, str]] = field(default_factory=list)  # (reason, message): the pass failed
    warnings: list[tuple[str, str]] = field(default_factory=list)  # broken or foreign ConfigMaps: reported, not retried

    @property
    def ok(self) -> bool:
        return not self.errors


@dataclass(frozen=True)
class _Last:
    facts: ClusterFacts
    published: PublishResult
    output: PassOutput
    ignored: tuple[tuple[str, str], ...]  # profile ConfigMaps the render left out


class ClusterReconciler:
    """One controller replica: passes against `cluster` and `copy`, guarded by `election`."""

    def __init__(self, cluster: Cluster, copy: WorkingCopy, election: Election, *,
                 applications: Sequence[tuple[str, str] | None] = (),
                 target: Target | str = "direct", metrics: ControllerMetrics | None = None,
                 health: Health | None = None, clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], object] = time.sleep, jitter: Callable[[float, float], float] = random.uniform,
                 renew_every_s: float = RENEW_EVERY_S, backoff_base_s: float = BACKOFF_BASE_S,
                 max_backoff_s: float = MAX_BACKOFF_S, max_prune_share: float | None = None,
                 install: Mapping[str, object] | None = None, review: Callable[[PublishResult], None] | None = None,
                 rightsizing: RightsizingSchedule | None = None, consolidation: ConsolidationSchedule | None = None,
                 layout: Layout = Layout(), argocd: Cluster | None = None):
        self.cluster, self.copy, self.election = cluster, copy, election
        self.layout = layout  # with clusters/: the one cluster this reconciler plans and writes
        self.argocd = argocd or cluster  # where the Applications are read (Argo CD's cluster)
        self.applications = tuple(a for a in applications if a) or default_applications(layout.cluster)
        self.target = parse_target(target)
        self.metrics = metrics or ControllerMetrics()
        self.health = health
        self.clock, self.sleep, self.jitter = clock, sleep, jitter
        self.renew_every_s, self.backoff_base_s, self.max_backoff_s = renew_every_s, backoff_base_s, max_backoff_s
        self.max_prune_share = prune_share_setting() if max_prune_share is None else max_prune_share
        self.install = install  # the install's composition parameters (--worker-image)
        self.review = review  # --write-back pr:NAME: opens or updates the review branch's pull request
        self.rightsizing = rightsizing  # --prometheus: the right-sizing pass, on its own cadence
        self.consolidation = consolidation  # --consolidate-interval: the periodic proposal, for review
        self.resizer = WorkerResizer(cluster)  # each worker pod's host memory request, in place
        self._last: _Last | None = None
        self._devices: dict[str, str] = {}  # slot id -> the GPU UUID its worker reported (profilers beside it)
        self._commits: dict[tuple[str, tuple[str, ...]], str | None] = {}
        self._contains: dict[tuple[str, str, tuple[str, ...]], bool] = {}

    # ------------------------------------------------------------ the loop

    def run(self, interval_s: float = DEFAULT_INTERVAL_S, *, passes: int | None = None,
            stopped: Callable[[], bool] = lambda: False) -> int:
        """Pass after pass (controller.cli.loop) until `stopped()` (or `passes` passes); 0 when the last
        pass succeeded."""
        def one_pass() -> Outcome:
            report = self.reconcile_once()
            if self.health is not None:
                self.health.beat()
            if report.errors:
                log.warning("pass failed (%s)", "; ".join(r for r, _ in report.errors))
            # a standby asks for the Lease again soon
            return Outcome(report.ok, None if report.leader else self.renew_every_s)

        return run_loop(one_pass, interval_s, wait=lambda seconds: self._wait(seconds, stopped), stopped=stopped,
                        passes=passes, jitter=self.jitter, backoff_base_s=self.backoff_base_s,
                        max_backoff_s=self.max_backoff_s,
                        on_retry=lambda seconds: log.warning("retrying in %.1f s", seconds))

    def backoff(self, failures: int) -> float:
        return backoff_s(failures, base_s=self.backoff_base_s, cap_s=self.max_backoff_s, jitter=self.jitter)

    def _wait(self, seconds: float, stopped: Callable[[], bool]) -> None:
        """Sleep `seconds`, renewing the Lease every `renew_every_s` while this replica leads."""
        remaining = seconds
        while remaining > 0 and not stopped():
            step = min(remaining, self.renew_every_s)
            self.sleep(step)
            remaining -= step
            if remaining > 0 and self.election.is_leader:
                self.election.try_acquire_or_renew()

    # ------------------------------------------------------------ one pass

    def reconcile_once(self) -> PassReport:
        started = time.monotonic()
        report = PassReport()
        try:
            report.leader = self.election.try_acquire_or_renew()
            if report.leader:  # right-sizing first: this pass then plans with its records
                self._rightsize()
                self._pass(report)
                self._consolidate()
            elif getattr(self.election, "error", None):  # not a standby: the Lease could not be read at all
                report.errors.append(self.election.error)
        except (ClusterError, GitError, LeadershipLost) as exc:
            report.errors.append((exc.reason, exc.message))
        except ClusterNotFound as exc:  # --cluster names no cluster of the repository (yet): say so, retry later
            report.errors.append((exc.reason, f"{exc.message}; fix: {exc.fix}"))
        except Exception as exc:  # noqa: BLE001 - one pass's bug must not end the loop: report it, back off
            log.error("pass failed unexpectedly", exc_info=True)
            text = str(exc).splitlines()[0][:200] if str(exc) else ""
            report.errors.append(("PassCrashed", f"the pass raised {type(exc).__name__}: {text}"))
            self._last = None  # render again next pass, whatever moved
        for reason, message in report.warnings:
            self.metrics.error(reason)
            log.warning("[%s] %s", reason, message)
        for reason, message in report.errors:
            self.metrics.error(reason)
            log.error("[%s] %s", reason, message)
        self.metrics.leader.set(1 if report.leader else 0)
        result = "standby" if not report.leader else ("ok" if report.ok else "error")
        self.metrics.pass_done(time.monotonic() - started, result, self.clock())
        return report

    def _pass(self, report: PassReport) -> None:
        facts = self._facts(report)
        objects = self.cluster.elastic_models()
        applications = [a for a in (self.argocd.application(ns, name) for ns, name in self.applications) if a]
        report.published, report.output = self._publish(facts, report)
        self._count_modes(report.output)
        self._bill(report.output)
        report.warnings += self.resizer.resize()
        verdicts, broken = self.cluster.verdicts(verdict_sources(report.output.rendered))
        self._devices = {v.slot: v.device_uuid for v in verdicts.values() if v.device_uuid}  # for the next pass
        report.warnings += [(problem.reason, problem.message) for problem in broken]
        views = model_views(report.output)
        revision = report.published.heads.get(report.published.branch) or report.published.upstream
        targets = [(obj, views.get(_key(obj))) for obj in objects]
        live = _LiveReads(self.cluster)  # one read per object per pass, however many models share it
        observed = [self._observe(_key(obj), view, applications, verdicts, revision, live) for obj, view in targets]
        self._renew()
        now = _rfc3339(self.clock())
        for (obj, view), seen in zip(targets, observed):
            self._write_status(obj, view, seen, now, report)

    def _renew(self) -> None:
        if not self.election.try_acquire_or_renew():
            raise LeadershipLost()

    def _rightsize(self) -> None:
        """The right-sizing pass when due (it never raises: a failure is logged, counted and backed off). A long
        usage read or replay must not let the Lease lapse, so a thread renews it every `renew_every_s` while the
        pass runs; the pass pushes only while this replica still leads."""
        if self.rightsizing is None or not self.rightsizing.due():
            return
        done = threading.Event()

        def keep_lease() -> None:
            while not done.wait(self.renew_every_s):
                self.election.try_acquire_or_renew()

        keeper = threading.Thread(target=keep_lease, name="lease-keeper", daemon=True)
        keeper.start()
        pending = self.rightsizing.pending
        try:
            self.rightsizing.run_if_due(self.copy, guard=self._still_leading)
        finally:
            done.set()
            keeper.join()
        if self.rightsizing.pending != pending:  # records awaiting review moved off main: render the status again
            self._last = None

    def _consolidate(self) -> None:
        """The consolidation proposal when due, with this pass's facts, pushed to its review branch only while
        this replica leads (never to the tracked branch; a failure is logged and tried again when next due)."""
        if self.consolidation is not None and self._last is not None and self.consolidation.due():
            self.consolidation.run_if_due(self.copy, self._last.facts, self.install, self._still_leading)

    def _still_leading(self) -> None:
        if not self.election.is_leader:
            raise LeadershipLost()

    def _facts(self, report: PassReport) -> ClusterFacts:
        nodes = self.cluster.nodes()
        slots, node_errors = gpu_slots(nodes)
        slots = tuple(replace(slot, device_uuid=self._devices.get(slot.id)) for slot in slots)
        documents, broken = self.cluster.profile_documents()
        report.warnings += [(problem.reason, problem.message) for problem in broken]  # left out of the pass
        return ClusterFacts(slots=slots, profiles=tuple(documents), errors=tuple(node_errors),
                            pod_monitors=self.cluster.serves("monitoring.coreos.com", "v1", "podmonitors"),
                            node_labels=node_labels(nodes))

    def _publish(self, facts: ClusterFacts, report: PassReport) -> tuple[PublishResult, PassOutput]:
        """Render and push; the Lease is renewed right before each push (after a render, or a change landed again
        without one), so a replica deposed meanwhile never pushes."""
        renders = []

        def render(checkout: Checkout) -> Change:
            warmed()
            with gc_paused():
                tree = read_repo(checkout.root, available_processes(), generated=checkout.generated,
                                 committed=checkout, cluster=self.layout.cluster)
                if self.rightsizing is not None and self.rightsizing.pending:  # records awaiting review: the status
                    tree = replace(tree, models=observed_models(tree.models, self.rightsizing.pending))
                rendered = render_in_cluster(tree, facts, self.max_prune_share, self.install)
            renders.append(rendered)
            return Change(files=rendered.files, message=rendered.message, keep=rendered.keep,
                          reads=rendered.output.reads)

        last = self._last
        previous = last.published if last is not None and last.facts == facts else None
        warmed = in_background(warm_up)  # compiled while git fetches (at once after the first pass)
        try:
            published = publish(self.copy, render, owned=self.layout.cluster_generated, target=self.target,
                                previous=previous, sleep=self.sleep, before_push=self._renew)
        except GitError as exc:
            self.metrics.push_failed(exc.reason)
            raise
        finally:
            warmed()  # never left running into a later pass's forks
        if published.changed:
            self.metrics.commits.inc()
            log.info("committed %s to %s: %s", published.commit[:12], published.branch,
                     published.message.splitlines()[0])
        if self.review is not None:
            try:
                self.review(published)
            except GitError as exc:  # the forge failed: the pass goes on, the next one retries
                report.warnings.append((exc.reason, f"{exc.message}. Fix: {exc.fix}"))
        if renders:
            self._last = _Last(facts, published, renders[-1].output, renders[-1].ignored)
        else:  # no render: nothing moved since `last`
            self._last = replace(last, published=published)
        report.warnings += self._last.ignored
        if renders and renders[-1].hold is not None:
            hold = renders[-1].hold
            report.warnings.append(("PruneHeld", f"{hold.message}; fix: {hold.fix}"))
        return published, self._last.output

    def _bill(self, output: PassOutput) -> None:
        """The fleet's GPUs and their cost per hour, by product and namespace (controller.planning.bill)."""
        now = plan_bill(output.inputs, output.plan.decisions)
        self.metrics.fleet({p.product: p.gpus_used for p in now.products},
                           namespace_costs(output.plan.decisions, output.slots, dict(output.inputs.prices)),
                           {p.name: p.nodes for p in now.pools})

    def _count_modes(self, output: PassOutput) -> None:
        counts = Counter(d.mode for d in output.plan.decisions)
        counts["pending"] = len(output.plan.pending)
        self.metrics.modes(counts)

    # ------------------------------------------------------------ observe and write status

    def _observe(self, key: tuple[str, str], view: ModelView | None, applications: list[dict],
                 verdicts: dict[VerdictKey, WorkerVerdict], revision: str, live: _LiveReads) -> Observed:
        if view is None:
            return Observed()
        commit = self._last_commit(revision, view.paths) if view.paths else None
        application = application_for(view.rendered_paths, applications)
        app = None if application is None else app_state(
            application, lambda synced: commit is not None and self._synced_contains(commit, synced, view.paths))
        workload = job = None
        if view.decision is not None and view.decision.mode != "refused":
            states = [live.workload(o) for o in view.objects("Deployment")]
            states = [s for s in states if s is not None]
            workload = next((s for s in states if not s.available), states[0] if states else None)
        if view.pending is not None:
            jobs = [live.job(o) for o in view.objects("Job")]
            job = next((j for j in jobs if j is not None), None)
        verdict = verdicts.get((*key, view.decision.slot)) if view.decision is not None else None
        return Observed(commit=commit, app=app, workload=workload, job=job, verdict=verdict)

    def _last_commit(self, revision: str, paths: tuple[str, ...]) -> str | None:
        """The newest commit at or before `revision` that touched any of `paths` (cached per revision)."""
        key = (revision, paths)
        if key not in self._commits:
            if len(self._commits) > CACHE_ENTRIES:
                self._commits.clear()
            found = self.copy.git.text("log", "-1", "--format=%H", revision, "--", *paths)
            self._commits[key] = found or None
        return self._commits[key]

    def _synced_contains(self, commit: str, synced: str, paths: tuple[str, ...]) -> bool:
        """Whether the revision Argo CD synced holds what `commit` rendered for a model: it descends from `commit`
        (fetched if unknown), or its `paths` have the same content there (a squash or rebase merge of a review
        branch copies the tree, not the commit)."""
        key = (commit, synced, paths)
        if key not in self._contains:
            if len(self._contains) > CACHE_ENTRIES:
                self._contains.clear()
            try:
                self._contains[key] = self.copy.head_contains(commit, synced) or (
                    bool(paths) and self._content(commit, paths) == self._content(synced, paths))
            except RevisionNotFound as exc:
                log.warning("Argo CD synced %s: %s", synced[:12], exc.message)
                return False
        return self._contains[key]

    def _content(self, revision: str, paths: tuple[str, ...]) -> str:
        """The blob ids of `paths` at `revision` (git ls-tree): equal text means equal content."""
        return self.copy.git.text("ls-tree", "-r", revision, "--", *paths)

    def _write_status(self, obj: dict, view: ModelView | None, observed: Observed, now: str,
                      report: PassReport) -> None:
        namespace, name = _key(obj)
        model = status_model(obj, view)
        if model is None:
            report.waiting.append(f"{namespace}/{name}")
            log.info("ElasticModel %s/%s in the cluster differs from models/ in git; its status waits for "
                     "Argo CD to sync it", namespace, name)
            return
        error = view.error if view is not None else not_in_git(namespace, name, self.copy.branch, self.layout)
        decision = view.decision if view is not None else None
        pending = view.pending if view is not None else None
        previous = (obj.get("status") or {}).get("conditions") or []
        body = status_patch(model, conditions_for(model, decision, pending, error, observed, previous, now), decision,
                            view.url if view is not None else None)
        if not needs_write(obj.get("status"), body["status"]):
            return
        if not self.election.is_leader:
            raise LeadershipLost()
        try:
            self.cluster.patch_status(namespace, name, body)
        except ClusterError as exc:
            if exc.reason != "ObjectGone":
                report.errors.append((exc.reason, exc.message))
            return
        report.status_writes += 1
        self.metrics.status_writes.inc()


class _LiveReads:
    """The live Deployments and Jobs read during one pass, each once."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self._seen: dict[LiveObject, WorkloadState | JobState | None] = {}

    def workload(self, obj: LiveObject) -> WorkloadState | None:
        if obj not in self._seen:
            self._seen[obj] = self.cluster.workload(obj.namespace, obj.name)
        return self._seen[obj]

    def job(self, obj: LiveObject) -> JobState | None:
        if obj not in self._seen:
            self._seen[obj] = self.cluster.profiler_job(obj.namespace, obj.name)
        return self._seen[obj]


def _key(obj: dict) -> tuple[str, str]:
    return obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


def _rfc3339(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---------------------------------------------------------------- the command


def run_cluster(args) -> int:
    """`gpushare reconcile --kube`: one pass with --once, else poll until SIGTERM (then give the Lease up)."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        api_client = kube.api_client(args.kubeconfig)
    except (config.ConfigException, OSError) as exc:
        print(f"gpushare: [KubeconfigUnusable] no usable Kubernetes configuration: {exc}\n"
              "  fix: run in a pod with a ServiceAccount, or pass --kubeconfig FILE", file=sys.stderr)
        return 1
    layout = Layout(args.cluster)
    target = cluster_target(args.write_back, layout)
    try:
        argocd_client = kube.api_client(args.argocd_kubeconfig) if args.argocd_kubeconfig else None
    except (config.ConfigException, OSError) as exc:
        print(f"gpushare: [KubeconfigUnusable] --argocd-kubeconfig {args.argocd_kubeconfig}: {exc}\n"
              "  fix: name a kubeconfig of the cluster Argo CD runs in (a mounted Secret), or leave it out",
              file=sys.stderr)
        api_client.close()
        return 1
    try:
        workdir = args.workdir or default_workdir(args.repo, args.branch, args.cluster)
        copy = controller_copy(args.repo, args.branch, workdir, credentials_from(args), layout)
    except GitError as exc:
        return fail(exc)
    try:
        review, propose = reviewers(args, copy, target, layout)
    except GitError as exc:
        return fail(exc)
    election = LeaderElection(api_client, namespace=args.lease_namespace,
                              identity=args.identity or socket.gethostname())
    interval = args.interval or DEFAULT_INTERVAL_S
    health = Health(stall_after_s=max(600.0, 5 * interval) + MAX_BACKOFF_S)
    stop = threading.Event()
    metrics = ControllerMetrics()
    reconciler = ClusterReconciler(Cluster(api_client), copy, election, applications=args.argocd_application,
                                   target=target, metrics=metrics, health=health, sleep=stop.wait,
                                   max_prune_share=args.max_prune_share, install=install_values(args),
                                   review=review, layout=layout,
                                   argocd=Cluster(argocd_client) if argocd_client is not None else None,
                                   rightsizing=schedule_from(args, metrics, review=propose, cluster=args.cluster),
                                   consolidation=ConsolidationSchedule(args.consolidate_interval,
                                                                       args.consolidate_max_moves, review=propose,
                                                                       layout=layout))
    try:
        if args.once:
            return _once(reconciler)
        return _poll(reconciler, interval, stop, args.metrics_port)
    finally:
        election.release()
        api_client.close()
        if argocd_client is not None:
            argocd_client.close()


def _once(reconciler: ClusterReconciler) -> int:
    report = reconciler.reconcile_once()
    if not report.leader and report.ok:
        holder = getattr(reconciler.election, "holder", None)
        print(f"another replica ({holder or 'unknown'}) holds the leader Lease: nothing written")
        return 0
    if report.published is not None:
        show(OfflineResult(report.published, report.output))
        print(f"status written on {report.status_writes} ElasticModel(s)")
    for reason, message in report.warnings + report.errors:
        print(f"gpushare: [{reason}] {message}", file=sys.stderr)
    return 0 if report.ok else 1


def _poll(reconciler: ClusterReconciler, interval: float, stop: threading.Event, port: int) -> int:
    """Poll until SIGTERM or SIGINT; the metrics server runs meanwhile (unless port is 0)."""
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    server = MetricsServer(reconciler.metrics, reconciler.health, port) if port else None
    try:
        return reconciler.run(interval, stopped=stop.is_set)
    finally:
        if server is not None:
            server.close()
