"""JSON Schemas: the single source of truth for every document gpushare reads or writes.

Owns the schema files beside this module (ElasticModel, profile, GPU inventory,
composition, worker config) and the worker API's OpenAPI description. Callers: the loader (controller.inputs.load), the worker's
config reader, the profiler's writer, and the CRD generator. Nothing else defines
a field.
"""
from __future__ import annotations

import copy
import json
from functools import lru_cache
from pathlib import Path

import fastjsonschema
from jsonschema import Draft202012Validator

SCHEMA_DIR = Path(__file__).resolve().parent


@lru_cache(maxsize=None)
def load(name: str) -> dict:
    """The schema document `<name>.schema.json` (e.g. "elasticmodel")."""
    return json.loads((SCHEMA_DIR / f"{name}.schema.json").read_text())


@lru_cache(maxsize=None)
def document(filename: str) -> dict:
    """Another JSON document beside the schemas, e.g. the worker API's OpenAPI description
    (`worker-api.openapi.json`, which the worker serves at /openapi.json)."""
    return json.loads((SCHEMA_DIR / filename).read_text())


@lru_cache(maxsize=None)
def validator(name: str) -> Draft202012Validator:
    return Draft202012Validator(load(name))


@lru_cache(maxsize=None)
def is_valid(name: str):
    """A fast yes/no check of the same schema (compiled to Python by fastjsonschema). Callers use it to
    skip `validator(name)` for valid documents; jsonschema still explains every invalid one."""
    # A copy (compile may annotate the schema), and no defaults written into the checked document.
    compiled = fastjsonschema.compile(copy.deepcopy(load(name)), use_default=False)

    def check(doc: object) -> bool:
        try:
            compiled(doc)
        except fastjsonschema.JsonSchemaValueException:
            return False
        return True

    return check
