"""A Kubernetes API server double for tests: kmock over HTTP in a thread, plus what kmock lacks.

Owns `KubeApiDouble` (kmock's KubernetesEmulator with real API semantics added) and
`serve()`, a context manager that runs it on its own event loop in a thread and hands
back a `RunningDouble` with a configured official `kubernetes.client.ApiClient`.

What the subclass adds to kmock, because cluster code relies on it:
- server-set metadata: `uid`, `resourceVersion` (one counter for the whole server,
  bumped only when an object really changes), `generation` (bumped when anything
  outside metadata and status changes), `creationTimestamp`;
- optimistic locking: a PUT or PATCH whose body carries a stale
  `metadata.resourceVersion` answers 409 Conflict, as the real API server does;
- the status subresource for the resources in `STATUS_SUBRESOURCES`: create drops
  `status`, writes to the main resource keep the old status, writes to `/status`
  change only `status`;
- a pod's `resize` subresource (in-place pod resize: only the containers' resources change),
  or a 404 for it with `serves_pod_resize = False`, as a cluster without in-place resize answers;
- PUT (replace), label selectors on lists, and the patch content types
  (merge-patch, JSON patch; strategic merge is applied as a merge patch for built-in
  kinds and answers 415 for custom resources, like the real server);
- unknown resources answer 404, so code must cope with a missing CRD.

State changes only in these handlers, which run after any reaction a test adds with
kmock's DSL: an injected error (`double.fail(...)`) leaves the state untouched.

Deviation kept on purpose: strategic-merge lists are replaced, not merged by key.
"""
from __future__ import annotations

import asyncio
import copy
import datetime
import itertools
import re
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import attrs
import jsonpatch
import kmock
import pytest
from kmock._internal import apps
from kubernetes import client

GroupPlural = tuple[str, str]

STATUS_SUBRESOURCES: frozenset[GroupPlural] = frozenset({
    ("gpushare.dev", "elasticmodels"),
    ("apps", "deployments"),
    ("batch", "jobs"),
    ("", "nodes"),
})
KNOWN_RESOURCES: frozenset[tuple[str, str, str]] = frozenset({
    ("", "v1", "nodes"),
    ("", "v1", "configmaps"),
    ("", "v1", "pods"),
    ("", "v1", "secrets"),
    ("", "v1", "events"),
    ("apps", "v1", "deployments"),
    ("batch", "v1", "jobs"),
    ("coordination.k8s.io", "v1", "leases"),
    ("events.k8s.io", "v1", "events"),
    ("gpushare.dev", "v1alpha1", "elasticmodels"),
    ("argoproj.io", "v1alpha1", "applications"),
})
BUILTIN_GROUPS = frozenset({"", "apps", "batch", "coordination.k8s.io", "events.k8s.io"})


def _status_error(code: int, reason: str, message: str, **details: Any) -> kmock.KubernetesError:
    return kmock.KubernetesError(status=code, reason=reason, message=message, details=details)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: dicts merge, null deletes, everything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


_SELECTOR_TERM = re.compile(
    r"^\s*(?:(?P<not>!)\s*(?P<absent>[^\s,!=()]+)"
    r"|(?P<key>[^\s,!=()]+)\s*(?:(?P<op>==|=|!=)\s*(?P<value>[^\s,()]*)"
    r"|\s+(?P<setop>in|notin)\s*\((?P<values>[^)]*)\))?)\s*$"
)


def _split_selector(selector: str) -> list[str]:
    """Split on commas that are not inside `in (a, b)` parentheses."""
    terms, depth, current = [], 0, ""
    for char in selector:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += char
    return [t for t in terms + [current] if t.strip()]


def label_selector_matches(selector: str, labels: dict[str, str]) -> bool:
    """Kubernetes label selector semantics (equality- and set-based)."""
    for term in _split_selector(selector):
        match = _SELECTOR_TERM.match(term)
        if not match:
            raise _status_error(400, "BadRequest", f"unable to parse requirement: {term!r}")
        if match["absent"]:
            if match["absent"] in labels:
                return False
            continue
        key = match["key"]
        if match["op"] in ("=", "=="):
            ok = labels.get(key) == match["value"]
        elif match["op"] == "!=":
            ok = labels.get(key) != match["value"]
        elif match["setop"]:
            values = {v.strip() for v in match["values"].split(",") if v.strip()}
            ok = (labels.get(key) in values) if match["setop"] == "in" else (labels.get(key) not in values)
        else:
            ok = key in labels
        if not ok:
            return False
    return True


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@attrs.define(kw_only=True)
class KubeApiDouble(kmock.KubernetesEmulator):
    """kmock's emulator with resourceVersion, generation, optimistic locking and /status."""

    _revisions: Iterator[int] = attrs.field(factory=lambda: itertools.count(1), init=False)
    serves_pod_resize: bool = True  # False: a cluster without in-place pod resize (its resize subresource is a 404)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        # Sub-priority 1 within the fallback: after every reaction a test adds, before kmock's own.
        # Creates answer 201 (the client reads a create's body only then); the status is fixed
        # per reaction in kmock, hence a reaction of its own.
        self.fallback ** 1 << self._serve
        (self.fallback ** 2)[kmock.method.POST] << 201 << self._serve_create

    async def _handle(self, request: kmock.Request) -> Any:
        # Skip KubernetesEmulator._handle: it mutates state before reactions run, so an injected
        # error would still change the object. Here only _serve and _serve_create change state.
        return await apps.RawHandler._handle(self, request)

    # -- the state -------------------------------------------------------------------------
    def _live(self, key) -> dict | None:
        if key not in self._objects or self._objects[key].deleted:
            return None
        return copy.deepcopy(self._objects[key].raw)

    def _store(self, key, obj: dict) -> None:
        if key in self._objects:
            self._objects[key].history.append(obj)
        else:
            self._objects[key] = obj

    def _stamp_new(self, obj: dict, namespace: str | None) -> dict:
        meta = obj.setdefault("metadata", {})
        if namespace is not None:
            meta["namespace"] = namespace
        meta.update({
            "uid": str(uuid.uuid4()),
            "resourceVersion": str(next(self._revisions)),
            "generation": 1,
            "creationTimestamp": _now(),
        })
        return obj

    def seed(self, plural: str, obj: dict) -> dict:
        """Store an object as a controller elsewhere would have (status kept). Loop thread only."""
        group, _, version = obj["apiVersion"].rpartition("/")
        resource = kmock.resource(group, version, plural)
        meta = obj.get("metadata", {})
        key = (resource, meta.get("namespace"), meta["name"])
        old = self._live(key)
        if old is None:
            stored = self._stamp_new(copy.deepcopy(obj), meta.get("namespace"))
        else:
            stored = self._advance(resource, old, copy.deepcopy(obj))
        self._store(key, stored)
        return copy.deepcopy(stored)

    def _advance(self, resource: kmock.resource, old: dict, new: dict) -> dict:
        """Carry server-set metadata forward; bump generation and resourceVersion on change."""
        new_meta = new.setdefault("metadata", {})
        old_meta = old["metadata"]
        for field in ("uid", "creationTimestamp", "name", "namespace", "generation", "resourceVersion"):
            if field in old_meta:
                new_meta[field] = old_meta[field]
        if self._spec_part(resource, new) != self._spec_part(resource, old):
            new_meta["generation"] = old_meta.get("generation", 1) + 1
        if new != old:
            new_meta["resourceVersion"] = str(next(self._revisions))
        return new

    @staticmethod
    def _has_status_subresource(resource: kmock.resource) -> bool:
        return (resource.group, resource.plural) in STATUS_SUBRESOURCES

    def _spec_part(self, resource: kmock.resource, obj: dict) -> dict:
        skip = {"metadata", "status"} if self._has_status_subresource(resource) else {"metadata"}
        return {k: v for k, v in obj.items() if k not in skip}

    # -- the handlers ----------------------------------------------------------------------
    async def _serve(self, request: kmock.Request) -> Any:
        resource = request.resource
        if resource is None or resource.plural is None:
            raise NotImplementedError  # not a Kubernetes resource URL: let kmock answer
        self._check_known(resource)
        if request.action == kmock.action.WATCH:
            raise NotImplementedError  # kmock's own watch streams from the event bus we feed
        async with self._lock:
            if request.name is None:
                if request.method == kmock.method.GET:
                    return self._list(request)
            elif request.subresource not in (None, "status") and not self._resizes(request):
                raise _status_error(404, "NotFound", f"subresource {request.subresource!r} is not served")
            elif request.method == kmock.method.GET:
                return self._fetch(request)
            elif request.method in (kmock.method.PATCH, kmock.method.PUT):
                return await self._write(request)
            elif request.method == kmock.method.DELETE:
                return await self._delete(request)
        raise _status_error(405, "MethodNotAllowed", f"{request.method} {request.url.path} is not supported")

    async def _serve_create(self, request: kmock.Request) -> dict:
        if request.resource is None or request.resource.plural is None or request.name is not None:
            raise NotImplementedError
        self._check_known(request.resource)
        async with self._lock:
            return await self._create(request)

    @staticmethod
    def _check_known(resource: kmock.resource) -> None:
        if (resource.group, resource.version, resource.plural) not in KNOWN_RESOURCES:
            raise _status_error(404, "NotFound", f"the server could not find the requested resource ({resource})")

    def _list(self, request: kmock.Request) -> dict:
        selector = request.params.get("labelSelector", "")
        items = []
        for (resource, namespace, _), obj in self._objects.items():
            if resource != request.resource or obj.deleted:
                continue
            if request.namespace is not None and namespace != request.namespace:
                continue
            raw = obj.raw
            if selector and not label_selector_matches(selector, raw.get("metadata", {}).get("labels") or {}):
                continue
            items.append(copy.deepcopy(raw))
        items.sort(key=lambda o: (o["metadata"].get("namespace") or "", o["metadata"]["name"]))
        latest = max((int(o["metadata"]["resourceVersion"]) for o in items), default=0)
        return {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": str(latest)}, "items": items}

    def _fetch(self, request: kmock.Request) -> dict:
        obj = self._live((request.resource, request.namespace, request.name))
        if obj is None:
            raise self._not_found(request)
        return obj

    @staticmethod
    def _not_found(request: kmock.Request) -> kmock.KubernetesError:
        return _status_error(404, "NotFound", f'{request.resource.plural} "{request.name}" not found',
                             name=request.name, kind=request.resource.plural)

    async def _create(self, request: kmock.Request) -> dict:
        body = copy.deepcopy(request.data or {})
        name = body.get("metadata", {}).get("name")
        if not name:
            raise _status_error(422, "Invalid", "metadata.name: Required value")
        namespace = request.namespace or body.get("metadata", {}).get("namespace")
        key = (request.resource, namespace, name)
        if self._live(key) is not None:
            raise _status_error(409, "AlreadyExists", f'{request.resource.plural} "{name}" already exists',
                                name=name, kind=request.resource.plural)
        if self._has_status_subresource(request.resource):
            body.pop("status", None)
        for field in ("uid", "resourceVersion", "generation", "creationTimestamp"):
            body.get("metadata", {}).pop(field, None)
        stored = self._stamp_new(body, namespace)
        self._store(key, stored)
        await self._buses[request.resource].put({"type": "ADDED", "object": copy.deepcopy(stored)})
        return copy.deepcopy(stored)

    async def _write(self, request: kmock.Request) -> dict:
        key = (request.resource, request.namespace, request.name)
        old = self._live(key)
        if old is None:
            raise self._not_found(request)
        body = request.data
        if request.method == kmock.method.PUT:
            wanted_version = (body or {}).get("metadata", {}).get("resourceVersion")
            proposed = copy.deepcopy(body or {})
        else:
            wanted_version = body.get("metadata", {}).get("resourceVersion") if isinstance(body, dict) else None
            proposed = self._apply_patch(request, old)
        if wanted_version is not None and wanted_version != old["metadata"]["resourceVersion"]:
            raise _status_error(
                409, "Conflict",
                f'Operation cannot be fulfilled on {request.resource.plural} "{request.name}": the object has been '
                "modified; please apply your changes to the latest version and try again",
                name=request.name, kind=request.resource.plural)
        if self._has_status_subresource(request.resource):
            proposed = self._respect_status_subresource(request, old, proposed)
        if self._resizes(request):
            proposed = self._only_resources(old, proposed)
        new = self._advance(request.resource, old, proposed)
        if new != old:
            self._store(key, new)
            await self._buses[request.resource].put({"type": "MODIFIED", "object": copy.deepcopy(new)})
        return copy.deepcopy(new)

    def _resizes(self, request: kmock.Request) -> bool:
        """A write to a pod's `resize` subresource (in-place pod resize), when this cluster serves it."""
        return (self.serves_pod_resize and request.subresource == "resize"
                and (request.resource.group, request.resource.plural) == ("", "pods"))

    @staticmethod
    def _only_resources(old: dict, proposed: dict) -> dict:
        """What a write to /resize keeps: the containers' resources, nothing else."""
        result = copy.deepcopy(old)
        wanted = {c.get("name"): c.get("resources") for c in (proposed.get("spec") or {}).get("containers") or []}
        for container in result.get("spec", {}).get("containers") or []:
            if container.get("name") in wanted:
                container["resources"] = copy.deepcopy(wanted[container["name"]])
        return result

    @staticmethod
    def _respect_status_subresource(request: kmock.Request, old: dict, proposed: dict) -> dict:
        if request.subresource == "status":
            result = copy.deepcopy(old)
            if "status" in proposed:
                result["status"] = proposed["status"]
            else:
                result.pop("status", None)
            return result
        result = {k: v for k, v in proposed.items() if k != "status"}
        if "status" in old:
            result["status"] = old["status"]
        return result

    @staticmethod
    def _apply_patch(request: kmock.Request, old: dict) -> dict:
        content_type = request.headers.get("Content-Type", "").split(";")[0].strip()
        if content_type == "application/merge-patch+json":
            return merge_patch(old, request.data)
        if content_type == "application/json-patch+json":
            try:
                return jsonpatch.apply_patch(old, request.data)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
                raise _status_error(422, "Invalid", f"the JSON patch does not apply: {exc}") from exc
        if content_type == "application/strategic-merge-patch+json" and request.resource.group in BUILTIN_GROUPS:
            return merge_patch(old, request.data)
        raise _status_error(415, "UnsupportedMediaType",
                            f"the body of the request was in an unknown format - accepted media types include: "
                            f"application/json-patch+json, application/merge-patch+json (got {content_type!r})")

    async def _delete(self, request: kmock.Request) -> dict:
        key = (request.resource, request.namespace, request.name)
        old = self._live(key)
        if old is None:
            raise self._not_found(request)
        self._objects[key].delete()
        await self._buses[request.resource].put({"type": "DELETED", "object": copy.deepcopy(old)})
        return old


@dataclass
class RunningDouble:
    """A started double: its URL, an ApiClient for it, and thread-safe helpers for tests."""

    mock: KubeApiDouble
    url: str
    api_client: client.ApiClient
    loop: asyncio.AbstractEventLoop

    def _on_loop(self, fn, *args):
        async def call():
            async with self.mock._lock:
                return fn(*args)
        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(timeout=10)

    def seed(self, plural: str, obj: dict) -> dict:
        """Create or replace an object as another actor would (status kept); returns it stored."""
        return self._on_loop(self.mock.seed, plural, obj)

    def get(self, api_version: str, plural: str, namespace: str | None, name: str) -> dict | None:
        """The stored object, or None."""
        group, _, version = api_version.rpartition("/")
        key = (kmock.resource(group, version, plural), namespace, name)
        return self._on_loop(self.mock._live, key)

    def versions(self, api_version: str, plural: str, namespace: str | None, name: str) -> int:
        """How many versions the object went through (creation counts as one)."""
        group, _, version = api_version.rpartition("/")
        key = (kmock.resource(group, version, plural), namespace, name)
        return self._on_loop(lambda: len([v for v in self.mock.objects[key].history.raw if v is not None]))

    def fail(self, status: int, times: int, *criteria: Any) -> Injection:
        """The next `times` requests matching kmock criteria (e.g. "patch", a resource) answer
        `status`; the state stays as it was. kmock's own slices count past requests too, hence this."""
        if not criteria:
            raise ValueError("name at least one kmock criterion, e.g. 'patch' or kmock.resource(...)")
        injection = Injection(status=status, remaining=times)
        self.mock[criteria] << injection.answer
        return injection


@dataclass
class Injection:
    """Errors still to answer; `remaining` reaches 0 once every one was served."""

    status: int
    remaining: int

    def answer(self) -> None:
        if self.remaining <= 0:
            raise NotImplementedError  # used up: kmock moves on to the next reaction
        self.remaining -= 1
        raise _status_error(self.status, "Injected", f"injected by the test: HTTP {self.status}")


@contextmanager
def serve() -> Iterator[RunningDouble]:
    """Run a KubeApiDouble on 127.0.0.1 in a thread; yield it with a configured ApiClient."""
    ready: threading.Event = threading.Event()
    started: dict[str, Any] = {}

    async def main() -> None:
        stop = asyncio.Event()
        async with KubeApiDouble() as mock, kmock.Server(mock) as server:
            started.update(mock=mock, url=str(server.url).rstrip("/"), loop=asyncio.get_running_loop(), stop=stop)
            ready.set()
            await stop.wait()

    thread = threading.Thread(target=asyncio.run, args=(main(),), name="kube-api-double", daemon=True)
    thread.start()
    if not ready.wait(timeout=10):
        raise RuntimeError("the Kubernetes API double did not start within 10 s")
    configuration = client.Configuration(host=started["url"])
    configuration.retries = 0
    api_client = client.ApiClient(configuration)
    try:
        yield RunningDouble(mock=started["mock"], url=started["url"], api_client=api_client, loop=started["loop"])
    finally:
        api_client.close()
        started["loop"].call_soon_threadsafe(started["stop"].set)
        thread.join(timeout=10)


@pytest.fixture()
def kube() -> Iterator[RunningDouble]:
    """A fresh API server double per test (import this fixture into a test module to use it)."""
    with serve() as running:
        yield running


def stored_after_merge_patch(patch: Any) -> Any:
    """What the API server keeps when `patch` is merge-patched onto nothing: no nulls."""
    return merge_patch({}, patch)
