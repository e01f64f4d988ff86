"""Publishing the worker's verdicts into its ConfigMap, in the background.

Owns the publisher that writes the verdicts document (contract.verdicts, the one
writer) into a ConfigMap with the shared Kubernetes client (contract.kube), and a
background `PublishLoop` so an unreachable API server never stops serving.
Admission creates verdicts; the runtime submits each new document here.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable, Protocol

from contract import kube
from contract.wire import MANAGED_BY_LABEL, SLOT_LABEL, VERDICTS_DATA_KEY, VERDICTS_LABEL

log = logging.getLogger(__name__)

class Publisher(Protocol):
    def publish(self, slot: str, document: str) -> None: ...


class ConfigMapPublisher:
    """Writes the verdict document into one ConfigMap: merge-patch, or create when it is missing."""

    def __init__(self, core_v1_api, namespace: str, name: str, *, timeout_s: float = 10.0):
        self.api = core_v1_api
        self.namespace = namespace
        self.name = name
        self.timeout_s = timeout_s

    def publish(self, slot: str, document: str) -> None:
        body = {
            "metadata": {"name": self.name, "namespace": self.namespace,
                         "labels": {VERDICTS_LABEL: "true", MANAGED_BY_LABEL: "gpushare-worker"},
                         "annotations": {SLOT_LABEL: slot}},
            "data": {VERDICTS_DATA_KEY: document},
        }
        kube.write_configmap(self.api, body, timeout_s=self.timeout_s)


def kubernetes_publisher(namespace: str, name: str) -> ConfigMapPublisher:
    """A publisher with in-cluster credentials (the worker's ServiceAccount), else the local kubeconfig."""
    return ConfigMapPublisher(kube.core_v1(), namespace, name)


class PublishLoop:
    """Publishes the latest document in a daemon thread, retrying with capped exponential backoff.

    `submit` never blocks; a newer document replaces one not yet published.
    """

    def __init__(self, publisher: Publisher, slot: str, *, first_backoff_s: float = 1.0,
                 max_backoff_s: float = 60.0, on_result: Callable[[bool], None] | None = None):
        self.publisher = publisher
        self.slot = slot
        self.first_backoff_s = first_backoff_s
        self.max_backoff_s = max_backoff_s
        self.on_result = on_result or (lambda ok: None)
        self._pending: str | None = None
        self._wake = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="verdict-publisher", daemon=True)
        self._thread.start()

    def submit(self, document: str) -> None:
        with self._wake:
            self._pending = document
            self._wake.notify()

    def stop(self) -> None:
        with self._wake:
            self._stopped = True
            self._wake.notify()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        backoff = self.first_backoff_s
        while True:
            with self._wake:
                while self._pending is None and not self._stopped:
                    self._wake.wait()
                if self._stopped:
                    return
                document, self._pending = self._pending, None
            try:
                self.publisher.publish(self.slot, document)
            except Exception as exc:  # any API or network failure: keep serving, retry later
                log.warning("publishing verdicts failed (%s: %s); retrying in %.0fs",
                            type(exc).__name__, exc, backoff)
                self.on_result(False)
                with self._wake:
                    if self._pending is None:
                        self._pending = document
                    self._wake.wait(timeout=backoff)
                backoff = min(self.max_backoff_s, backoff * 2)
                continue
            self.on_result(True)
            backoff = self.first_backoff_s
