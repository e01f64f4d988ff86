"""The ElasticModel CRD: in sync with schemas/, a valid and structural CRD, same verdicts as the JSON Schema."""
from __future__ import annotations

from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

import schemas
from controller.kube import crd
from controller.observe.status import Observed, conditions_for, status_patch
from controller.types import SLO, Decision, ElasticModel, Predicted
from tests.kubedouble import stored_after_merge_patch as stored

ROOT = Path(__file__).resolve().parent.parent
CRD_DOC = yaml.safe_load(crd.CRD_PATH.read_text())
VERSION = CRD_DOC["spec"]["versions"][0]
OPENAPI = VERSION["schema"]["openAPIV3Schema"]
# OpenAPI v3.0 value keywords are Draft 4's (boolean exclusiveMinimum); x-kubernetes-* keys are ignored.
CRD_VALIDATOR = jsonschema.Draft4Validator(OPENAPI)


def test_the_crd_file_is_generated_from_the_schema():
    assert crd.CRD_PATH.read_text() == crd.render(), "run `python -m controller.kube.crd`"
    assert crd.main(["--check"]) == 0


@pytest.mark.parametrize("version", ["1.30", "1.33"])
def test_the_crd_validates_as_a_kubernetes_object(version):
    kubernetes_validate.validate(CRD_DOC, version, strict=True)


def _nodes(schema: dict, path: str = ""):
    yield path, schema
    for name, child in (schema.get("properties") or {}).items():
        yield from _nodes(child, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from _nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _nodes(schema["additionalProperties"], f"{path}.*")


def test_the_schema_is_structural():
    for path, node in _nodes(OPENAPI):
        assert not {"$ref", "$defs", "const", "oneOf", "$schema", "$id"} & set(node), path
        assert node.get("additionalProperties", {}) is not False, path
        if node.get("x-kubernetes-int-or-string"):
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], path
        else:
            assert "type" in node and "anyOf" not in node, f"{path} needs a type"


def test_status_subresource_short_name_and_printer_columns():
    assert VERSION["subresources"] == {"status": {}}
    assert CRD_DOC["spec"]["names"]["shortNames"] == ["em"]
    default_columns = {c["name"].upper(): c["jsonPath"] for c in VERSION["additionalPrinterColumns"]
                       if not c.get("priority")}
    assert default_columns == {
        "MODE": ".status.assigned.mode",
        "GPU": ".status.assigned.gpu.slot",
        "READY": '.status.conditions[?(@.type=="Ready")].status',
        "SYNCED": '.status.conditions[?(@.type=="Synced")].status',
        "AGE": ".metadata.creationTimestamp",
    }


def _em(spec: dict, name: str = "chat") -> dict:
    return {"apiVersion": "gpushare.dev/v1alpha1", "kind": "ElasticModel",
            "metadata": {"name": name, "namespace": "llm"}, "spec": spec}


SAME_VERDICT_CASES = [
    ("minimal", _em({"model": "org/chat", "memoryBudget": "4Gi"}), True),
    ("budget-as-integer", _em({"model": "org/chat", "memoryBudget": 4294967296}), True),
    ("full", _em({"model": "Qwen/Qwen2.5-0.5B-Instruct", "revision": "v1.2", "memoryBudget": "1.5Gi",
                  "slo": {"contextTokens": 8192, "concurrency": 4, "ttftMs": 500, "tpotMs": 50.5},
                  "gpu": {"product": "NVIDIA-H200"}, "compositionRef": {"name": "default"}}), True),
    ("budget-with-unit-typo", _em({"model": "org/chat", "memoryBudget": "4GB"}), False),
    ("budget-zero", _em({"model": "org/chat", "memoryBudget": 0}), False),
    ("budget-negative-string", _em({"model": "org/chat", "memoryBudget": "-4Gi"}), False),
    ("model-missing", _em({"memoryBudget": "4Gi"}), False),
    ("ttft-zero", _em({"model": "org/chat", "memoryBudget": "4Gi", "slo": {"ttftMs": 0}}), False),
    ("concurrency-zero", _em({"model": "org/chat", "memoryBudget": "4Gi", "slo": {"concurrency": 0}}), False),
    ("gpu-product-with-space", _em({"model": "org/chat", "memoryBudget": "4Gi", "gpu": {"product": "NVIDIA H200"}}),
     False),
    ("composition-without-name", _em({"model": "org/chat", "memoryBudget": "4Gi", "compositionRef": {}}), False),
    ("name-with-uppercase", _em({"model": "org/chat", "memoryBudget": "4Gi"}, name="Chat"), False),
    ("spec-missing", {"apiVersion": "gpushare.dev/v1alpha1", "kind": "ElasticModel", "metadata": {"name": "x"}},
     False),
]


@pytest.mark.parametrize("doc,valid", [c[1:] for c in SAME_VERDICT_CASES], ids=[c[0] for c in SAME_VERDICT_CASES])
def test_the_api_server_and_the_json_schema_agree(doc, valid):
    assert schemas.validator("elasticmodel").is_valid(doc) is valid
    assert CRD_VALIDATOR.is_valid(doc) is valid


def _repo_elastic_models():
    for path in sorted([*ROOT.glob("config/samples/*.yaml"), *ROOT.glob("examples/**/*.yaml")]):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "ElasticModel":
                yield pytest.param(doc, id=f"{path.relative_to(ROOT)}:{doc['metadata']['name']}")


@pytest.mark.parametrize("doc", list(_repo_elastic_models()))
def test_every_shipped_elastic_model_is_accepted_by_the_crd(doc):
    assert CRD_VALIDATOR.is_valid(doc), list(CRD_VALIDATOR.iter_errors(doc))


def test_spec_mode_is_declared_so_that_the_cel_rule_rejects_it_instead_of_pruning():
    spec = OPENAPI["properties"]["spec"]
    assert "mode" in spec["properties"]  # not pruned on decode, so the rule below sees it
    assert spec["x-kubernetes-validations"] == [crd.MODE_RULE]
    assert crd.MODE_RULE["rule"] == "!has(self.mode)" and "status.assigned.mode" in crd.MODE_RULE["message"]
    assert not schemas.validator("elasticmodel").is_valid(_em({"model": "m", "memoryBudget": 1, "mode": "swap"}))


@pytest.mark.parametrize("mode,predicted", [("elastic", Predicted(900.0, 80.0)), ("refused", None),
                                            ("swap", Predicted(900.0, 20.0, 700.0))])
def test_the_status_the_controller_writes_fits_the_status_schema(mode, predicted):
    model = ElasticModel(name="chat", namespace="llm", model="org/chat", budget_bytes=1 << 30,
                         slo=SLO(ttft_ms=500), has_slo=True, generation=2)
    decision = Decision(name="chat", namespace="llm", model="org/chat", gpu_product="NVIDIA-H200",
                        slot=None if mode == "refused" else "n/gpu0", mode=mode, resident_layers=3, total_layers=24,
                        need_bytes=5 << 30, budget_bytes=1 << 30, footprint_bytes=1 << 30, predicted=predicted,
                        slo_met=None if predicted is None else False, reason="numbers", reason_code="ExceedsBudget",
                        profile="org/chat@NVIDIA-H200")
    conditions = conditions_for(model, decision, None, None, Observed(), [], "2026-01-01T00:00:00Z")
    status = stored(status_patch(model, conditions, decision))["status"]
    jsonschema.Draft4Validator(OPENAPI["properties"]["status"]).validate(status)
    assert len({c["type"] for c in status["conditions"]}) == len(status["conditions"])  # list-map key: type


def test_a_rightsizing_status_fits_the_status_schema():
    from dataclasses import replace

    from controller.policy import Rightsizing

    model = replace(ElasticModel(name="chat", namespace="llm", model="org/chat", budget_bytes=2 << 30, generation=2),
                    rightsizing=Rightsizing(policy="Recommend"), user_budget_bytes=4 << 30,
                    rightsizing_conditions=({"type": "UsageAvailable", "status": "True", "reason": "UsageRead",
                                             "message": "usage read"},),
                    rightsizing_recommendation={"budgetBytes": 2 << 30, "direction": "down", "reason": "BelowTarget",
                                                "at": "2027-01-15T06:00:00Z", "reviewBranch": "gpushare/rs",
                                                "fit": "InPlace", "kvReservationBytes": 1 << 28, "kvSequences": 2})
    conditions = conditions_for(model, None, None, None, Observed(), [], "2026-01-01T00:00:00Z")
    status = stored(status_patch(model, conditions, None))["status"]
    jsonschema.Draft4Validator(OPENAPI["properties"]["status"]).validate(status)
    assert {"UsageAvailable", "NeedsCapacity", "AtMaxBudget"} <= {c["type"] for c in status["conditions"]}
