"""Per-model readiness: models load smallest first and each serves as soon as it is loaded, while
a larger neighbour is still loading; /readyz, /readyz/{model} and /v1/models show each model's
state; health answers while the models are still being fetched, so the startup probe waits only for the
process."""
from __future__ import annotations

import threading

import httpx
import openai
import pytest
import torch

from worker.api import create_app
from worker.config import parse_config
from worker.runtime import Worker
from worker_support import (  # noqa: F401  (fixtures are used by name)
    ServerThread, config_document, model_entry, single_threaded_torch, tiny_models,
)
from tinymodels import save_tiny_model


@pytest.fixture(scope="module")
def big_model(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("big") / "big", "llama", layers=8)


def test_a_small_model_serves_while_its_larger_neighbour_still_loads(tiny_models, big_model, monkeypatch):
    import worker.runtime as runtime

    release, big_started = threading.Event(), threading.Event()
    real_load = runtime.load

    def load(directory, *args):
        if directory == big_model:
            big_started.set()
            assert release.wait(60), "the test never released the big model's load"
        return real_load(directory, *args)

    monkeypatch.setattr(runtime, "load", load)
    document = config_document([model_entry("big", big_model, "resident"),  # first in the config
                                model_entry("small", tiny_models["llama"], "resident")])
    worker = Worker(parse_config(document), device=torch.device("cpu"))
    worker.start()
    try:
        with ServerThread(create_app(worker)) as server:
            assert big_started.wait(60), "the big model never started loading"
            base = server.base_url
            assert worker.model_state("small") == "serving", "the smaller model loads first"
            assert httpx.get(base + "/readyz", timeout=10).status_code == 200, "one model serves: ready"
            assert httpx.get(base + "/readyz/small", timeout=10).status_code == 200
            assert httpx.get(base + "/readyz/big", timeout=10).status_code == 503
            states = {m["id"]: m["state"] for m in httpx.get(base + "/v1/models", timeout=10).json()["data"]}
            assert states == {"big": "loading", "small": "serving"}
            client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
            assert client.completions.create(model="small", prompt="hi", max_tokens=2, temperature=0).usage.completion_tokens == 2
            with pytest.raises(openai.InternalServerError) as loading:
                client.completions.create(model="big", prompt="hi", max_tokens=2)
            assert loading.value.code == "ModelLoading"
            release.set()
            assert worker.wait_loaded(60)
            assert httpx.get(base + "/readyz/big", timeout=10).status_code == 200
            assert client.completions.create(model="big", prompt="hi", max_tokens=2, temperature=0).usage.completion_tokens == 2
    finally:
        release.set()
        worker.stop()


def test_health_answers_while_the_models_files_are_still_being_fetched(tiny_models, monkeypatch):
    """`python -m worker` starts the worker in the background: /healthz answers at once while a model's files are
    fetched (a download may take hours), so the pod's startup probe never depends on the models."""
    import worker.runtime as runtime

    release, fetching = threading.Event(), threading.Event()
    real_resolve = runtime.resolve

    def resolve(model):
        fetching.set()
        assert release.wait(60), "the test never released the fetch"
        return real_resolve(model)

    monkeypatch.setattr(runtime, "resolve", resolve)
    worker = Worker(parse_config(config_document([model_entry("chat", tiny_models["llama"], "resident")])),
                    device=torch.device("cpu"))
    try:
        with ServerThread(create_app(worker)) as server:
            worker.start_in_background()
            assert fetching.wait(60), "the worker never started fetching"
            base = server.base_url
            assert httpx.get(base + "/healthz", timeout=10).status_code == 200
            assert httpx.get(base + "/readyz", timeout=10).status_code == 503
            status = httpx.get(base + "/status", timeout=10).json()
            assert [(m["name"], m["state"]) for m in status["models"]] == [("chat", "loading")]
            release.set()
            assert worker.wait_loaded(60)
            assert httpx.get(base + "/readyz/chat", timeout=10).status_code == 200
    finally:
        release.set()
        worker.stop()

