"""JSON Schemas: the single source of truth for every document gpushare reads or writes.

Owns the schema files beside this module (ElasticModel, profile, GPU inventory,
composition, worker config). Callers: the loader (controller.load), the worker's
config reader, the profiler's writer, and the CRD generator. Nothing else defines
a field.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from jsonschema import Draft202012Validator

SCHEMA_DIR = Path(__file__).resolve().parent


@lru_cache(maxsize=None)
def load(name: str) -> dict:
    """The schema document `<name>.schema.json` (e.g. "elasticmodel")."""
    return json.loads((SCHEMA_DIR / f"{name}.schema.json").read_text())


@lru_cache(maxsize=None)
def validator(name: str) -> Draft202012Validator:
    return Draft202012Validator(load(name))
