"""worker.protocol and the body decoding in worker.api: what each OpenAI field becomes, and that every
malformed body, whatever its shape, is an InvalidRequest naming the field (never another exception)."""
from __future__ import annotations

import pytest

from worker.api import MAX_JSON_DEPTH, decode_json
from worker.errors import InvalidRequest
from worker.protocol import Structure, parse_chat, parse_completion
from engine.sampling import SamplingParams
from hostile import CHAT_FIELDS, COMPLETION_FIELDS, HOSTILE, MESSAGE_FIELDS

COMPLETION = {"model": "m", "prompt": "hi"}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}
CLOCK = {"type": "function", "function": {"name": "clock"}}



@pytest.mark.parametrize("field", COMPLETION_FIELDS)
def test_any_value_of_any_completion_field_parses_or_is_invalid_request(field):
    for value in HOSTILE:
        _parses_or_names_a_field(parse_completion, {**COMPLETION, field: value}, field)


@pytest.mark.parametrize("field", CHAT_FIELDS)
def test_any_value_of_any_chat_field_parses_or_is_invalid_request(field):
    for value in HOSTILE:
        _parses_or_names_a_field(parse_chat, {**CHAT, field: value}, field)


@pytest.mark.parametrize("field", MESSAGE_FIELDS)
def test_any_value_of_any_message_field_parses_or_is_invalid_request(field):
    for value in HOSTILE:
        message = {"role": "assistant", "content": "a", field: value}
        _parses_or_names_a_field(parse_chat, {**CHAT, "messages": [CHAT["messages"][0], message]}, "messages[1]")


@pytest.mark.parametrize("body", [None, [], "text", 5, [CHAT], {"": 1}], ids=repr)
def test_a_body_that_is_not_an_object_of_fields_is_invalid(body):
    for parse in (parse_completion, parse_chat):
        with pytest.raises(InvalidRequest):
            parse(body)


def _parses_or_names_a_field(parse, body: dict, field: str) -> None:
    try:
        parse(body)
    except InvalidRequest as error:
        assert error.status == 400 and error.reason[0].isupper() and error.message
        assert error.param is None or error.param.startswith(field) or field == "stream" or error.param in body, (
            field, body.get(field), error.param)


@pytest.mark.parametrize("case,body,param,reason", [
    ("n-zero", {**COMPLETION, "n": 0}, "n", "InvalidField"),
    ("n-negative", {**COMPLETION, "n": -3}, "n", "InvalidField"),
    ("n-boolean", {**COMPLETION, "n": True}, "n", "InvalidField"),
    ("seed-over-64-bits", {**COMPLETION, "seed": 2 ** 64}, "seed", "InvalidField"),
    ("seed-under-64-bits", {**COMPLETION, "seed": -(2 ** 63) - 1}, "seed", "InvalidField"),
    ("seed-float", {**COMPLETION, "seed": 1.5}, "seed", "InvalidField"),
    ("stop-number", {**COMPLETION, "stop": 5}, "stop", "InvalidField"),
    ("stop-object", {**COMPLETION, "stop": {"a": 1}}, "stop", "InvalidField"),
    ("stop-list-of-numbers", {**COMPLETION, "stop": [1, 2]}, "stop", "InvalidField"),
    ("stop-five-strings", {**COMPLETION, "stop": list("abcde")}, "stop", "InvalidField"),
    ("stop-empty-string", {**COMPLETION, "stop": ""}, "stop", "InvalidField"),
    ("top-k-below-minus-one", {**COMPLETION, "top_k": -2}, "top_k", "InvalidField"),
    ("presence-over-two", {**COMPLETION, "presence_penalty": 2.5}, "presence_penalty", "InvalidField"),
    ("frequency-text", {**COMPLETION, "frequency_penalty": "1"}, "frequency_penalty", "InvalidField"),
    ("logit-bias-list", {**COMPLETION, "logit_bias": [1]}, "logit_bias", "InvalidField"),
    ("logit-bias-key-not-a-number", {**COMPLETION, "logit_bias": {"abc": 1}}, "logit_bias", "InvalidField"),
    ("logit-bias-over-100", {**COMPLETION, "logit_bias": {"5": 101}}, "logit_bias", "InvalidField"),
    ("logit-bias-too-many", {**COMPLETION, "logit_bias": {str(i): 1 for i in range(1025)}}, "logit_bias",
     "InvalidField"),
    ("model-name-longer-than-a-kubernetes-name", {**COMPLETION, "model": "m" * 254}, "model", "InvalidField"),
    ("logit-bias-boolean", {**COMPLETION, "logit_bias": {"5": True}}, "logit_bias", "InvalidField"),
    ("completion-logprobs-over-20", {**COMPLETION, "logprobs": 21}, "logprobs", "InvalidField"),
    ("completion-logprobs-boolean", {**COMPLETION, "logprobs": True}, "logprobs", "InvalidField"),
    ("echo", {**COMPLETION, "echo": True}, "echo", "UnsupportedField"),
    ("suffix", {**COMPLETION, "suffix": "x"}, "suffix", "UnsupportedField"),
    ("best-of-above-n", {**COMPLETION, "best_of": 3}, "best_of", "UnsupportedField"),
    ("two-prompts", {**COMPLETION, "prompt": ["a", "b"]}, "prompt", "InvalidField"),
    ("token-id-not-an-integer", {**COMPLETION, "prompt": [1, 2.5]}, "prompt", "InvalidField"),
    ("unknown-field", {**COMPLETION, "repetition_penalty": 1.1}, "repetition_penalty", "UnsupportedField"),
    ("chat-logprobs-number", {**CHAT, "logprobs": 3}, "logprobs", "InvalidField"),
    ("top-logprobs-without-logprobs", {**CHAT, "top_logprobs": 2}, "top_logprobs", "InvalidField"),
    ("top-logprobs-over-20", {**CHAT, "logprobs": True, "top_logprobs": 21}, "top_logprobs", "InvalidField"),
    ("json-schema-schema-not-object", {**CHAT, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": "object"}}}, "response_format", "InvalidField"),
    ("response-format-unknown-type", {**CHAT, "response_format": {"type": "yaml"}}, "response_format",
     "InvalidField"),
    ("response-format-string", {**CHAT, "response_format": "text"}, "response_format", "InvalidField"),
    ("tool-choice-required-without-tools", {**CHAT, "tool_choice": "required"}, "tool_choice", "InvalidField"),
    ("tool-choice-names-an-unknown-function", {**CHAT, "tools": [WEATHER], "tool_choice": {
        "type": "function", "function": {"name": "f"}}}, "tool_choice", "UnknownTool"),
    ("tool-choice-unknown-word", {**CHAT, "tools": [WEATHER], "tool_choice": "any"}, "tool_choice", "InvalidField"),
    ("tool-choice-without-name", {**CHAT, "tools": [WEATHER], "tool_choice": {"type": "function"}}, "tool_choice",
     "InvalidField"),
    ("json-and-a-forced-call", {**CHAT, "tools": [WEATHER], "tool_choice": "required",
                                "response_format": {"type": "json_object"}}, "response_format",
     "ConflictingConstraints"),
    ("parallel-tool-calls-not-bool", {**CHAT, "tools": [WEATHER], "parallel_tool_calls": "no"},
     "parallel_tool_calls", "InvalidField"),
    ("parallel-tool-calls-not-bool-without-tools", {**CHAT, "parallel_tool_calls": 0}, "parallel_tool_calls",
     "InvalidField"),
    ("min-tokens-negative", {**CHAT, "min_tokens": -1}, "min_tokens", "InvalidField"),
    ("min-tokens-over-max-tokens", {**CHAT, "max_tokens": 2, "min_tokens": 3}, "min_tokens", "InvalidField"),
    ("stop-token-ids-not-a-list", {**COMPLETION, "stop_token_ids": 7}, "stop_token_ids", "InvalidField"),
    ("stop-token-ids-strings", {**COMPLETION, "stop_token_ids": ["7"]}, "stop_token_ids", "InvalidField"),
    ("ignore-eos-not-bool", {**COMPLETION, "ignore_eos": 1}, "ignore_eos", "InvalidField"),
    ("tools-not-functions", {**CHAT, "tools": [{"type": "retrieval"}]}, "tools", "InvalidField"),
    ("functions-deprecated", {**CHAT, "functions": [{"name": "f"}]}, "functions", "UnsupportedField"),
    ("image-part", {**CHAT, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "messages[0].content", "InvalidField"),
    ("message-audio", {**CHAT, "messages": [{"role": "user", "content": "a", "audio": {"id": "x"}}]},
     "messages[0].audio", "UnsupportedField"),
    ("tool-call-arguments-object", {**CHAT, "messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "f", "arguments": {}}}]}]},
     "messages[0].tool_calls[0]", "InvalidField"),
    ("stream-options-not-object", {**CHAT, "stream": True, "stream_options": ["include_usage"]}, "stream_options",
     "InvalidField"),
])
def test_client_mistakes_name_the_field(case, body, param, reason):
    parse = parse_chat if "messages" in body else parse_completion
    with pytest.raises(InvalidRequest) as error:
        parse(body)
    assert (error.value.param, error.value.reason) == (param, reason), case


def test_supported_fields_reach_the_sampling_parameters():
    parsed = parse_completion({**COMPLETION, "n": 3, "seed": -1, "top_k": 5, "presence_penalty": 0.5,
                               "frequency_penalty": -1, "logit_bias": {"7": -100, "3": 2}, "logprobs": 2,
                               "stop": "\n", "best_of": 3})
    assert parsed.n == 3
    kwargs = [parsed.sampling.as_kwargs(i) for i in range(3)]
    assert [k["seed"] for k in kwargs] == [(1 << 64) - 1, 0, 1]  # one seed per choice, wrapped into 64 bits
    assert kwargs[0] | {"seed": None} == {"temperature": 1.0, "top_p": 1.0, "seed": None, "stop": ("\n",), "top_k": 5,
                                          "presence_penalty": 0.5, "frequency_penalty": -1.0,
                                          "logit_bias": ((3, 2.0), (7, -100.0)), "logprobs": 2,
                                          "ignore_eos": False, "min_tokens": 0, "stop_token_ids": ()}
    assert SamplingParams(max_tokens=4, **kwargs[1]).seed == 0  # the fields are the sampler's, one for one


@pytest.mark.parametrize("case,extra,logprobs", [
    ("logprobs-off", {}, None),
    ("logprobs-false-with-nothing-else", {"logprobs": False}, None),
    ("logprobs-only", {"logprobs": True}, 0),
    ("top-logprobs", {"logprobs": True, "top_logprobs": 4}, 4),
])
def test_chat_logprobs_become_the_number_of_alternatives(case, extra, logprobs):
    assert parse_chat({**CHAT, **extra}).sampling.logprobs == logprobs, case


def test_chat_accepts_text_format_tools_and_a_tool_conversation():
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    parsed = parse_chat({**CHAT, "response_format": {"type": "text"}, "tools": tools, "tool_choice": "auto",
                         "messages": [{"role": "user", "content": "rain?"},
                                      {"role": "assistant", "content": None, "tool_calls": [
                                          {"id": "c1", "type": "function",
                                           "function": {"name": "weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
                                      {"role": "tool", "tool_call_id": "c1", "content": "rain"}]})
    assert parsed.tools == tools
    assert parsed.messages[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo"}
    assert parsed.messages[2] == {"role": "tool", "tool_call_id": "c1", "content": "rain"}
    assert parse_chat({**CHAT, "tools": tools, "tool_choice": "none"}).tools is None


@pytest.mark.parametrize("case,raw,reason", [
    ("not-json", b"{nope", "InvalidJSON"),
    ("nan", b'{"temperature": NaN}', "InvalidJSON"),
    ("infinity", b'{"temperature": -Infinity}', "InvalidJSON"),
    ("not-utf8", b'{"prompt": "\xff\xfe"}', "InvalidJSON"),
    ("lone-surrogate", b'{"prompt": "\\ud800"}', "InvalidJSON"),
    ("lone-surrogate-in-a-key", b'{"\\udfff": 1}', "InvalidJSON"),
    ("huge-integer", b'{"seed": ' + b"9" * 5000 + b"}", "InvalidJSON"),
    ("nested-100000-arrays", b"[" * 100_000 + b"]" * 100_000, "JSONTooDeep"),
    ("nested-100000-objects", b'{"a":' * 100_000 + b"1" + b"}" * 100_000, "JSONTooDeep"),
    ("nested-one-past-the-limit", b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1), "JSONTooDeep"),
    ("deep-inside-a-field", b'{"messages": ' + b"[" * 500 + b"]" * 500 + b"}", "JSONTooDeep"),
])
def test_bodies_that_are_not_acceptable_json(case, raw, reason):
    with pytest.raises(InvalidRequest) as error:
        decode_json(raw)
    assert error.value.reason == reason and error.value.status == 400, case


def test_json_at_the_depth_limit_decodes():
    raw = b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH
    assert decode_json(raw) is not None
    assert decode_json('{"prompt": "héllo ☃"}'.encode()) == {"prompt": "héllo ☃"}


@pytest.mark.parametrize("case,extra,structure", [
    ("text", {"response_format": {"type": "text"}}, None),
    ("json-object-is-any-object", {"response_format": {"type": "json_object"}}, Structure(schema={"type": "object"})),
    ("json-schema", {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "integer"}, "strict": True}}}, Structure(schema={"type": "integer"})),
    ("json-schema-without-schema-is-any-json", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x"}}}, Structure(schema={})),
    ("tools-default-auto", {"tools": [WEATHER]}, Structure(tools=(WEATHER,))),
    ("required", {"tools": [WEATHER, CLOCK], "tool_choice": "required"},
     Structure(tools=(WEATHER, CLOCK), tool_choice="required")),
    ("named", {"tools": [WEATHER, CLOCK], "tool_choice": {"type": "function", "function": {"name": "clock"}}},
     Structure(tools=(WEATHER, CLOCK), tool_choice="clock")),
    ("one-call-at-most", {"tools": [WEATHER], "parallel_tool_calls": False}, Structure(tools=(WEATHER,),
                                                                                        parallel=False)),
    ("none-renders-no-tools", {"tools": [WEATHER], "tool_choice": "none"}, None),
    ("json-wins-over-auto", {"tools": [WEATHER], "response_format": {"type": "json_object"}},
     Structure(schema={"type": "object"})),
])
def test_response_format_and_tool_choice_become_the_structure_to_enforce(case, extra, structure):
    assert parse_chat({**CHAT, **extra}).structure == structure, case


def test_vllm_extras_reach_the_sampling_parameters():
    parsed = parse_completion({**COMPLETION, "max_tokens": 8, "ignore_eos": True, "min_tokens": 8,
                               "stop_token_ids": [3, 5]})
    assert SamplingParams(max_tokens=8, **parsed.sampling.as_kwargs()) == SamplingParams(
        max_tokens=8, ignore_eos=True, min_tokens=8, stop_token_ids=(3, 5))
