"""The fast schema checks (fastjsonschema) agree with the reference validator (jsonschema) on every
document the project ships or tests with, valid or broken; compose's fast Kubernetes check likewise."""
from __future__ import annotations

import copy

import pytest
import yaml

import schemas
from controller.inputs.load import load_documents
from tests.conftest import REPO_ROOT

KINDS = {"ElasticModel": "elasticmodel", "ModelProfile": "profile", "GPUInventory": "gpus",
         "WorkerConfig": "worker-config", "Composition": "composition"}


def _documents():
    roots = ["examples", "tests/fixtures", "config/samples", "templates/compositions"]
    for root in roots:
        for path in sorted((REPO_ROOT / root).rglob("*.yaml")):
            docs, _ = load_documents(path.read_text(), str(path))
            for index, doc in docs:
                if isinstance(doc, dict) and doc.get("kind") in KINDS:
                    yield pytest.param(KINDS[doc["kind"]], doc, id=f"{path.relative_to(REPO_ROOT)}#{index}")


def _mutations(doc: dict):
    yield doc
    for key in list(doc):
        broken = copy.deepcopy(doc)
        broken[key] = {"unexpected": [1, None]}
        yield broken
    spec = doc.get("spec")
    if isinstance(spec, dict):
        for key in list(spec):
            for value in (None, -1, "", "x" * 300, [], {"mode": "resident"}):
                broken = copy.deepcopy(doc)
                broken["spec"][key] = value
                yield broken


@pytest.mark.parametrize("schema,doc", list(_documents()))
def test_fast_check_agrees_with_jsonschema(schema, doc):
    for candidate in _mutations(doc):
        reference = not any(True for _ in schemas.validator(schema).iter_errors(candidate))
        untouched = copy.deepcopy(candidate)
        assert schemas.is_valid(schema)(candidate) == reference, yaml.safe_dump(candidate)[:400]
        assert candidate == untouched  # the check never fills in defaults
