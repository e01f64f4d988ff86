"""Serving the API with uvicorn, and the graceful stop on SIGTERM within a grace period.

The first exit signal drains the worker on a side thread: new requests get 503
ShuttingDown, requests in flight get 40 % of the grace period to finish, then the
executors stop and every request left gets an error event, so the connections uvicorn
waits for close in time: uvicorn's own graceful timeout is 95 % of the grace period, which leaves
the event loop time to send what is queued for slow clients before the error.
Executor threads are daemons: one stuck in a step cannot hold the process. Called by
`python -m worker`.
"""
from __future__ import annotations

import logging
import threading

import uvicorn

from .api import create_app
from .runtime import Worker

log = logging.getLogger(__name__)
DRAIN_SHARE = 0.4  # of the grace period, for requests in flight to finish


class DrainingServer(uvicorn.Server):
    def __init__(self, worker: Worker, grace_s: float, config: uvicorn.Config):
        super().__init__(config)
        self.worker, self.grace_s = worker, grace_s
        self._draining: threading.Thread | None = None

    def handle_exit(self, sig, frame) -> None:
        if self._draining is None:
            self._draining = threading.Thread(target=self._drain, name="drain", daemon=True)
            self._draining.start()
        super().handle_exit(sig, frame)

    def _drain(self) -> None:
        if not self.worker.drain(timeout_s=DRAIN_SHARE * self.grace_s):
            log.warning("requests still running after %.1fs of the grace period end with an error",
                        DRAIN_SHARE * self.grace_s)
        self.worker.stop(timeout_s=0.1 * self.grace_s)


def serve(worker: Worker, *, host: str, port: int, log_level: str, grace_s: float) -> None:
    config = uvicorn.Config(create_app(worker), host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=0.95 * grace_s)
    DrainingServer(worker, grace_s, config).run()
