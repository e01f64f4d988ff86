"""No schema kills the worker (issue 34): a real `python -m worker` process with two models, asked by the official
`openai` client for structured output under hostile JSON schemas, in response_format and in tools.

Issue 34's request (1,000 definitions, each referring to the next) crashed the whole process with SIGSEGV while
the grammar was built; it is a 400 `UnsupportedSchema` naming the depth and the path, and the other model
answers after it. Then the property: any schema of tests/hostile_schemas.py (chains, cycles, mutual recursion,
shared trees, wide lists, nesting) is answered 200 or 400 within the deadline, the process is the same one,
and the second model on the worker answers after each. /metrics counts the refusals by the bound passed."""
from __future__ import annotations

import os
import time

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hostile_schemas import chain, schemas
from worker_support import (  # noqa: F401  (fixtures are used by name)
    WorkerProcess, config_document, model_entry, tiny_models, with_tools_template,
)

pytestmark = pytest.mark.slow  # a worker process
EXAMPLES = int(os.environ.get("GPUSHARE_FUZZ_EXAMPLES", "25"))
DEADLINE_S = 30  # a compile is bounded well within it (worker.grammar.COMPILE_DEADLINE_S is 10 s)
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def worker(tiny_models, tmp_path_factory):  # noqa: F811
    directory = tmp_path_factory.mktemp("hostile-schemas")
    models = [model_entry("grammar", with_tools_template(tiny_models["llama"], directory), "resident", context=256),
              model_entry("other", tiny_models["qwen2"], "resident", context=256)]
    with WorkerProcess(directory, config_document(models)) as process:
        yield process


@pytest.fixture(scope="module")
def client(worker):
    return openai.OpenAI(base_url=f"{worker.base_url}/v1", api_key="unused", max_retries=0, timeout=DEADLINE_S)


def _as(where: str, schema: dict) -> dict:
    if where == "response_format":
        return {"response_format": {"type": "json_schema", "json_schema": {"name": "hostile", "schema": schema}}}
    return {"tools": [{"type": "function", "function": {"name": "call", "parameters": schema}}],
            "tool_choice": "required"}


def _ask(client, where: str, schema: dict) -> tuple[int, str]:
    """(status, code) of one structured request to the model "grammar"."""
    try:
        client.chat.completions.create(model="grammar", messages=USER, max_tokens=4, temperature=0,
                                       **_as(where, schema))
        return 200, ""
    except openai.APIStatusError as error:
        return error.status_code, str(error.code)


def _the_worker_serves_on(worker, client) -> None:
    assert worker.process.poll() is None, f"the worker exited with {worker.process.returncode}"
    reply = client.chat.completions.create(model="other", messages=USER, max_tokens=2, temperature=0)
    assert reply.usage.completion_tokens == 2


@pytest.mark.parametrize("where,link,param", [
    ("response_format", "property", "response_format"),  # issue 34's request
    ("response_format", "ref", "response_format"),
    ("tools", "property", "tools[0].function.parameters"),
    ("tools", "anyof", "tools[0].function.parameters"),
])
def test_a_chain_of_a_thousand_definitions_is_a_400_and_the_worker_serves_on(worker, client, where, link, param):
    pid = worker.process.pid
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="grammar", messages=USER, max_tokens=4, **_as(where, chain(1000, link)))
    assert (refused.value.code, refused.value.param) == ("UnsupportedSchema", param)
    assert "levels deep once its $refs are followed (at most 256)" in refused.value.message
    assert "#/$defs/d0" in refused.value.message  # where the deepest path runs
    _the_worker_serves_on(worker, client)
    assert worker.process.pid == pid


def test_a_chain_of_a_hundred_is_still_answered(worker, client):
    assert _ask(client, "response_format", chain(100, "property")) == (200, "")


@settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize="GPUSHARE_FUZZ_EXAMPLES" not in os.environ,
          suppress_health_check=list(HealthCheck))
@given(schema=schemas(), where=st.sampled_from(["response_format", "tools"]))
def test_any_hostile_schema_is_answered_200_or_400_in_time_and_the_other_model_answers(worker, client, schema,
                                                                                          where):
    started = time.monotonic()
    status, code = _ask(client, where, schema)
    elapsed = time.monotonic() - started
    assert status == 200 or (status, code) in ((400, "UnsupportedSchema"), (400, "JSONTooDeep")), (status, code)
    assert elapsed < DEADLINE_S, f"{elapsed:.1f} s"
    _the_worker_serves_on(worker, client)


def test_refused_schemas_are_counted_by_the_bound_they_passed(worker, client):
    for _ in range(2):  # the second is answered from the kept refusal, without compiling
        assert _ask(client, "response_format", chain(400, "items")) == (400, "UnsupportedSchema")
    metrics = httpx.get(f"{worker.base_url}/metrics", timeout=10).text
    assert _sample(metrics, 'gpushare_worker_grammar_refusals_total{limit="depth",model="grammar"}') >= 2
    assert _sample(metrics, 'gpushare_worker_grammar_lookups_total{model="grammar",result="kept"}') >= 1
    assert _sample(metrics, 'gpushare_worker_grammar_compile_seconds_count{model="grammar"}') >= 1


def _sample(text: str, series: str) -> float:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{series} is not in /metrics")
