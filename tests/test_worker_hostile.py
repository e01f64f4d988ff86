"""A client's mistakes never cost the worker a 500 or its event loop, over HTTP on 127.0.0.1: every field
of both endpoints with every hostile value, bodies that are not JSON or nest 100,000 deep, token ids
outside the vocabulary, oversized bodies (413 before parsing), unknown routes (404) and wrong methods (405),
all in OpenAI's error shape; and /healthz and generation go on while a long prompt is being tokenised."""
from __future__ import annotations

import threading

import httpx
import pytest

from hostile import CHAT_FIELDS, COMPLETION_FIELDS, RAW_BODIES, message_mutations, mutations
from worker.api import create_app
from worker_support import (  # noqa: F401  (fixtures are used by name)
    MiB, ServerThread, config_document, model_entry, single_threaded_torch, started_worker, tiny_models,
)

LIMIT = 2 * MiB
COMPLETION = {"model": "m", "prompt": "hi", "max_tokens": 1}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


@pytest.fixture(scope="module")
def base_url(tiny_models):
    document = config_document([model_entry("m", tiny_models["llama"], "resident")])
    document["server"]["maxRequestBytes"] = LIMIT
    worker = started_worker(document)
    with ServerThread(create_app(worker)) as thread:
        yield thread.base_url
    worker.stop()


@pytest.fixture(scope="module")
def http(base_url):
    with httpx.Client(base_url=base_url, timeout=30) as client:
        yield client


def assert_openai_error(response: httpx.Response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, response.text[:300]
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"], error
    assert error["type"] == "invalid_request_error" and error["code"][0].isupper(), error
    if code is not None:
        assert error["code"] == code, error
    return error


def assert_client_answer(case: str, response: httpx.Response) -> None:
    """A 200 answer, or a 4xx in OpenAI's shape: never a 5xx."""
    assert response.status_code < 500, (case, response.status_code, response.text[:300])
    if response.status_code >= 400:
        assert_openai_error(response, response.status_code)


@pytest.mark.parametrize("path,cases", [
    ("/v1/completions", lambda: mutations(COMPLETION, COMPLETION_FIELDS)),
    ("/v1/chat/completions", lambda: mutations(CHAT, CHAT_FIELDS)),
    ("/v1/chat/completions", lambda: message_mutations(CHAT)),
], ids=["completion-fields", "chat-fields", "chat-message-fields"])
def test_every_hostile_field_value_is_answered_without_a_server_error(http, path, cases):
    answered = {200: 0, 400: 0}
    for case, body in cases():
        response = http.post(path, json=body)
        assert_client_answer(case, response)
        answered[response.status_code] = answered.get(response.status_code, 0) + 1
    assert answered[200] and answered[400], answered  # the table holds both acceptable and hostile values


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("raw", RAW_BODIES, ids=lambda raw: f"{raw[:12]!r}..{len(raw)}B")
def test_bodies_that_are_not_a_json_object_are_400(http, path, raw):
    assert_openai_error(http.post(path, content=raw), 400)


@pytest.mark.parametrize("case,body,code,param", [
    ("token-id-past-the-vocabulary", {**COMPLETION, "prompt": [1, 258]}, "TokenOutOfVocabulary", "prompt"),
    ("negative-token-id", {**COMPLETION, "prompt": [-1]}, "TokenOutOfVocabulary", "prompt"),
    ("token-id-beyond-64-bits", {**COMPLETION, "prompt": [2 ** 70]}, "TokenOutOfVocabulary", "prompt"),
    ("batch-of-one-out-of-vocabulary", {**COMPLETION, "prompt": [[5, 99999]]}, "TokenOutOfVocabulary", "prompt"),
    ("logit-bias-past-the-vocabulary", {**COMPLETION, "logit_bias": {"258": 5}}, "TokenOutOfVocabulary",
     "logit_bias"),
    ("logit-bias-negative-id", {**CHAT, "logit_bias": {"-1": 5}}, "TokenOutOfVocabulary", "logit_bias"),
    ("seed-beyond-64-bits", {**COMPLETION, "seed": 2 ** 64}, "InvalidField", "seed"),
    ("stop-of-the-wrong-type", {**CHAT, "stop": 5}, "InvalidField", "stop"),
    ("n-zero", {**COMPLETION, "n": 0}, "InvalidField", "n"),
    ("n-beyond-the-queue", {**COMPLETION, "n": 65}, "TooManyChoices", "n"),
    ("empty-token-prompt", {**COMPLETION, "prompt": []}, "EmptyPrompt", "prompt"),
    ("template-rejects-nothing-but-tools-unsupported", {**CHAT, "tools": [
        {"type": "function", "function": {"name": "f"}}]}, "ToolsUnsupported", "tools"),
])
def test_named_client_mistakes_are_400_in_openai_shape(http, case, body, code, param):
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    assert assert_openai_error(http.post(path, json=body), 400, code)["param"] == param, case


@pytest.mark.parametrize("method,path", [
    ("GET", "/"), ("GET", "/v1"), ("GET", "/v1/embeddings"), ("POST", "/v1/embeddings"), ("POST", "/v2/completions"),
    ("GET", "/v1/completions/extra"), ("DELETE", "/nope"), ("GET", "/docs"),
])
def test_unknown_routes_are_404_in_openai_shape(http, method, path):
    assert_openai_error(http.request(method, path), 404, "NotFound")


@pytest.mark.parametrize("method,path,allowed", [
    ("GET", "/v1/completions", "POST"), ("PUT", "/v1/chat/completions", "POST"), ("POST", "/healthz", "GET"),
    ("DELETE", "/v1/models", "GET"), ("POST", "/metrics", "GET"),
])
def test_wrong_methods_are_405_in_openai_shape(http, method, path, allowed):
    response = http.request(method, path)
    assert_openai_error(response, 405, "MethodNotAllowed")
    assert response.headers["allow"] == allowed


def test_a_model_name_with_a_slash_is_an_unknown_model_not_an_unknown_route(http):
    assert_openai_error(http.get("/v1/models/llm/m"), 404, "ModelNotFound")


def test_a_declared_oversized_body_is_refused_413_before_it_is_read(base_url):
    body = b'{"model": "m", "prompt": "' + b"a" * LIMIT + b'"}'
    response = httpx.post(base_url + "/v1/completions", content=body, timeout=30)
    error = assert_openai_error(response, 413, "RequestTooLarge")
    assert f"declares {len(body)} bytes" in error["message"] and "server.maxRequestBytes" in error["message"]


def test_an_oversized_chunked_body_is_refused_413_once_it_passes_the_limit(base_url):
    sent = []

    def chunks():
        for _ in range(LIMIT // 65536 + 8):
            sent.append(65536)
            yield b" " * 65536

    response = httpx.post(base_url + "/v1/completions", content=chunks(), timeout=30)
    assert "passed" in assert_openai_error(response, 413, "RequestTooLarge")["message"]


def test_a_body_just_under_the_limit_is_parsed(http):
    padding = LIMIT - len(b'{"model": "m", "prompt": "", "user": ""}') - 10
    response = http.post("/v1/completions", content=b'{"model": "m", "prompt": "", "user": "' + b"u" * padding + b'"}')
    assert_openai_error(response, 400, "EmptyPrompt")  # parsed and checked, not refused for its size


def test_healthz_and_generation_go_on_while_a_long_prompt_is_tokenised(base_url, http):
    """A 360 KB prompt takes the byte tokenizer about a second: meanwhile the event loop answers, and the
    executor decodes another request's tokens (it does not share the tokenizer that is busy)."""
    outcome = {}

    def long_prompt():
        outcome["response"] = httpx.post(base_url + "/v1/completions", timeout=120,
                                         json={"model": "m", "prompt": "hello world " * 30_000})

    sender = threading.Thread(target=long_prompt)
    sender.start()
    rounds_meanwhile = 0
    while sender.is_alive():
        assert http.get("/healthz").status_code == 200
        reply = http.post("/v1/completions", json={"model": "m", "prompt": [72, 105], "max_tokens": 2,
                                                   "temperature": 0})
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 2
        rounds_meanwhile += sender.is_alive()
    sender.join()
    assert_openai_error(outcome["response"], 400, "ContextLengthExceeded")
    assert rounds_meanwhile >= 3, "health checks and generation waited for the tokenizer"


def test_the_worker_still_serves_after_the_hostile_requests(http):
    reply = http.post("/v1/completions", json={**COMPLETION, "max_tokens": 3, "temperature": 0})
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 3
