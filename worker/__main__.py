"""`python -m worker --config worker.yaml [--host 127.0.0.1 --port 8000]`: run one GPU slot's worker.

Loads and validates the config, builds the Worker (admission, verdict publishing
through the kubernetes client when `verdicts.configMap` is set), and serves the
API with uvicorn. A bad config exits 2 with the reason; a refused model does not
stop the worker. SIGTERM (or SIGINT) drains: new requests get 503 ShuttingDown, requests in
flight may finish for most of `--grace-seconds`, then the rest get an error event and the
process exits within the grace period, whatever the executors are doing. A changed config file
is applied in place (worker/watch.py). torch's intra-op threads are set once, before any model loads
(worker/threads.py: --intra-op-threads, server.intraOpThreads, OMP_NUM_THREADS, else the usable CPUs but one).
An authorisation setting of an earlier version in the environment (GPUSHARE_API_KEY) refuses the start (exit 2);
`--authorization none` beyond loopback warns, at start and on /healthz (worker/auth_checks.py).
"""
from __future__ import annotations

import argparse
import logging
import sys

from .auth_checks import CONTRADICTION_REASON, RETIRED_REASON, contradictions, open_api_warnings, retired_settings
from .config import load_config
from .errors import ConfigError


def main(argv: list[str] | None = None) -> int:
    from .scheduler import DEFAULT_STALL_S

    parser = argparse.ArgumentParser(prog="python -m worker", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="worker config YAML (schemas/worker-config.schema.json)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--metrics-port", type=int, default=None,
                        help="also serve /metrics alone on this port (the PodMonitor's; open to Prometheus only)")
    parser.add_argument("--authorization", choices=("kubernetes", "none"), default="none",
                        help="kubernetes: authorise each request for the model's namespace (worker.auth)")
    parser.add_argument("--api-key-secret", metavar="NAME/KEY",
                        help="with --authorization kubernetes: each model namespace's API key, from this Secret")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--grace-seconds", type=float, default=25.0,
                        help="on SIGTERM, exit within this many seconds (keep it below the pod's "
                             "terminationGracePeriodSeconds)")
    parser.add_argument("--stall-seconds", type=float, default=DEFAULT_STALL_S,
                        help="/healthz fails when one step or swap runs this long, or requests wait while no "
                             "step completed for this long plus minResidencyMs")
    parser.add_argument("--watch-seconds", type=float, default=10.0,
                        help="check the config file this often and apply changes in place (0: never)")
    parser.add_argument("--intra-op-threads", type=_positive, default=None, metavar="N",
                        help="torch intra-op threads (default: server.intraOpThreads, else OMP_NUM_THREADS, else "
                             "one per usable CPU but one: the cgroup quota and affinity bound them; docs/worker.md)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    retired = retired_settings()
    if retired:  # an earlier version's authorisation setting, no longer read: never serve as if it were
        for message in retired:
            print(f"error: {RETIRED_REASON}: {message}", file=sys.stderr)
        return 2
    for message in contradictions(args.authorization, args.api_key_secret):  # keys nothing would check
        print(f"error: {CONTRADICTION_REASON}: {message}", file=sys.stderr)
        return 2
    warnings = open_api_warnings(args.authorization, args.host, args.port)
    for warning in warnings:  # printed whatever --log-level says, and served on /healthz
        print(f"warning: {warning['reason']}: {warning['message']}", file=sys.stderr)

    try:
        config = load_config(args.config)
        _set_threads(args.intra_op_threads, config.intra_op_threads)
        worker = _build(config, args.stall_seconds)
    except ConfigError as exc:
        print(f"error: {exc.reason}: {exc.message}", file=sys.stderr)
        return 2

    from .api import create_app
    from .auth import install as install_auth
    from .serve import serve
    from .watch import ConfigWatch

    app = create_app(worker, warnings)
    try:
        install_auth(app, _authorizer(args), lambda: worker.config.models)
    except Exception as exc:  # kubernetes mode without API credentials: never serve open
        print(f"error: AuthorizationUnavailable: --authorization kubernetes needs the pod's ServiceAccount "
              f"(or a kubeconfig) to review requests ({type(exc).__name__}); or run with --authorization none",
              file=sys.stderr)
        return 2
    if args.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port, addr=args.host, registry=worker.metrics.registry)
    worker.start_in_background()  # /healthz answers while the models are fetched, read and loaded
    watch = ConfigWatch(args.config, worker, interval_s=args.watch_seconds)
    if args.watch_seconds > 0:
        watch.start()
    try:
        serve(worker, app, host=args.host, port=args.port, log_level=args.log_level, grace_s=args.grace_seconds)
    finally:
        watch.stop()
        worker.stop(timeout_s=1)
    return 0


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def _set_threads(flag: int | None, configured: int | None) -> None:
    """torch's intra-op threads by worker.threads' rule, before any model loads."""
    import torch

    from .threads import choose_threads

    threads = choose_threads(flag, configured)
    torch.set_num_threads(threads.count)
    logging.getLogger("worker").info("intra-op threads: %d (%s)", threads.count, threads.why)


def _authorizer(args):
    """--authorization kubernetes: requests checked against the API server (worker.auth); none: open."""
    if args.authorization == "none":
        return None
    from .auth import Authorizer, KubernetesReviews, parse_key_secret
    from contract.kube import api_client

    return Authorizer(KubernetesReviews(api_client(), parse_key_secret(args.api_key_secret)))


def _build(config, stall_s: float):
    from .runtime import Worker
    from .verdicts import kubernetes_publisher

    publisher = None
    if config.verdicts is not None:
        try:
            publisher = kubernetes_publisher(config.verdicts.namespace, config.verdicts.name)
        except Exception as exc:  # no in-cluster credentials and no kubeconfig: serve, but say so
            logging.getLogger("worker").warning(
                "verdicts will not be published to ConfigMap %s/%s: no Kubernetes credentials (%s)",
                config.verdicts.namespace, config.verdicts.name, type(exc).__name__)
    return Worker(config, publisher=publisher, stall_s=stall_s)


if __name__ == "__main__":
    sys.exit(main())
