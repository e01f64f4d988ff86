"""Verdicts: what the worker applied or refused, per model, and their publication.

Owns the Verdict shape, its YAML document (the ConfigMap data key `verdicts.yaml`
that the controller reads) and the publisher that writes it with the official
kubernetes client. Admission creates verdicts; the runtime publishes them through
a background `PublishLoop` so an unreachable API server never stops serving.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import asdict, dataclass
from typing import Callable, Literal, Protocol

import yaml

log = logging.getLogger(__name__)

DATA_KEY = "verdicts.yaml"
LABEL = "gpushare.dev/verdicts"
SLOT_ANNOTATION = "gpushare.dev/slot"


@dataclass(frozen=True)
class Verdict:
    name: str
    namespace: str
    mode: str
    verdict: Literal["applied", "refused"]
    reason: str
    message: str
    need_bytes: int
    available_bytes: int
    missing_bytes: int
    resident_layers: int | None = None

    def as_dict(self) -> dict:
        """camelCase keys, as the controller reads them; residentLayers only for elastic."""
        data = asdict(self)
        out = {"name": data["name"], "namespace": data["namespace"], "mode": data["mode"],
               "verdict": data["verdict"], "reason": data["reason"], "message": data["message"],
               "needBytes": data["need_bytes"], "availableBytes": data["available_bytes"],
               "missingBytes": data["missing_bytes"]}
        if self.mode == "elastic" and self.resident_layers is not None:
            out["residentLayers"] = self.resident_layers
        return out


def refused(name: str, namespace: str, mode: str, reason: str, message: str) -> Verdict:
    """A refusal that has no byte arithmetic (unreadable model, failed load)."""
    return Verdict(name=name, namespace=namespace, mode=mode, verdict="refused", reason=reason,
                   message=message, need_bytes=0, available_bytes=0, missing_bytes=0)


def render_document(slot: str, verdicts: list[Verdict]) -> str:
    """The YAML stored under DATA_KEY: the slot and one entry per configured model, in config order."""
    return yaml.safe_dump({"apiVersion": "gpushare.dev/v1alpha1", "kind": "WorkerVerdicts", "slot": slot,
                           "models": [v.as_dict() for v in verdicts]}, sort_keys=False)


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
        from kubernetes.client.exceptions import ApiException

        body = {
            "metadata": {"name": self.name, "namespace": self.namespace,
                         "labels": {LABEL: "true", "app.kubernetes.io/managed-by": "gpushare-worker"},
                         "annotations": {SLOT_ANNOTATION: slot}},
            "data": {DATA_KEY: document},
        }
        try:
            self.api.patch_namespaced_config_map(self.name, self.namespace, body,
                                                 _content_type="application/merge-patch+json",
                                                 _request_timeout=self.timeout_s)
        except ApiException as exc:
            if exc.status != 404:
                raise
            self.api.create_namespaced_config_map(self.namespace, body, _request_timeout=self.timeout_s)


def kubernetes_publisher(namespace: str, name: str) -> ConfigMapPublisher:
    """A publisher with in-cluster credentials (the worker's ServiceAccount), else the local kubeconfig."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return ConfigMapPublisher(client.CoreV1Api(), namespace, name)


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
