"""Right-sizing inside the installed controller: the leader's right-sizing pass, on its own cadence.

Owns `RightsizingSchedule`. Both reconcile loops (`reconcile --offline --interval` in
controller.cli.reconcile_cmd, `reconcile --kube` in controller.cli.cluster_loop; in cluster
mode only the Lease holder) call `run_if_due` right before a reconcile pass, in the same
thread and on the same working copy, so the two passes never race for a push and the
reconcile pass that follows a right-sizing commit plans with its records (Auto's effective
budgets, the conditions, PLAN.md's open recommendations). A due pass runs
controller.rightsizing.apply.rightsize_once over the last `window` of usage read from
Prometheus; it is due again `interval` later (±10 % jitter). A pass that fails (git, a lost
Lease) or crashes is logged, counted and retried after controller.cli.loop's backoff; it
never ends the reconcile loop. With `--write-back pr:NAME` each Recommend branch gets its pull
request too (controller.cli.review.open_proposal). Usage that cannot be read commits the hold (UsageMissing),
changes no budget and is logged once per outage. `schedule_from(args)` builds it from
--prometheus and the --rightsize-* flags: no URL, no right-sizing (logged once, with why).
"""
from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

from controller.cli.loop import BACKOFF_BASE_S, MAX_BACKOFF_S, backoff_s
from controller.cli.metrics import ControllerMetrics
from controller.rightsizing.apply import PassResult, ReadUsage, rightsize_once
from controller.inputs.layout import Layout
from controller.inputs.rightsizing_records import RECORDS_BRANCH
from controller.policy import DEFAULT_WINDOW_S
from controller.rightsizing.prometheus import DETAIL_S, READ_DEADLINE_S, read_usage
from controller.rightsizing.window import WindowError, slot_for
from gitops import GitError, PublishResult, Target, WorkingCopy, parse_target

log = logging.getLogger("gpushare.rightsizing")
ReviewProposal = Callable[[bool, PublishResult], None]
"""Hears each Recommend proposal the pass published (new or carried): opens or updates its pull request."""

DEFAULT_INTERVAL_S = 300        # a pass every 5 minutes: 20 scrapes, well inside upsizeAfter's default
DEFAULT_STEP_S = 60             # the sample grid (the detail a pass reads, breaches judged on it); peaks survive
                                # it: gauges are read as max_over_time over the step


class RightsizingSchedule:
    """When the next right-sizing pass is due, and running it without letting it end the caller's loop."""

    def __init__(self, read: ReadUsage, *, interval_s: float = DEFAULT_INTERVAL_S,
                 window_s: float = DEFAULT_WINDOW_S, metrics: ControllerMetrics | None = None,
                 clock: Callable[[], float] = time.time, jitter: Callable[[float, float], float] = random.uniform,
                 backoff_base_s: float = BACKOFF_BASE_S, max_backoff_s: float = MAX_BACKOFF_S,
                 review: ReviewProposal | None = None, records_target: str | Target = "direct",
                 cluster: str | None = None):
        self.read, self.interval_s, self.window_s = read, interval_s, window_s
        self.review = review  # --write-back pr:NAME: each Recommend branch's pull request, and the records'
        self.records_target = records_target  # --write-back branch: or pr: the records' own review branch
        self.cluster = cluster  # with clusters/: the cluster whose usage, models and records this loop owns
        self.pending: dict = {}  # review mode: the records of the last pass, awaiting review (for the status)
        self.metrics = metrics or ControllerMetrics()
        self.clock, self.jitter = clock, jitter
        self.backoff_base_s, self.max_backoff_s = backoff_base_s, max_backoff_s
        self.next_at: float | None = None  # None: due now (the first loop iteration)
        self.failures = 0
        self.holding = False  # usage was unavailable on the last pass

    def due(self) -> bool:
        return self.next_at is None or self.clock() >= self.next_at

    def run_if_due(self, copy: WorkingCopy, guard: Callable[[], None] = lambda: None) -> PassResult | None:
        """One right-sizing pass when due; its result, or None (not due, or failed: logged and counted)."""
        if not self.due():
            return None
        now = self.clock()
        try:
            result = rightsize_once(copy, self.read, now, self.window_s, guard=guard,
                                    records_target=self.records_target, cluster=self.cluster)
        except Exception as exc:  # noqa: BLE001 - the reconcile loop must outlive any right-sizing pass
            self._failed(exc, now)
            return None
        self.failures = 0
        self.next_at = now + self.interval_s * self.jitter(0.9, 1.1)
        if parse_target(self.records_target).review is not None:
            self.pending = dict(result.step.records)
        for published in (*result.proposals, result.records):
            if published.changed:
                log.info("right-sizing committed %s to %s: %s", published.commit[:12], published.branch,
                         published.message.splitlines()[0])
        self._review(result)
        if result.usage_error:
            self.metrics.rightsizing_done("held", "UsageUnavailable")
            if not self.holding:
                log.warning("right-sizing holds: usage unavailable, no budget changed (each model's UsageAvailable "
                            "is False until it is back): %s", result.usage_error)
            self.holding = True
        else:
            self.metrics.rightsizing_done("ok", ended_at=self.clock())
            if self.holding:
                log.info("right-sizing reads usage again")
            self.holding = False
        return result

    def _review(self, result: PassResult) -> None:
        """Open or update each proposal's pull request; a forge that refuses is logged and counted, and the
        branch stays pushed (the next pass tries again)."""
        if self.review is None:
            return
        reviews = [(p.new, published) for p, published in zip(result.step.proposals, result.proposals)]
        if parse_target(self.records_target).review is not None:
            reviews.append((True, result.records))  # the records' branch: its request opened or updated
        for new, published in reviews:
            try:
                self.review(new, published)
            except GitError as exc:
                log.error("right-sizing pull request for %s: [%s] %s Fix: %s", published.branch, exc.reason,
                          exc.message, exc.fix)
                self.metrics.error(exc.reason)

    def _failed(self, exc: Exception, now: float) -> None:
        self.failures += 1
        wait = backoff_s(self.failures, base_s=self.backoff_base_s, cap_s=self.max_backoff_s, jitter=self.jitter)
        self.next_at = now + wait
        reason = getattr(exc, "reason", None)
        if isinstance(reason, str):  # a typed error (git, a lost Lease): its own words
            message = getattr(exc, "message", str(exc))
            fix = getattr(exc, "fix", None)
            log.error("right-sizing pass failed: [%s] %s%s; retrying in %.0f s", reason, message,
                      f" Fix: {fix}" if fix else "", wait)
        else:
            reason = "PassCrashed"
            log.error("right-sizing pass crashed (%s); the reconcile loop goes on, retrying in %.0f s",
                      type(exc).__name__, wait, exc_info=True)
        self.metrics.rightsizing_done("failed", reason)


def add_arguments(parser) -> None:
    from contract.durations import duration_flag as duration

    group = parser.add_argument_group("right-sizing (docs/guide.md, Right-sizing)")
    group.add_argument("--prometheus", metavar="URL", default="",
                       help="Prometheus' base URL: the leader runs the right-sizing loop between reconcile passes "
                            "(empty, the default: right-sizing off). The install sets it from PROMETHEUS_URL")
    group.add_argument("--rightsize-interval", type=duration, default=DEFAULT_INTERVAL_S, metavar="DURATION",
                       help="one right-sizing pass every DURATION (default: 5m)")
    group.add_argument("--rightsize-window", type=duration, default=DEFAULT_WINDOW_S, metavar="DURATION",
                       help="the usage each right-sizing pass replays (default: 2d)")
    group.add_argument("--rightsize-step", type=duration, default=DEFAULT_STEP_S, metavar="DURATION",
                       help="the usage sample grid, a multiple of the scrape interval (default: 60s)")


class RightsizingFlagInvalid(ValueError):
    """A --prometheus or --rightsize-* flag the loop cannot run with; `reason` names which."""

    reason = "RightsizingFlagInvalid"


class PrometheusUrlInvalid(RightsizingFlagInvalid):
    reason = "PrometheusUrlInvalid"


class WindowInvalid(RightsizingFlagInvalid):
    reason = "WindowInvalid"


def prometheus_url(args) -> str:
    """--prometheus, checked: an http(s) URL, or "" (right-sizing off); PrometheusUrlInvalid otherwise. With a URL,
    --rightsize-window and --rightsize-step must be a window the loop can keep (WindowInvalid otherwise)."""
    url = (args.prometheus or "").strip()
    if url and not url.startswith(("http://", "https://")):
        raise PrometheusUrlInvalid(f"--prometheus {url!r} is not an http(s) URL; write e.g. "
                                   "http://prometheus-operated.monitoring:9090, or leave it empty to turn "
                                   "right-sizing off")
    if url:
        try:
            slot_for(args.rightsize_window, args.rightsize_step)
        except WindowError as exc:
            raise WindowInvalid(f"--rightsize-window {args.rightsize_window:g}s with --rightsize-step "
                                f"{args.rightsize_step:g}s: {exc}") from None
    return url


def schedule_from(args, metrics: ControllerMetrics | None = None, *, clock: Callable[[], float] = time.time,
                  review: ReviewProposal | None = None, cluster: str | None = None) -> RightsizingSchedule | None:
    """The schedule the flags ask for; None (logged once, with why) when --prometheus is empty. With
    `--write-back branch:` or `pr:` the records go to RECORDS_BRANCH for review, like everything else (with
    clusters/, `cluster`'s own: RECORDS_BRANCH/<cluster>)."""
    url = prometheus_url(args)
    if not url:
        log.info("right-sizing is off: no Prometheus URL (--prometheus; PROMETHEUS_URL in the gpushare-controller "
                 "ConfigMap). Models with spec.rightsizing keep their budgets and show UsageAvailable=Unknown")
        return None
    step = args.rightsize_step
    log.info("right-sizing on: a pass every %.0f s over %.0f s of usage from %s", args.rightsize_interval,
             args.rightsize_window, url)
    deadline = min(READ_DEADLINE_S, args.rightsize_interval)  # a slow Prometheus costs one interval at most
    detail = args.rightsize_interval + DETAIL_S  # the scrape grid since the last pass, and a margin
    return RightsizingSchedule(lambda start, end, fleet: read_usage(url, start, end, step, fleet=fleet,
                                                                    deadline_s=deadline, detail_s=detail),
                               interval_s=args.rightsize_interval, window_s=args.rightsize_window,
                               metrics=metrics, clock=clock, review=review, cluster=cluster,
                               records_target=(f"branch:{Layout(cluster).branch(RECORDS_BRANCH)}"
                                               if parse_target(args.write_back).review else "direct"))
