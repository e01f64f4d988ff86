"""Publishing a profile: the official kubernetes client against the API server double over HTTP, and files.

Checks the ConfigMap's labels, annotations and data key, create then
merge-patch on 409, ConfigMapForbidden (exit code and termination line) on 403,
and the label-safe model hash.
"""
from __future__ import annotations

import io
import re

import pytest
import yaml
from kubernetes import client

from profiler_job import errors, publish
from profiler_job.args import ConfigMapTarget, FileTarget
from profiler_job.cli import main
from profiler_job.run import Adapters
from tests.kubedouble import kube  # noqa: F401 - the API server double fixture
from tests.tinymodels import save_tiny_model

PROFILE = {"apiVersion": "gpushare.dev/v1alpha1", "kind": "ModelProfile", "model": "Qwen/Qwen2.5-0.5B-Instruct",
           "revision": "main", "gpu": {"product": "NVIDIA-H200"}, "weights": {"totalBytes": 1}}
TARGET = ConfigMapTarget("llm", "profile-qwen-h200")


def core_api_of(double):
    return lambda: client.CoreV1Api(double.api_client)


def test_configmap_is_created_with_profile_labels_and_data(kube):  # noqa: F811
    where = publish.publish(PROFILE, TARGET, core_api_of(kube))

    stored = kube.get("v1", "configmaps", "llm", "profile-qwen-h200")
    assert where == "configmap:llm/profile-qwen-h200"
    assert stored["metadata"]["labels"] == {
        "gpushare.dev/profile": "true", "gpushare.dev/gpu-product": "NVIDIA-H200",
        "gpushare.dev/model-hash": publish.model_hash("Qwen/Qwen2.5-0.5B-Instruct", "main"),
        "app.kubernetes.io/managed-by": "gpushare-profiler"}
    assert stored["metadata"]["annotations"] == {"gpushare.dev/model": "Qwen/Qwen2.5-0.5B-Instruct",
                                                 "gpushare.dev/revision": "main"}
    assert yaml.safe_load(stored["data"]["profile.yaml"]) == PROFILE


def test_existing_configmap_is_patched_with_the_new_profile(kube):  # noqa: F811
    publish.publish(PROFILE, TARGET, core_api_of(kube))
    newer = {**PROFILE, "weights": {"totalBytes": 2}}
    publish.publish(newer, TARGET, core_api_of(kube))

    stored = kube.get("v1", "configmaps", "llm", "profile-qwen-h200")
    assert yaml.safe_load(stored["data"]["profile.yaml"]) == newer
    assert kube.versions("v1", "configmaps", "llm", "profile-qwen-h200") == 2
    assert [r.method.value for r in kube.mock] == ["POST", "POST", "PATCH"]
    assert kube.mock[-1].headers["Content-Type"] == "application/merge-patch+json"


@pytest.mark.parametrize("status,method,error", [
    (403, "post", errors.ConfigMapForbidden),
    (401, "post", errors.ConfigMapForbidden),
    (500, "post", errors.PublishFailed),
], ids=["create-forbidden", "create-unauthorized", "server-error"])
def test_api_refusals_are_typed(status, method, error, kube):  # noqa: F811
    kube.fail(status, 1, method)
    with pytest.raises(error, match=f"ConfigMap llm/profile-qwen-h200.*HTTP {status}"):
        publish.publish(PROFILE, TARGET, core_api_of(kube))


def test_patch_forbidden_after_409_is_configmap_forbidden(kube):  # noqa: F811
    publish.publish(PROFILE, TARGET, core_api_of(kube))
    kube.fail(403, 1, "patch")
    with pytest.raises(errors.ConfigMapForbidden, match="create and patch on configmaps in namespace llm"):
        publish.publish(PROFILE, TARGET, core_api_of(kube))


def test_forbidden_write_ends_the_job_with_its_exit_code_and_line(kube, tmp_path):  # noqa: F811
    model = save_tiny_model(tmp_path / "llama", "llama")
    kube.fail(403, 1, "post")
    log = tmp_path / "termination-log"
    code = main(["--model", str(model), "--gpu-product", "NVIDIA-H200", "--context-tokens", "16", "--repeats", "1",
                 "--out", "configmap:llm/profile-llama", "--termination-log", str(log)],
                adapters=Adapters(cuda_available=lambda: False, core_api=core_api_of(kube)), stderr=io.StringIO())
    assert code == errors.ConfigMapForbidden.exit_code
    assert log.read_text().startswith("ConfigMapForbidden: the API server refused to write ConfigMap llm/profile-llama")


def test_file_target_is_written_whole(tmp_path):
    path = tmp_path / "profiles" / "p.yaml"
    assert publish.publish(PROFILE, FileTarget(str(path)), core_api=lambda: pytest.fail("no API for files"))
    assert yaml.safe_load(path.read_text()) == PROFILE
    assert [p.name for p in path.parent.iterdir()] == ["p.yaml"]  # no temporary file left behind


@pytest.mark.parametrize("model,revision", [
    ("Qwen/Qwen2.5-0.5B-Instruct", "main"),
    ("meta-llama/Llama-3.1-8B-Instruct", "0e9e39f249a16976918f6564b8830bc894c89659"),
    ("/models/local path with spaces", "main"),
], ids=["hub-id", "commit-revision", "local-path"])
def test_model_hash_is_a_label_value_that_tells_revisions_apart(model, revision):
    value = publish.model_hash(model, revision)
    assert re.fullmatch(r"[0-9a-f]{16}", value)
    assert value != publish.model_hash(model, revision + "x")
