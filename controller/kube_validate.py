"""Validation of rendered objects against Kubernetes' own OpenAPI schemas (strict).

Owns the check that every object compose writes is a valid Kubernetes object of
release KUBERNETES_VERSION, unknown fields included. It uses the strict schemas
that kubernetes-validate ships, the way `kubernetes_validate.validate(doc,
version, strict=True)` does, but compiles each kind's validator once per process
instead of re-reading the 10 MB definitions file for every object: only the
compiled schema is shared, every object is still validated in full.
Called by controller.compose; tests keep it in agreement with kubernetes_validate.
"""
from __future__ import annotations

import re
from functools import lru_cache

import jsonschema
from kubernetes_validate.utils import all_versions, major_minor, schema_contents
from referencing import Registry, Resource

KUBERNETES_VERSION = "1.30"


class NoSchema(Exception):
    """kubernetes-validate ships no schema for this apiVersion/kind (a custom resource)."""


def validate_object(doc: dict, version: str = KUBERNETES_VERSION) -> None:
    """Raise jsonschema.ValidationError when `doc` is not a valid object; NoSchema for unknown kinds."""
    _validator(version, str(doc.get("apiVersion")), str(doc.get("kind"))).validate(doc)


@lru_cache(maxsize=64)
def _validator(version: str, api_version: str, kind: str) -> jsonschema.Draft202012Validator:
    release = [v for v in all_versions() if major_minor(v) <= major_minor(version)][-1]
    schema_dir = f"kubernetes-json-schema/v{release}-local-strict"
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    try:
        schema = schema_contents(f"{schema_dir}/{kind.lower()}-{group_version}.json", version)
    except FileNotFoundError as exc:
        raise NoSchema(f"Kubernetes {version} has no built-in kind {kind} in {api_version}") from exc
    registry = Resource.from_contents(_definitions(schema_dir, version)) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry)


@lru_cache(maxsize=4)
def _definitions(schema_dir: str, version: str) -> dict:
    return schema_contents(f"{schema_dir}/_definitions.json", version)
