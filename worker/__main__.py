"""`python -m worker --config worker.yaml [--host 127.0.0.1 --port 8000]`: run one GPU slot's worker.

Loads and validates the config, builds the Worker (admission, verdict publishing
through the kubernetes client when `verdicts.configMap` is set), and serves the
API with uvicorn. A bad config exits 2 with the reason; a refused model does not
stop the worker. On SIGTERM uvicorn stops accepting connections, gives running
requests most of `--grace-seconds` to finish, cancels the rest, and the worker
stops its executor before the process exits.
"""
from __future__ import annotations

import argparse
import logging
import sys

from .config import load_config
from .errors import ConfigError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="worker config YAML (schemas/worker-config.schema.json)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--grace-seconds", type=float, default=25.0,
                        help="on SIGTERM, exit within this many seconds (keep it below the pod's "
                             "terminationGracePeriodSeconds)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    try:
        config = load_config(args.config)
        worker = _build(config)
    except ConfigError as exc:
        print(f"error: {exc.reason}: {exc.message}", file=sys.stderr)
        return 2

    import uvicorn

    from .api import create_app
    from .auth import api_key_from_env, require_api_key

    app = create_app(worker)
    require_api_key(app, api_key_from_env())  # GPUSHARE_API_KEY: the composition's apiKeySecret
    worker.start()
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level,
                    timeout_graceful_shutdown=0.9 * args.grace_seconds)
    finally:
        worker.stop()
    return 0


def _build(config):
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
    return Worker(config, publisher=publisher)


if __name__ == "__main__":
    sys.exit(main())
