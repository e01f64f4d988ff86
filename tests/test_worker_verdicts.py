"""Verdict publication to a ConfigMap with the official kubernetes client against kmock over HTTP:
created when missing, patched when present, retried after an API error, and end to end from a
worker that refuses one model."""
from __future__ import annotations

import shutil
import time

import yaml

from contract.verdicts import Verdict, render_document
from contract.wire import SLOT_LABEL as SLOT_ANNOTATION
from contract.wire import VERDICTS_DATA_KEY as DATA_KEY
from contract.wire import VERDICTS_LABEL as LABEL
from worker.verdicts import ConfigMapPublisher, PublishLoop
from worker_support import (  # noqa: F401  (fixtures are used by name)
    KubeApiThread, MiB, config_document, model_entry, started_worker, single_threaded_torch, tiny_models,
)

APPLIED = Verdict(name="a", namespace="llm", mode="resident", verdict="applied", reason="Applied", message="fits",
                  need_bytes=10, available_bytes=20, missing_bytes=0)
REFUSED = Verdict(name="b", namespace="llm", mode="elastic", verdict="refused", reason="InsufficientMemory",
                  message="missing 5", need_bytes=25, available_bytes=20, missing_bytes=5, resident_layers=3)


def wait_for(predicate, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def test_document_lists_every_model_with_its_numbers():
    document = yaml.safe_load(render_document("n/gpu0", [APPLIED, REFUSED]))
    assert document["slot"] == "n/gpu0" and document["kind"] == "WorkerVerdicts"
    assert document["models"] == [
        {"name": "a", "namespace": "llm", "mode": "resident", "verdict": "applied", "reason": "Applied",
         "message": "fits", "needBytes": 10, "availableBytes": 20, "missingBytes": 0},
        {"name": "b", "namespace": "llm", "mode": "elastic", "verdict": "refused", "reason": "InsufficientMemory",
         "message": "missing 5", "needBytes": 25, "availableBytes": 20, "missingBytes": 5, "residentLayers": 3},
    ]


def test_publisher_creates_then_patches_the_configmap():
    with KubeApiThread() as kube:
        publisher = ConfigMapPublisher(kube.core_v1(), "gpushare", "verdicts-n-gpu0")
        publisher.publish("n/gpu0", render_document("n/gpu0", [APPLIED]))
        publisher.publish("n/gpu0", render_document("n/gpu0", [APPLIED, REFUSED]))
        stored = kube.configmap("gpushare", "verdicts-n-gpu0")
        methods = kube.methods()
    assert methods == ["POST", "POST", "PATCH"], "create, then 409 on the second create, then merge-patch"
    assert [m["name"] for m in yaml.safe_load(stored["data"][DATA_KEY])["models"]] == ["a", "b"]
    assert stored["metadata"]["labels"][LABEL] == "true"
    assert stored["metadata"]["annotations"][SLOT_ANNOTATION] == "n/gpu0"


def test_publish_loop_retries_after_an_api_error():
    results: list[bool] = []
    with KubeApiThread() as kube:
        kube.emulator["post"][:1] << 500
        loop = PublishLoop(ConfigMapPublisher(kube.core_v1(), "gpushare", "v"), "n/gpu0",
                           first_backoff_s=0.05, on_result=results.append)
        loop.submit(render_document("n/gpu0", [REFUSED]))
        wait_for(lambda: True in results)
        loop.stop()
        stored = kube.configmap("gpushare", "v")
    assert results[0] is False and results[-1] is True
    assert yaml.safe_load(stored["data"][DATA_KEY])["models"][0]["missingBytes"] == 5


def test_worker_publishes_applied_and_refused_models(tiny_models):
    models = [model_entry("fits", tiny_models["llama"], "resident"),
              model_entry("too-big", tiny_models["qwen2"], "resident", budget=1 << 40, context=10_000_000)]
    with KubeApiThread() as kube:
        publisher = ConfigMapPublisher(kube.core_v1(), "gpushare", "verdicts")
        worker = started_worker(config_document(models, capacity=1 << 30,
                                                verdicts={"namespace": "gpushare", "name": "verdicts"}),
                                publisher=publisher)
        try:
            wait_for(lambda: "POST" in kube.methods())
            stored = kube.configmap("gpushare", "verdicts")
        finally:
            worker.stop()
    entries = {m["name"]: m for m in yaml.safe_load(stored["data"][DATA_KEY])["models"]}
    assert entries["fits"]["verdict"] == "applied"
    big = entries["too-big"]
    assert (big["verdict"], big["reason"]) == ("refused", "InsufficientMemory")
    assert big["availableBytes"] < big["needBytes"] and big["missingBytes"] == big["needBytes"] - big["availableBytes"]


def test_a_model_that_fails_to_load_is_refused_and_republished_while_the_rest_serve(tiny_models, tmp_path):
    broken = tmp_path / "no-tokenizer"
    broken.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tiny_models["llama"] / name, broken / name)
    models = [model_entry("broken", broken, "resident"), model_entry("fits", tiny_models["gpt2"], "elastic")]
    with KubeApiThread() as kube:
        worker = started_worker(config_document(models, verdicts={"namespace": "gpushare", "name": "verdicts"}),
                                publisher=ConfigMapPublisher(kube.core_v1(), "gpushare", "verdicts"))
        try:
            def published() -> dict:
                try:
                    stored = kube.configmap("gpushare", "verdicts")
                except KeyError:
                    return {}
                return {m["name"]: m for m in yaml.safe_load(stored["data"][DATA_KEY])["models"]}

            wait_for(lambda: published().get("broken", {}).get("verdict") == "refused")
            entries = published()
            ready, body = worker.readiness()
        finally:
            worker.stop()
    assert (entries["broken"]["reason"], entries["fits"]["verdict"]) == ("ModelUnreadable", "applied")
    assert "tokenizer" in entries["broken"]["message"]
    assert ready and body["serving"] == ["fits"] and body["refused"] == {"broken": "ModelUnreadable"}
