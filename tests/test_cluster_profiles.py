"""Which profile ConfigMaps cluster mode accepts (only what its own profiler Jobs write for models in git)
and where an accepted profile lands under profiles/measured/."""
from __future__ import annotations

import dataclasses

import pytest
import yaml

from controller.observe.facts import ProfileDocument
from controller.passes.measured import (MEASURED_DIR, ProfileRequest, measured_path, measured_profiles,
                                        profile_requests)
from controller.inputs.load import parse_model
from controller.rendering.names import profile_configmap_name
from controller.types import GpuSlot, Source
from tests.cluster_loop_support import PRODUCT, QWEN, measured_profile, model_doc
from tests.factories import toy_profile

PROFILE_CM = profile_configmap_name(QWEN, "main", PRODUCT)
REQUESTS = {("llm", PROFILE_CM): ProfileRequest(QWEN, "main", PRODUCT)}
SLUG = "qwen--qwen2.5-0.5b-instruct"


def _document(namespace: str, name: str, doc: dict) -> ProfileDocument:
    return ProfileDocument(namespace=namespace, name=name, text=yaml.safe_dump(doc))


def _changed(**fields) -> dict:
    doc = measured_profile()
    if "product" in fields:
        doc["gpu"] = {**doc["gpu"], "product": fields.pop("product")}
    return {**doc, **fields}


ACCEPT_CASES = [
    # id, namespace, name, profile document, files committed, reasons ignored
    ("the-requested-configmap-is-used", "llm", PROFILE_CM, _changed(), [f"{MEASURED_DIR}{PRODUCT}/{SLUG}.yaml"], []),
    ("a-forged-one-in-another-namespace-is-ignored", "attacker", PROFILE_CM, _changed(), [], ["ProfileNotRequested"]),
    ("another-name-in-the-model-namespace-is-ignored", "llm", "profile-qwen", _changed(), [], ["ProfileNotRequested"]),
    ("a-profile-of-another-model-is-ignored", "llm", PROFILE_CM, _changed(model="org/other"), [], ["ProfileMismatch"]),
    ("a-profile-on-another-gpu-is-ignored", "llm", PROFILE_CM, _changed(product="NVIDIA-H200"), [],
     ["ProfileMismatch"]),
    ("a-profile-of-another-revision-is-ignored", "llm", PROFILE_CM, _changed(revision="v2"), [], ["ProfileMismatch"]),
]


@pytest.mark.parametrize("namespace,name,doc,files,ignored", [c[1:] for c in ACCEPT_CASES],
                         ids=[c[0] for c in ACCEPT_CASES])
def test_only_the_configmap_the_controller_asked_for_is_used(namespace, name, doc, files, ignored):
    found = measured_profiles([_document(namespace, name, doc)], REQUESTS)
    assert list(found.files) == files
    assert [reason for reason, _ in found.ignored] == ignored
    assert found.errors == ()
    for _, message in found.ignored:
        assert f"ConfigMap/{namespace}/{name}" in message


def test_a_forged_configmap_does_not_shadow_the_requested_one():
    forged = _document("aaa-attacker", PROFILE_CM, _changed(method="forged numbers"))
    found = measured_profiles([forged, _document("llm", PROFILE_CM, _changed())], REQUESTS)
    assert found.sources == {f"{MEASURED_DIR}{PRODUCT}/{SLUG}.yaml": f"ConfigMap/llm/{PROFILE_CM}"}
    assert b"forged" not in "".join(found.files.values()).encode()


def test_a_profile_without_revision_takes_the_requested_one_and_its_own_file():
    v2 = profile_configmap_name(QWEN, "v2", PRODUCT)
    doc = {k: v for k, v in measured_profile().items() if k != "revision"}
    found = measured_profiles([_document("llm", v2, doc)], {("llm", v2): ProfileRequest(QWEN, "v2", PRODUCT)})
    path = f"{MEASURED_DIR}{PRODUCT}/{SLUG}@v2.yaml"
    assert list(found.files) == [path]
    assert yaml.safe_load(found.files[path])["revision"] == "v2"
    assert [(p.revision, p.file) for p in found.profiles] == [("v2", path)]


PATH_CASES = [
    # id, revision, path under profiles/measured/
    ("main-keeps-the-plain-slug", "main", f"{PRODUCT}/{SLUG}.yaml"),
    ("a-tag-is-appended", "v2.1", f"{PRODUCT}/{SLUG}@v2.1.yaml"),
    ("a-commit-is-appended", "0123abcd", f"{PRODUCT}/{SLUG}@0123abcd.yaml"),
    ("slashes-in-a-ref-stay-in-one-file", "refs/pr/1", f"{PRODUCT}/{SLUG}@refs--pr--1.yaml"),
]


@pytest.mark.parametrize("revision,expected", [c[1:] for c in PATH_CASES], ids=[c[0] for c in PATH_CASES])
def test_measured_path_keeps_revisions_apart(revision, expected):
    profile = dataclasses.replace(toy_profile(QWEN), gpu_product=PRODUCT, revision=revision)
    assert measured_path(profile) == MEASURED_DIR + expected


def _model(spec: dict):
    doc = model_doc(**spec)
    doc["spec"] = {k: v for k, v in doc["spec"].items() if v is not None}  # None: leave the field out
    model, errors = parse_model(doc, Source("models/llm/chat.yaml"))
    assert errors == []
    return model


H200 = GpuSlot(node="gpu-2", index=0, product="NVIDIA-H200", memory_bytes=141 << 30)
L4 = GpuSlot(node="gpu-1", index=0, product=PRODUCT, memory_bytes=23034 << 20)

REQUEST_CASES = [
    # id, model spec overrides, slots, the (product, revision) requested
    ("a-gpu-selector-asks-for-its-product", {}, [L4, H200], [(PRODUCT, "main")]),
    ("no-selector-asks-for-every-product", {"gpu": None}, [L4, H200, L4], [("NVIDIA-H200", "main"), (PRODUCT, "main")]),
    ("the-revision-is-part-of-the-name", {"revision": "v2"}, [L4], [(PRODUCT, "v2")]),
]


@pytest.mark.parametrize("spec,slots,expected", [c[1:] for c in REQUEST_CASES], ids=[c[0] for c in REQUEST_CASES])
def test_profile_requests_name_what_the_profiler_job_writes(spec, slots, expected):
    requests = profile_requests([_model(spec)], slots)
    assert requests == {("llm", profile_configmap_name(QWEN, revision, product)):
                        ProfileRequest(QWEN, revision, product) for product, revision in expected}
