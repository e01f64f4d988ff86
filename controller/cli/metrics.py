"""The controller's Prometheus metrics and its /metrics, /healthz and /readyz endpoints.

Owns `ControllerMetrics` (one registry per controller: pass duration, models per mode,
commits, push failures, status writes, errors by reason, leadership, the last pass,
the right-sizing passes: by result, failures by reason, the last one that read usage, and
the fleet's bill: GPUs kept by product, their use and cost per hour by product and namespace, pool nodes),
`Health` (liveness: the loop made progress lately; readiness: one loop iteration done,
as leader or standby) and `MetricsServer`, a small threaded HTTP server on
`--metrics-port` that serves all three. The cluster loop (controller.cli.cluster_loop) and
its right-sizing schedule (controller.cli.rightsizing_loop) record into them; nothing here
talks to git or the Kubernetes API.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

MODES = ("resident", "swap", "elastic", "refused", "pending")
PASS_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class ControllerMetrics:
    """Every metric of one controller process, in its own registry (tests make as many as they like)."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.pass_duration = Histogram("gpushare_reconcile_pass_duration_seconds",
                                       "Wall time of one reconcile pass, by result (ok, error, standby)",
                                       ["result"], buckets=PASS_BUCKETS, registry=r)
        self.models = Gauge("gpushare_models", "ElasticModels by assigned mode (pending: awaiting a profile)",
                            ["mode"], registry=r)
        self.commits = Counter("gpushare_git_commits", "Commits pushed to the GitOps repository", registry=r)
        self.push_failures = Counter("gpushare_git_push_failures", "Passes whose fetch, commit or push failed",
                                     ["reason"], registry=r)
        self.status_writes = Counter("gpushare_status_writes", "ElasticModel status patches written", registry=r)
        self.errors = Counter("gpushare_reconcile_errors", "Errors met by reconcile passes", ["reason"], registry=r)
        self.leader = Gauge("gpushare_leader", "1 while this replica holds the leader Lease", registry=r)
        self.last_pass = Gauge("gpushare_last_pass_timestamp_seconds", "When the last pass ended (Unix time)",
                               registry=r)
        self.rightsizing_passes = Counter(
            "gpushare_rightsizing_passes", "Right-sizing passes by result: ok, held (usage unavailable: no budget "
            "changed), failed (git, a lost Lease, a crash)", ["result"], registry=r)
        self.rightsizing_failures = Counter(
            "gpushare_rightsizing_failures", "Right-sizing passes held or failed, by reason (UsageUnavailable, "
            "GitUnreachable, PassCrashed, ...)", ["reason"], registry=r)
        self.rightsizing_last_success = Gauge(
            "gpushare_rightsizing_last_success_timestamp_seconds",
            "When the last right-sizing pass that read usage ended (Unix time)", registry=r)
        self.fleet_gpus = Gauge("gpushare_fleet_gpus", "GPUs the last plan keeps (every GPU of a fixed node and of each "
                                "pool node it needs: a node is billed whole), by GPU product", ["product"], registry=r)
        self.fleet_gpus_used = Gauge(
            "gpushare_fleet_gpus_used", "The GPUs the last plan keeps, split by namespace: each GPU by the bytes its "
            "models occupy of its usable memory (a swap group's area by need); __idle__: what no model occupies",
            ["product", "namespace"], registry=r)
        self.fleet_cost = Gauge(
            "gpushare_fleet_cost_per_hour", "What those GPUs cost per hour (gpus.yaml pricePerGpuHour), split as "
            "gpushare_fleet_gpus_used; 0 for a product without a price", ["product", "namespace"], registry=r)
        self.pool_nodes = Gauge("gpushare_pool_nodes", "Nodes of each gpus.yaml pool the last plan needs (its "
                                "minNodes included)", ["pool"], registry=r)

    def pass_done(self, duration_s: float, result: str, ended_at: float) -> None:
        self.pass_duration.labels(result).observe(duration_s)
        self.last_pass.set(ended_at)

    def rightsizing_done(self, result: str, reason: str | None = None, ended_at: float | None = None) -> None:
        self.rightsizing_passes.labels(result).inc()
        if reason is not None:
            self.rightsizing_failures.labels(reason).inc()
        if ended_at is not None:
            self.rightsizing_last_success.set(ended_at)

    def modes(self, counts: Mapping[str, int]) -> None:
        for mode in MODES:
            self.models.labels(mode).set(counts.get(mode, 0))

    def fleet(self, gpus: Mapping[str, int], shares: Mapping[tuple[str, str], tuple[float, float]],
              pools: Mapping[str, int]) -> None:
        """The last plan's bill: GPUs kept per product, (GPUs, cost per hour) per (product, namespace), nodes per
        pool; series of products, namespaces and pools the plan no longer has are dropped."""
        for gauge in (self.fleet_gpus, self.fleet_gpus_used, self.fleet_cost, self.pool_nodes):
            gauge.clear()
        for product, count in gpus.items():
            self.fleet_gpus.labels(product).set(count)
        for (product, namespace), (share, cost) in shares.items():
            self.fleet_gpus_used.labels(product, namespace).set(share)
            self.fleet_cost.labels(product, namespace).set(cost)
        for pool, nodes in pools.items():
            self.pool_nodes.labels(pool).set(nodes)

    def error(self, reason: str) -> None:
        self.errors.labels(reason).inc()

    def push_failed(self, reason: str) -> None:
        self.push_failures.labels(reason).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class Health:
    """Liveness and readiness of the loop, fed by `beat()` once per loop iteration."""

    def __init__(self, stall_after_s: float, clock: Callable[[], float] = time.monotonic):
        self.stall_after_s = stall_after_s
        self.clock = clock
        self._started = clock()
        self._last_beat: float | None = None

    def beat(self) -> None:
        self._last_beat = self.clock()

    def live(self) -> tuple[bool, str]:
        since = self.clock() - (self._last_beat if self._last_beat is not None else self._started)
        if since > self.stall_after_s:
            return False, f"no loop iteration for {since:.0f} s (limit {self.stall_after_s:.0f} s): the loop is stuck"
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        if self._last_beat is None:
            return False, "the first reconcile pass has not finished yet"
        return True, "ok"


class MetricsServer:
    """/metrics, /healthz and /readyz on 0.0.0.0:`port` (0: any free port, see `.port`), in a daemon thread."""

    def __init__(self, metrics: ControllerMetrics, health: Health, port: int, host: str = "0.0.0.0"):
        routes: dict[str, Callable[[], tuple[int, str, bytes]]] = {
            "/metrics": lambda: (200, CONTENT_TYPE_LATEST, metrics.exposition()),
            "/healthz": lambda: _probe(health.live()),
            "/readyz": lambda: _probe(health.ready()),
        }

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server API
                route = routes.get(self.path.split("?", 1)[0])
                code, content_type, body = route() if route else (404, "text/plain", b"not found\n")
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:  # probes every few seconds: keep them out of the log
                pass

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def _probe(result: tuple[bool, str]) -> tuple[int, str, bytes]:
    ok, message = result
    return (200 if ok else 503), "text/plain; charset=utf-8", (message + "\n").encode()
