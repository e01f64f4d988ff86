"""Leader election on a coordination.k8s.io/v1 Lease, so two controller replicas never both write.

Owns `LeaderElection`: one `try_acquire_or_renew()` per reconcile pass, `release()` on
shutdown. It follows client-go's leaderelection: the holder renews `renewTime`; a
candidate takes the Lease over only after the record stayed unchanged for
`leaseDurationSeconds` *as measured by its own clock* (no trust in other machines'
clocks); every write replaces the Lease with the resourceVersion it read, so of two
candidates racing, the API server lets one win and answers 409 to the other. A leader
that cannot renew keeps the role only until `renew_deadline_s` after its last
successful renewal, shorter than the lease, so it stops writing before anyone may
take over. The clock is injected (tests drive time). Called by the cluster loop.
"""
from __future__ import annotations

import datetime
import logging
import time
from typing import Callable

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)


def _micro_time(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElection:
    def __init__(self, api_client: client.ApiClient, *, namespace: str, identity: str,
                 name: str = "gpushare-controller", lease_duration_s: int = 15, renew_deadline_s: float = 10.0,
                 clock: Callable[[], float] = time.time, request_timeout_s: float = 10.0):
        if not 0 < renew_deadline_s < lease_duration_s:
            raise ValueError(f"renew_deadline_s ({renew_deadline_s}) must be above 0 and below "
                             f"lease_duration_s ({lease_duration_s}), or two leaders could overlap")
        self.api = client.CoordinationV1Api(api_client)
        self.namespace, self.name, self.identity = namespace, name, identity
        self.lease_duration_s, self.renew_deadline_s = lease_duration_s, renew_deadline_s
        self.clock = clock
        self.timeout = request_timeout_s
        self._plain = api_client.sanitize_for_serialization
        self._observed_version: str | None = None
        self._observed_at = 0.0
        self._renewed_at: float | None = None

    @property
    def is_leader(self) -> bool:
        return self._renewed_at is not None and self.clock() - self._renewed_at < self.renew_deadline_s

    def try_acquire_or_renew(self) -> bool:
        """One attempt; True while this identity holds the Lease."""
        now = self.clock()
        try:
            lease = self._read()
            if lease is None:
                self._write(self._create, self._record(now, None))
            else:
                if not self._may_take(lease, now):
                    self._renewed_at = None
                    return False
                self._write(self._replace, self._record(now, lease))
        except ApiException as exc:
            if exc.status == 409:  # another candidate wrote first: it is the leader for now
                log.info("lease %s/%s: lost a race to another candidate", self.namespace, self.name)
                self._renewed_at = None
                return False
            log.warning("lease %s/%s: API error HTTP %s; leader until the renew deadline",
                        self.namespace, self.name, exc.status)
            return self.is_leader
        except urllib3.exceptions.HTTPError as exc:
            log.warning("lease %s/%s: API unreachable (%s); leader until the renew deadline",
                        self.namespace, self.name, type(exc).__name__)
            return self.is_leader
        self._renewed_at = now
        return True

    def release(self) -> None:
        """Give the Lease up at shutdown so a successor need not wait for it to expire. Best effort."""
        if not self.is_leader:
            return
        self._renewed_at = None
        try:
            lease = self._read()
            if lease is None or lease["spec"].get("holderIdentity") != self.identity:
                return
            lease["spec"].update(holderIdentity=None, leaseDurationSeconds=1, renewTime=_micro_time(self.clock()))
            self._replace(lease)
        except (ApiException, urllib3.exceptions.HTTPError) as exc:
            log.warning("lease %s/%s: release failed (%s); it expires by itself",
                        self.namespace, self.name, type(exc).__name__)

    def _may_take(self, lease: dict, now: float) -> bool:
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        version = lease["metadata"]["resourceVersion"]
        if version != self._observed_version:
            self._observed_version, self._observed_at = version, now
        if not holder or holder == self.identity:
            return True
        duration = spec.get("leaseDurationSeconds") or self.lease_duration_s
        return now - self._observed_at >= duration

    def _record(self, now: float, lease: dict | None) -> dict:
        body = lease or {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                         "metadata": {"name": self.name, "namespace": self.namespace}, "spec": {}}
        spec = body.setdefault("spec", {})
        if spec.get("holderIdentity") != self.identity:
            if spec.get("holderIdentity"):
                spec["leaseTransitions"] = spec.get("leaseTransitions", 0) + 1
            spec["acquireTime"] = _micro_time(now)
            spec.setdefault("leaseTransitions", 0)
        spec.update(holderIdentity=self.identity, leaseDurationSeconds=self.lease_duration_s,
                    renewTime=_micro_time(now))
        return body

    def _read(self) -> dict | None:
        try:
            return self._plain(self.api.read_namespaced_lease(self.name, self.namespace, _request_timeout=self.timeout))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _write(self, call, body: dict) -> None:
        stored = self._plain(call(body))
        self._observed_version, self._observed_at = stored["metadata"]["resourceVersion"], self.clock()

    def _create(self, body: dict):
        return self.api.create_namespaced_lease(self.namespace, body, _request_timeout=self.timeout)

    def _replace(self, body: dict):
        return self.api.replace_namespaced_lease(self.name, self.namespace, body, _request_timeout=self.timeout)
