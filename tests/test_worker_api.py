"""The worker's HTTP API with the official openai client, over uvicorn on 127.0.0.1: listing, chat,
completion, streaming, errors (404, 400, 429, 503) in OpenAI's shape, readiness, status, metrics."""
from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest
import yaml

from worker.api import create_app
from engine.batch import Generation
from engine.sampling import SamplingParams
from worker_support import (  # noqa: F401  (fixtures are used by name)
    REPO_ROOT, MiB, ServerThread, config_document, model_entry, started_worker, single_threaded_torch, tiny_models,
)

SERVED = ["chat-elastic", "chat-resident", "chat-swap-a", "chat-swap-b", "llama-elastic", "llama-swap"]


@pytest.fixture(scope="module")
def server(tiny_models):
    models = [
        model_entry("chat-resident", tiny_models["llama"], "resident"),
        model_entry("chat-swap-a", tiny_models["qwen2"], "swap"),
        model_entry("chat-swap-b", tiny_models["llama-b"], "swap"),
        model_entry("chat-elastic", tiny_models["gpt2"], "elastic", residentLayers=2),
        model_entry("llama-swap", tiny_models["llama"], "swap"),
        model_entry("llama-elastic", tiny_models["llama"], "elastic", residentLayers=1),
        model_entry("too-big", tiny_models["llama"], "resident", budget=1 << 40, context=10_000_000),
    ]
    worker = started_worker(config_document(models, capacity=4 << 30))
    with ServerThread(create_app(worker)) as thread:
        yield worker, thread
    worker.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server[1].base_url}/v1", api_key="unused", max_retries=0)


def test_models_lists_the_served_elasticmodel_names_only(client):
    assert sorted(m.id for m in client.models.list()) == SERVED


@pytest.mark.parametrize("model", SERVED)
def test_chat_completion(client, model):
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi there"}],
                                           max_tokens=5, temperature=0)
    choice = reply.choices[0]
    assert reply.model == model and choice.message.role == "assistant"
    assert isinstance(choice.message.content, str)
    assert choice.finish_reason in ("length", "stop")
    assert reply.usage.completion_tokens <= 5 and reply.usage.prompt_tokens == len("<|user|>Hi there\n<|assistant|>")


def test_streamed_chat_equals_the_non_streamed_answer(client):
    request = dict(model="chat-swap-a", messages=[{"role": "user", "content": "Tell me"}], max_tokens=8, temperature=0)
    whole = client.chat.completions.create(**request).choices[0].message.content
    chunks = list(client.chat.completions.create(**request, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 8 and chunks[-1].choices == []


def test_completion_and_streamed_completion_agree(client):
    whole = client.completions.create(model="chat-elastic", prompt="Once upon", max_tokens=6, temperature=0)
    assert whole.usage.completion_tokens == 6 and whole.choices[0].finish_reason == "length"
    streamed = client.completions.create(model="chat-elastic", prompt="Once upon", max_tokens=6, temperature=0,
                                         stream=True)
    assert "".join(c.choices[0].text for c in streamed) == whole.choices[0].text


def test_one_model_answers_the_same_greedy_tokens_resident_swapped_and_elastic(client):
    answers = {}
    for model in ("chat-resident", "llama-swap", "llama-elastic"):
        reply = client.completions.create(model=model, prompt="The same question", max_tokens=12, temperature=0)
        answers[model] = (reply.choices[0].text, reply.usage.completion_tokens)
    assert len(set(answers.values())) == 1, answers


def test_completion_accepts_token_ids(client):
    reply = client.completions.create(model="chat-resident", prompt=[72, 105], max_tokens=3, temperature=0)
    assert reply.usage.prompt_tokens == 2


def test_unknown_model_is_404_in_openai_shape(client):
    with pytest.raises(openai.NotFoundError) as error:
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    assert error.value.code == "ModelNotFound" and error.value.param == "model"


def test_refused_model_is_503_with_its_reason(client):
    with pytest.raises(openai.InternalServerError) as error:
        client.completions.create(model="too-big", prompt="x", max_tokens=1)
    assert error.value.status_code == 503 and error.value.code == "InsufficientMemory"


@pytest.mark.parametrize("case,path,body,param", [
    ("messages-missing", "/v1/chat/completions", {"model": "chat-resident"}, "messages"),
    ("role-invalid", "/v1/chat/completions", {"model": "chat-resident", "messages": [{"role": "x"}]},
     "messages[0].role"),
    ("temperature-text", "/v1/completions", {"model": "chat-resident", "prompt": "a", "temperature": "hot"},
     "temperature"),
    ("max-tokens-zero", "/v1/completions", {"model": "chat-resident", "prompt": "a", "max_tokens": 0}, "max_tokens"),
    ("n-zero", "/v1/completions", {"model": "chat-resident", "prompt": "a", "n": 0}, "n"),
    ("prompt-plus-max-tokens-over-context", "/v1/completions",
     {"model": "chat-resident", "prompt": "a" * 200, "max_tokens": 100}, "max_tokens"),
    ("prompt-over-context", "/v1/completions", {"model": "chat-resident", "prompt": "a" * 300}, "prompt"),
])
def test_malformed_or_oversized_requests_are_400_naming_the_field(server, case, path, body, param):
    response = httpx.post(server[1].base_url + path, json=body, timeout=10)
    assert response.status_code == 400, case
    error = response.json()["error"]
    assert (error["param"], error["type"]) == (param, "invalid_request_error"), case
    assert error["message"] and error["code"][0].isupper(), case


def test_body_that_is_not_json_is_400(server):
    response = httpx.post(server[1].base_url + "/v1/completions", content=b"{nope", timeout=10)
    assert response.status_code == 400 and response.json()["error"]["code"] == "InvalidJSON"


def test_readiness_is_ready_and_names_the_refused_model(server):
    response = httpx.get(server[1].base_url + "/readyz", timeout=10)
    assert response.status_code == 200
    assert response.json() == {"ready": True, "loading": [], "serving": SERVED,
                               "refused": {"too-big": "InsufficientMemory"}}
    assert httpx.get(server[1].base_url + "/healthz", timeout=10).json() == {"status": "ok", "live": True,
                                                                             "stalled": {}}


def test_status_carries_the_verdicts_with_their_numbers(server):
    status = httpx.get(server[1].base_url + "/status", timeout=10).json()
    by_name = {m["name"]: m for m in status["models"]}
    big = by_name["too-big"]
    assert (big["verdict"], big["reason"], big["state"]) == ("refused", "InsufficientMemory", "refused")
    assert big["missingBytes"] == big["needBytes"] - big["availableBytes"] > 0
    elastic = by_name["chat-elastic"]
    assert (elastic["verdict"], elastic["residentLayers"], elastic["deviceResidentLayers"]) == ("applied", 2, 2)
    for entry in status["models"]:
        assert entry["deviceBytes"] <= entry["budgetBytes"] and entry["peakDeviceBytes"] <= entry["budgetBytes"]
    assert (elastic["forward"], "one sequence at a time" in elastic["fallback"], "gpt2" in elastic["fallback"]) \
        == ("transformers", True, True), "GPT-2 takes the non-batching fallback and /status says why"
    assert (by_name["chat-resident"]["forward"], "fallback" in by_name["chat-resident"]) == ("decoder", False)


def test_metrics_expose_requests_tokens_latency_swaps_streaming_and_verdicts(server, client):
    client.completions.create(model="chat-elastic", prompt="m", max_tokens=2, temperature=0)
    text = httpx.get(server[1].base_url + "/metrics", timeout=10).text
    for needle in ('gpushare_worker_requests_total{model="chat-elastic",outcome="ok"}',
                   'gpushare_worker_tokens_total{kind="completion",model="chat-elastic"}',
                   "gpushare_worker_ttft_seconds_bucket", "gpushare_worker_tpot_seconds_bucket",
                   'gpushare_worker_streamed_bytes_total{model="chat-elastic"}',
                   'gpushare_worker_device_bytes{mode="resident",model="chat-resident"}',
                   'gpushare_worker_verdict{mode="resident",model="too-big",namespace="llm",'
                   'reason="InsufficientMemory",'
                   'verdict="refused"} 1.0'):
        assert needle in text, needle


def test_swaps_are_counted(server, client):
    for model in ("chat-swap-a", "chat-swap-b", "chat-swap-a"):
        client.completions.create(model=model, prompt="s", max_tokens=1, temperature=0)
    text = httpx.get(server[1].base_url + "/metrics", timeout=10).text
    assert 'gpushare_worker_swaps_total{model="chat-swap-b"}' in text
    assert "gpushare_worker_swap_in_seconds_count" in text


def test_a_full_queue_answers_429_with_retry_after(tiny_models):
    models = [model_entry("hot", tiny_models["llama"], "swap"), model_entry("cold", tiny_models["qwen2"], "swap")]
    worker = started_worker(config_document(models, max_queued=1, min_residency_ms=600_000))
    try:
        with ServerThread(create_app(worker)) as thread:
            client = openai.OpenAI(base_url=f"{thread.base_url}/v1", api_key="unused", max_retries=0)
            client.completions.create(model="hot", prompt="a", max_tokens=1)  # hot is on the device for 10 min
            parked = Generation(prompt_ids=[1], params=SamplingParams(max_tokens=1), eos_ids=frozenset(),
                                decode=lambda ids: "")
            worker.submit("cold", parked, lambda event: None)  # waits for hot's residency: fills cold's queue
            with pytest.raises(openai.RateLimitError) as error:
                client.completions.create(model="cold", prompt="b", max_tokens=1)
            assert error.value.code == "QueueFull"
            assert int(error.value.response.headers["Retry-After"]) >= 1
            assert client.completions.create(model="hot", prompt="c", max_tokens=1).choices, "hot still serves"
    finally:
        worker.stop()


def test_python_m_worker_serves_the_config(tiny_models, tmp_path):
    config = tmp_path / "worker.yaml"
    config.write_text(yaml.safe_dump(config_document([model_entry("cli-model", tiny_models["gpt2"], "elastic")])))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen([sys.executable, "-m", "worker", "--config", str(config), "--port", str(port),
                                "--log-level", "warning"], cwd=REPO_ROOT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, "the worker exited"
            assert time.monotonic() < deadline, "the worker did not become ready in 60 s"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        assert client.completions.create(model="cli-model", prompt="hi", max_tokens=2, temperature=0).usage.completion_tokens == 2
    finally:
        process.terminate()
        try:
            returncode = process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
    # uvicorn shuts down gracefully, then re-raises the SIGTERM it caught
    assert returncode in (0, -signal.SIGTERM), "the worker did not stop on SIGTERM"
