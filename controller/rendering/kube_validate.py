"""Validation of rendered objects against Kubernetes' own OpenAPI schemas (strict).

Owns the check that every object compose writes is a valid Kubernetes object of
release KUBERNETES_VERSION, unknown fields included, using the strict schemas that
kubernetes-validate ships, as `kubernetes_validate.validate(doc, version, strict=True)`
does. Two validators per kind, both compiled once per process: a fast one
(fastjsonschema compiles the kind's schema and the definitions it reaches into
Python code) that passes the valid objects, and the reference one
(jsonschema) that explains every object the fast one rejects, so a failure always
carries jsonschema's path and message. Every object is validated in full.
Custom kinds in CUSTOM_KINDS (the Prometheus Operator's PodMonitor) are checked against
their schema under schemas/. Called by controller.rendering.compose; tests keep it in agreement with
kubernetes_validate.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache

import fastjsonschema
import jsonschema
from kubernetes_validate.utils import all_versions, major_minor, schema_contents
from referencing import Registry, Resource

import schemas

KUBERNETES_VERSION = "1.30"
# Format assertions are off in the reference validator (JSON Schema's default); the fast one matches.
_ANY_FORMAT = {name: (lambda _value: True) for name in ("int32", "int64", "double", "byte", "date-time")}


class NoSchema(Exception):
    """kubernetes-validate ships no schema for this apiVersion/kind (a custom resource)."""


# Custom resources compositions may render, each checked against its own schema under schemas/.
CUSTOM_KINDS = {("monitoring.coreos.com/v1", "PodMonitor"): "podmonitor"}


def validate_object(doc: dict, version: str = KUBERNETES_VERSION) -> None:
    """Raise jsonschema.ValidationError when `doc` is not a valid object; NoSchema for unknown kinds."""
    key = (version, str(doc.get("apiVersion")), str(doc.get("kind")))
    custom = CUSTOM_KINDS.get(key[1:])
    if custom is not None:
        schemas.validator(custom).validate(doc)
        return
    try:
        _fast(*key)(doc)
    except fastjsonschema.JsonSchemaValueException:
        _reference(*key).validate(doc)  # the reference validator explains the failure


def warm(kinds: tuple[tuple[str, str], ...], version: str = KUBERNETES_VERSION) -> None:
    """Compile the fast validators of these (apiVersion, kind) pairs now, e.g. once before forking
    processes that would otherwise each compile them."""
    for api_version, kind in kinds:
        _fast(version, api_version, kind)


def _schema_dir(version: str) -> str:
    release = [v for v in all_versions() if major_minor(v) <= major_minor(version)][-1]
    return f"kubernetes-json-schema/v{release}-local-strict"


@lru_cache(maxsize=64)
def _kind_schema(version: str, api_version: str, kind: str) -> dict:
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    try:
        return schema_contents(f"{_schema_dir(version)}/{kind.lower()}-{group_version}.json", version)
    except FileNotFoundError as exc:
        raise NoSchema(f"Kubernetes {version} has no built-in kind {kind} in {api_version}") from exc


@lru_cache(maxsize=4)
def _definitions(version: str) -> dict:
    return schema_contents(f"{_schema_dir(version)}/_definitions.json", version)


@lru_cache(maxsize=64)
def _reference(version: str, api_version: str, kind: str) -> jsonschema.Draft202012Validator:
    schema = _kind_schema(version, api_version, kind)
    registry = Resource.from_contents(_definitions(version)) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry)


@lru_cache(maxsize=64)
def _fast(version: str, api_version: str, kind: str) -> Callable[[dict], object]:
    """The kind's schema with the definitions it reaches inlined under `definitions`, compiled. Its failures carry
    no detail (the reference validator explains them), which makes compiling it, once per process, about 3 times
    faster (bench/pass_parts.py)."""
    definitions = _definitions(version)["$defs"]
    needed: dict[str, dict] = {}

    def local(node):
        if isinstance(node, dict):
            out = {}
            for key, value in node.items():
                if key == "$ref" and isinstance(value, str):
                    name = value.split("/$defs/", 1)[1]
                    if name not in needed:
                        needed[name] = {}
                        needed[name] = local(definitions[name])
                    out[key] = f"#/definitions/{name}"
                else:
                    out[key] = local(value)
            return out
        if isinstance(node, list):
            return [local(item) for item in node]
        return node

    schema = local(_kind_schema(version, api_version, kind))
    schema.update({"$schema": "http://json-schema.org/draft-07/schema#", "definitions": needed})
    try:
        return fastjsonschema.compile(schema, formats=_ANY_FORMAT, use_default=False, detailed_exceptions=False)
    except KeyError:  # fastjsonschema 2.22 cannot compile `const` without details; Kubernetes' schemas have none
        return fastjsonschema.compile(schema, formats=_ANY_FORMAT, use_default=False)
