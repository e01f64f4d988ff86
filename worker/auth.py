"""Who may reach which model: each request authorised for the served model's namespace.

Owns the worker's tenancy rule (composition parameter `authorization`, `python -m worker --authorization`):
- `none`: the API is open to whoever the NetworkPolicy admits;
- `kubernetes`: a caller sends `Authorization: Bearer CREDENTIAL`, either a Kubernetes ServiceAccount token
  (TokenReview, then a SubjectAccessReview of `get` on the model's ElasticModel in its namespace, as
  kube-rbac-proxy does) or the API key of the model's own namespace (the Secret `--api-key-secret NAME/KEY` in
  that namespace, compared in constant time). The answers are cached for CACHE_S per credential (a revoked
  token keeps working that long at most); the credential itself is never logged or kept, only its digest.

`Access` is the per-request view: `allows(namespace, name)`. The API (worker.api) asks it before a model is
listed, looked up, generated with, or reported in /status or /readyz/NAME; a model the caller may not get is
answered exactly as an unknown one (404), so nothing of another tenant is revealed. /healthz and /readyz stay
open for the kubelet and answer no model names to a caller without access; /metrics on the API port needs access
to every served model (Prometheus scrapes the metrics port, which the NetworkPolicy opens to it alone).
The Kubernetes calls are behind `Reviews` (an adapter, the official client in production, the API double in
tests). Installed by `python -m worker` on the app worker.api.create_app builds.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

log = logging.getLogger(__name__)
MODES = ("kubernetes", "none")
CACHE_S = 60.0
GROUP, RESOURCE = "gpushare.dev", "elasticmodels"


class Reviews(Protocol):
    """The three Kubernetes questions the worker asks (each raises on an API failure)."""

    def token_review(self, token: str) -> tuple[str, tuple[str, ...]] | None:
        """(username, groups) of an authenticated token; None when the API server does not authenticate it."""

    def access_review(self, user: str, groups: tuple[str, ...], namespace: str, name: str) -> bool:
        """Whether that user may `get` the ElasticModel namespace/name."""

    def api_key(self, namespace: str) -> str | None:
        """The API key of `namespace` (its Secret), or None when it has none."""


@dataclass(frozen=True)
class Access:
    """What one request's credential may reach: `everything` (authorization none), else per model."""

    check: Callable[[str, str], bool] | None = None  # None: everything
    authenticated: bool = True

    def allows(self, namespace: str, name: str) -> bool:
        return self.check is None or self.check(namespace, name)

    def allows_all(self, models: Iterable[tuple[str, str]]) -> bool:
        return all(self.allows(namespace, name) for namespace, name in models)


EVERYTHING = Access()
NOTHING = Access(check=lambda namespace, name: False, authenticated=False)


@dataclass
class Authorizer:
    """The `kubernetes` mode: credentials checked against `reviews`, each answer cached for `ttl_s`."""

    reviews: Reviews
    ttl_s: float = CACHE_S
    clock: Callable[[], float] = time.monotonic
    _cache: dict[tuple, tuple[float, object]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def access(self, header: str | None) -> Access:
        """The request's access from its Authorization header (a missing or malformed one: nothing)."""
        scheme, _, credential = (header or "").partition(" ")
        credential = credential.strip()
        if scheme.lower() != "bearer" or not credential:
            return NOTHING
        digest = hashlib.sha256(credential.encode()).hexdigest()
        return Access(check=lambda namespace, name: self._allows(credential, digest, namespace, name))

    def _allows(self, credential: str, digest: str, namespace: str, name: str) -> bool:
        key = self._cached(("key", namespace), lambda: self.reviews.api_key(namespace))
        if key is not None and hmac.compare_digest(credential.encode(), str(key).encode()):
            return True
        user = self._cached(("token", digest), lambda: self.reviews.token_review(credential))
        if user is None:
            return False
        return bool(self._cached(("sar", digest, namespace, name),
                                 lambda: self.reviews.access_review(user[0], tuple(user[1]), namespace, name)))

    def _cached(self, key: tuple, ask: Callable[[], object]) -> object:
        now = self.clock()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and now - hit[0] < self.ttl_s:
                return hit[1]
        try:
            value = ask()
        except Exception as exc:  # the API server failed: deny, never cache the failure
            log.warning("authorization check failed (%s): the request is denied", type(exc).__name__)
            return None if key[0] != "sar" else False
        with self._lock:
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[key] = (now, value)
        return value


class KubernetesReviews:
    """`Reviews` through the official client (the worker's ServiceAccount: system:auth-delegator, and `get` on
    the one key Secret in each served namespace, both rendered by the composition)."""

    def __init__(self, api_client, key_secret: tuple[str, str] | None, timeout_s: float = 5.0):
        from kubernetes import client

        self.client = client
        self.authn = client.AuthenticationV1Api(api_client)
        self.authz = client.AuthorizationV1Api(api_client)
        self.core = client.CoreV1Api(api_client)
        self.key_secret = key_secret
        self.timeout = timeout_s

    def token_review(self, token: str) -> tuple[str, tuple[str, ...]] | None:
        review = self.authn.create_token_review(self.client.V1TokenReview(
            spec=self.client.V1TokenReviewSpec(token=token)), _request_timeout=self.timeout)
        status = review.status
        if status is None or not status.authenticated or status.user is None:
            return None
        return status.user.username or "", tuple(status.user.groups or ())

    def access_review(self, user: str, groups: tuple[str, ...], namespace: str, name: str) -> bool:
        review = self.authz.create_subject_access_review(self.client.V1SubjectAccessReview(
            spec=self.client.V1SubjectAccessReviewSpec(user=user, groups=list(groups), resource_attributes=
                                                       self.client.V1ResourceAttributes(
                                                           group=GROUP, resource=RESOURCE, verb="get",
                                                           namespace=namespace, name=name))),
            _request_timeout=self.timeout)
        return bool(review.status and review.status.allowed)

    def api_key(self, namespace: str) -> str | None:
        if self.key_secret is None:
            return None
        from kubernetes.client.exceptions import ApiException

        name, key = self.key_secret
        try:
            secret = self.core.read_namespaced_secret(name, namespace, _request_timeout=self.timeout)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        value = (secret.data or {}).get(key)
        return base64.b64decode(value).decode() if value else None


def parse_key_secret(text: str | None) -> tuple[str, str] | None:
    """`--api-key-secret NAME/KEY` → (name, key)."""
    if not text:
        return None
    name, sep, key = text.partition("/")
    if not (sep and name and key):
        raise ValueError(f"--api-key-secret {text!r}: expected NAME/KEY")
    return name, key


UNAUTHENTICATED = ("this worker authorises each request for the model's namespace: send 'Authorization: Bearer "
                   "CREDENTIAL' with a ServiceAccount token that may get the ElasticModel, or the API key of the "
                   "model's namespace (the Secret its composition's apiKeySecret names)")


def install(app, authorizer: Authorizer | None, models: Callable[[], Iterable] = tuple) -> None:
    """Give every request of `app` its `request.state.access` (EVERYTHING without an authorizer); a /v1/ request
    without a credential gets 401 in OpenAI's error shape. The caller's answers for every served model
    (`models()`, each with .namespace and .name) are settled on a thread before the request runs, so an API
    server that answers slowly holds that request only, never the event loop every tenant shares."""
    import asyncio

    from starlette.middleware.base import BaseHTTPMiddleware
    from starlette.responses import JSONResponse

    def settle(access: Access) -> Access:
        allowed = frozenset((m.namespace, m.name) for m in models() if access.allows(m.namespace, m.name))
        return Access(check=lambda namespace, name: (namespace, name) in allowed)

    async def attach(request, call_next):
        access = EVERYTHING if authorizer is None else authorizer.access(request.headers.get("authorization"))
        if access.authenticated and access.check is not None:
            access = await asyncio.to_thread(settle, access)
        if not access.authenticated and request.url.path.startswith("/v1/"):
            return JSONResponse({"error": {"message": UNAUTHENTICATED, "type": "authentication_error",
                                           "param": None, "code": "Unauthenticated"}}, status_code=401)
        request.state.access = access
        return await call_next(request)

    app.add_middleware(BaseHTTPMiddleware, dispatch=attach)


def require_all(access: Access, models: Iterable) -> None:
    """/metrics on the API port: only for a caller that may get every served model (Unauthenticated else)."""
    from .errors import Unauthenticated

    if not access.allows_all((m.namespace, m.name) for m in models):
        raise Unauthenticated("Unauthenticated", "the metrics of this worker's models are scraped on its metrics "
                              "port; on the API port they need access to every model it serves")


def _names(access: Access, models: Iterable) -> set[str]:
    return {m.name for m in models if access.allows(m.namespace, m.name)}


def visible_readiness(body: dict, access: Access, models: Iterable) -> dict:
    """/readyz's body with only the models the caller may get (the status code stays: the kubelet's answer)."""
    names = _names(access, models)
    return {"ready": body["ready"], "loading": [n for n in body["loading"] if n in names],
            "serving": [n for n in body["serving"] if n in names],
            "refused": {n: r for n, r in body["refused"].items() if n in names}}


def visible_health(body: dict, access: Access) -> dict:
    """/healthz's detail: which models stall only to a caller that may see everything."""
    return body if access.check is None else {"live": body.get("live")}


def visible_status(body: dict, access: Access) -> dict:
    """/status with only the caller's models; the active swap model only when it is one of them."""
    models = [m for m in body["models"] if access.allows(m["namespace"], m["name"])]
    names = {m["name"] for m in models}
    swap = dict(body["swap"])
    if swap.get("active") not in names:
        swap["active"] = None
    return {**body, "models": models, "swap": swap}


def access_of(request) -> Access:
    """The access `install` attached (EVERYTHING when the app runs without it, e.g. in tests of the API)."""
    return getattr(request.state, "access", EVERYTHING)
