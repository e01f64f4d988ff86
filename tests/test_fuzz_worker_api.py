"""Fuzzing the worker's API from its own OpenAPI description (schemathesis) against a real CPU worker: no 500,
no hang, every error in OpenAI's error shape with a PascalCase code, and what the description says is
invalid is refused with a 4xx. Requests name the served model most of the time, so generation runs too.
Then the described chat bodies carry hostile JSON schemas (tests/hostile_schemas.py) in response_format, so
the fuzzing reaches the grammar path: each is answered 200 or 400 and the worker lives on (issue 34).

Bounded for CI: a fixed, deterministic number of examples per operation, a short context (every
generation ends within it) and a timeout per request. GPUSHARE_FUZZ_EXAMPLES raises the count."""
from __future__ import annotations

import copy
import json
import os
import re

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import max_response_time, not_a_server_error
from schemathesis.config import SchemathesisConfig
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (content_type_conformance, negative_data_rejection,
                                               response_schema_conformance, status_code_conformance)

import schemas
from worker.api import create_app
from worker.protocol import _CHAT_FIELDS, _COMPLETION_FIELDS

from worker_support import ServerThread, config_document, model_entry, single_threaded_torch, started_worker  # noqa: F401
from worker_support import tiny_models  # noqa: F401
from hostile_schemas import schemas as hostile_schemas

EXAMPLES = int(os.environ.get("GPUSHARE_FUZZ_EXAMPLES", "30"))
DERANDOMIZE = "GPUSHARE_FUZZ_EXAMPLES" not in os.environ  # CI: a fixed sample; set, random seeds explore further
REQUEST_TIMEOUT_S = 20  # a request that takes longer is a hang: every generation ends within CONTEXT tokens
CONTEXT = 48
SERVED = "tiny"
PASCAL = re.compile(r"^[A-Z][A-Za-z0-9]+$")


def test_the_description_lists_exactly_the_fields_the_worker_parses():
    """One truth per field: a field the worker accepts and the description lacks (or the reverse) fails here."""
    described = schemas.document("worker-api.openapi.json")["components"]["schemas"]
    assert set(described["CompletionRequest"]["properties"]) == _COMPLETION_FIELDS
    assert set(described["ChatRequest"]["properties"]) == _CHAT_FIELDS


@pytest.fixture(scope="module")
def worker_url(tiny_models):  # noqa: F811
    document = config_document([model_entry(SERVED, tiny_models["llama"], "resident", context=CONTEXT)],
                               max_queued=4)
    worker = started_worker(document)
    try:
        with ServerThread(create_app(worker)) as server:
            yield server.base_url
    finally:
        worker.stop()


@pytest.fixture(scope="module")
def api_schema(worker_url):
    """The description the worker serves, with `model` narrowed to the served name or one it does not serve
    (any other string is a 404 and never reaches generation)."""
    served = requests.get(f"{worker_url}/openapi.json", timeout=10)
    assert served.status_code == 200
    document = copy.deepcopy(served.json())
    for name in ("CompletionRequest", "ChatRequest"):
        document["components"]["schemas"][name]["properties"]["model"] = {"enum": [SERVED, "absent"]}
    config = SchemathesisConfig.from_dict({"generation": {"mode": "all", "max-examples": EXAMPLES,
                                                          "deterministic": DERANDOMIZE},
                                           "phases": {"coverage": {"enabled": False}}})
    loaded = schemathesis.openapi.from_dict(document, config=config)
    loaded.config.update(base_url=worker_url)
    return loaded


def openai_error_shape(ctx, response, case):
    """Every error answer is OpenAI's {"error": {message, type, param, code}} with a PascalCase code."""
    if response.status_code < 400:
        return None
    body = json.loads(response.content)
    error = body["error"]
    assert isinstance(error["message"], str) and error["message"], body
    assert isinstance(error["type"], str) and error["type"], body
    assert error["param"] is None or isinstance(error["param"], str), body
    assert PASCAL.match(error["code"]), body
    return True


CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          max_response_time]


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["valid", "invalid"])
def test_the_worker_api_from_its_openapi_description(api_schema, mode):
    """Each operation, with requests its description calls valid (they may still be refused: a context too
    short, a queue too small), then with requests it calls invalid (each must be refused with a 4xx)."""
    checks = CHECKS + ([negative_data_rejection] if mode is GenerationMode.NEGATIVE else [])
    for result in api_schema.get_all_operations():
        operation = result.ok()
        if mode is GenerationMode.NEGATIVE and not len(operation.body):
            continue  # nothing to send it that its description calls invalid (a path segment is never empty)
        strategy = operation.as_strategy(generation_mode=mode)

        @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=DERANDOMIZE,
                  suppress_health_check=list(HealthCheck))
        @given(case=strategy)
        def call(case):
            case.call_and_validate(timeout=REQUEST_TIMEOUT_S, checks=checks, additional_checks=[openai_error_shape])

        call()


# The described fields a chat body keeps when it carries a hostile schema: those the description bounds fully,
# so that the body reaches the grammar path (the rest is fuzzed above)
_SAMPLING = ("temperature", "top_p", "seed", "presence_penalty", "frequency_penalty", "stream", "stop", "user")


def _carrying_hostile_schema(body, schema: dict):
    """A described chat body for the served model, one message, one choice, `schema` in response_format (tools
    carry the same schemas in tests/test_worker_hostile_schemas.py, on a model whose template takes tools)."""
    kept = {key: value for key, value in body.items() if key in _SAMPLING} if isinstance(body, dict) else {}
    return {**kept, "model": SERVED, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "response_format": {"type": "json_schema", "json_schema": {"name": "hostile", "schema": schema}}}


def test_described_chat_bodies_carrying_hostile_schemas_are_answered_and_the_worker_lives(worker_url):
    """The described API with hostile schemas woven into its chat bodies (a schemathesis flatmap_body hook): no
    500, no hang, each answer OpenAI's shape, /healthz answering after each; and /metrics shows that the grammar
    path was reached and refused what passes the bounds."""
    loaded = schemathesis.openapi.from_dict(
        requests.get(f"{worker_url}/openapi.json", timeout=10).json(),
        config=SchemathesisConfig.from_dict({"generation": {"mode": "positive", "max-examples": EXAMPLES,
                                                            "deterministic": DERANDOMIZE},
                                             "phases": {"coverage": {"enabled": False}}}))
    loaded.config.update(base_url=worker_url)

    @loaded.hook("flatmap_body")
    def weave(context, body):
        return st.builds(_carrying_hostile_schema, st.just(body), hostile_schemas())

    operation = loaded["/v1/chat/completions"]["POST"]

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=DERANDOMIZE,
              suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=GenerationMode.POSITIVE))
    def call(case):
        case.call_and_validate(timeout=REQUEST_TIMEOUT_S, checks=CHECKS, additional_checks=[openai_error_shape])
        assert requests.get(f"{worker_url}/healthz", timeout=REQUEST_TIMEOUT_S).status_code == 200

    call()
    metrics = requests.get(f"{worker_url}/metrics", timeout=10).text
    refused = [line for line in metrics.splitlines() if line.startswith("gpushare_worker_grammar_refusals_total{")
               and 'limit="library"' not in line and not line.endswith(" 0.0")]
    assert refused, "no hostile schema reached the grammar path's bounds"
