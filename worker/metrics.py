"""Prometheus metrics of one worker, on its own registry (served at /metrics).

Owns metric names and labels. Updated by the scheduler (requests, tokens, TTFT,
TPOT, swaps, queue depth), residency (streamed bytes), and the runtime (device
bytes per model and mode, verdicts).
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter("gpushare_worker_requests", "Finished requests by outcome (ok, error, cancelled).",
                                ["model", "outcome"], registry=r)
        self.rejected = Counter("gpushare_worker_rejected_requests",
                                "Requests answered with an error before queueing, by HTTP status and reason.",
                                ["model", "status", "reason"], registry=r)
        self.tokens = Counter("gpushare_worker_tokens", "Tokens processed, by kind (prompt, completion).",
                              ["model", "kind"], registry=r)
        self.ttft_seconds = Histogram("gpushare_worker_ttft_seconds", "Time from request to its first token.",
                                      ["model"], buckets=_LATENCY_BUCKETS, registry=r)
        self.tpot_seconds = Histogram("gpushare_worker_tpot_seconds", "Time between consecutive output tokens.",
                                      ["model"], buckets=_LATENCY_BUCKETS, registry=r)
        self.swaps = Counter("gpushare_worker_swaps", "Swap-ins of a swap-group model.", ["model"], registry=r)
        self.swap_in_seconds = Histogram("gpushare_worker_swap_in_seconds",
                                         "Time to bring a swap model onto the device.", ["model"],
                                         buckets=_LATENCY_BUCKETS, registry=r)
        self.streamed_bytes = Counter("gpushare_worker_streamed_bytes", "Elastic layer bytes copied host to device.",
                                      ["model"], registry=r)
        self.device_bytes = Gauge("gpushare_worker_device_bytes",
                                  "Device bytes a model holds now (placed tensors plus KV/activation reservations).",
                                  ["model", "mode"], registry=r)
        self.queue_depth = Gauge("gpushare_worker_queue_depth", "Requests queued for a model, not yet running.",
                                 ["model"], registry=r)
        self.verdict = Gauge("gpushare_worker_verdict", "1 for the model's current verdict (applied or refused).",
                             ["model", "namespace", "mode", "verdict", "reason"], registry=r)
