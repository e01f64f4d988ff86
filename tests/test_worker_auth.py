"""The worker's API key (the composition's apiKeySecret → GPUSHARE_API_KEY): /v1/ answers 401 in OpenAI's shape
without `Authorization: Bearer KEY`, serves with it, and the probes and metrics stay open. Checked on the app
`python -m worker` really serves, with the official openai client."""
from __future__ import annotations

import httpx
import openai
import pytest
import yaml

import worker.__main__ as worker_main
from worker_support import (  # noqa: F401  (fixtures are used by name)
    ServerThread, config_document, model_entry, single_threaded_torch, tiny_models,
)

KEY = "sk-test-7f3a9c"


@pytest.fixture(scope="module")
def served(tiny_models, tmp_path_factory):
    """The app `python -m worker` builds with GPUSHARE_API_KEY set (worker.serve.serve captured, not called)."""
    config = tmp_path_factory.mktemp("auth") / "worker.yaml"
    config.write_text(yaml.safe_dump(config_document([model_entry("guarded", tiny_models["gpt2"], "resident")])))
    captured = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GPUSHARE_API_KEY", KEY)
        patch.setattr("worker.serve.serve", lambda worker, app, **kwargs: captured.setdefault("app", app))
        patch.setattr("worker.runtime.Worker.stop", lambda self, **kwargs: captured.setdefault("worker", self))
        assert worker_main.main(["--config", str(config), "--log-level", "warning"]) == 0
    captured["worker"].wait_loaded(60)
    with ServerThread(captured["app"]) as thread:
        yield thread.base_url
    type(captured["worker"]).stop(captured["worker"])


@pytest.mark.parametrize("api_key", [pytest.param("sk-wrong", id="wrong-key"), pytest.param("", id="no-key")])
def test_requests_without_the_key_are_refused_in_openai_shape(served, api_key):
    client = openai.OpenAI(base_url=f"{served}/v1", api_key=api_key or "x", max_retries=0,
                           default_headers={} if api_key else {"Authorization": ""})
    with pytest.raises(openai.AuthenticationError) as refused:
        client.completions.create(model="guarded", prompt="hi", max_tokens=1)
    assert refused.value.status_code == 401
    assert refused.value.body["code"] == "InvalidAPIKey" and "apiKeySecret" in refused.value.body["message"]
    assert KEY not in str(refused.value.body)


def test_requests_with_the_key_are_served(served):
    client = openai.OpenAI(base_url=f"{served}/v1", api_key=KEY, max_retries=0)
    assert client.completions.create(model="guarded", prompt="hi", max_tokens=2, temperature=0).usage.completion_tokens == 2
    assert [m.id for m in client.models.list()] == ["guarded"]


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics"])
def test_probes_and_metrics_stay_open(served, path):
    assert httpx.get(f"{served}{path}", timeout=10).status_code == 200


def test_without_a_key_the_api_is_open():
    from worker.auth import api_key_from_env
    assert api_key_from_env({}) is None and api_key_from_env({"GPUSHARE_API_KEY": ""}) is None
    assert api_key_from_env({"GPUSHARE_API_KEY": KEY}) == KEY
