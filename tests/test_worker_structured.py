"""Structured output and tool calls through the official `openai` client against a real CPU worker on
127.0.0.1, with random-weight tiny models (byte-level BPE tokenizers the grammar library reads): JSON
modes parse and match their schema, tool calls parse and name an offered function (whole and streamed
as OpenAI streams them), a schema keyword the grammar library lacks is a 400 naming it, and vLLM's
ignore_eos / min_tokens / stop_token_ids act. Units: the device mask, the tool-call parser, the grammars."""
from __future__ import annotations

import json

import jsonschema
import openai
import pytest
import torch
from transformers import AutoModelForCausalLM

from tinymodels import byte_tokenizer
from worker.api import create_app
from worker.grammar import Grammars
from worker.prompts import PromptEncoder
from worker.protocol import Structure
from engine.sampling import mask_logits
from worker.scheduler import FinishEvent
from worker.tools import ToolCallParser, ToolCallShape
from worker_support import (  # noqa: F401  (fixtures are used by name)
    ServerThread, config_document, model_entry, single_threaded_torch, started_worker, tiny_models,
    with_tools_template,
)

EOS = 256  # the tiny models' end-of-text token
# Every value bounded, so any sampling ends well inside max_tokens (byte tokens: <= 4 per character).
RECORD = {"type": "object", "additionalProperties": False, "required": ["kind", "count", "ok", "tag", "ids"],
          "properties": {"kind": {"enum": ["a", "b"]}, "count": {"type": "integer", "minimum": 0, "maximum": 999},
                         "ok": {"type": "boolean"}, "tag": {"type": "string", "maxLength": 6},
                         "ids": {"type": "array", "maxItems": 3, "items": {"type": "integer", "minimum": 0,
                                                                           "maximum": 9}}}}
CITY = {"type": "object", "additionalProperties": False, "required": ["city"],
        "properties": {"city": {"type": "string", "maxLength": 8}}}
HOUR = {"type": "object", "additionalProperties": False, "required": ["h"],
        "properties": {"h": {"type": "integer", "minimum": 0, "maximum": 23}}}
TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": CITY}},
         {"type": "function", "function": {"name": "clock", "parameters": HOUR}}]
PARAMETERS = {"weather": CITY, "clock": HOUR}
USER = [{"role": "user", "content": "Rain in Oslo?"}]


@pytest.fixture(scope="module")
def tools_model(tiny_models, tmp_path_factory):
    return with_tools_template(tiny_models["llama"], tmp_path_factory.mktemp("structured"))


@pytest.fixture(scope="module")
def client(tiny_models, tools_model):
    models = [model_entry("m", tiny_models["qwen2"], "resident", context=512, concurrency=4),
              model_entry("tools-m", tools_model, "resident", context=512, concurrency=4)]
    worker = started_worker(config_document(models))
    with ServerThread(create_app(worker)) as thread:
        yield openai.OpenAI(base_url=f"{thread.base_url}/v1", api_key="unused", max_retries=0)
    worker.stop()


# response_format
@pytest.mark.parametrize("case,sampling", [
    ("greedy", {"temperature": 0}), ("seeded-hot", {"temperature": 1.0, "seed": 7, "n": 3}),
    ("top-p-penalised", {"temperature": 1.5, "top_p": 0.9, "seed": 3, "frequency_penalty": 1.0}),
])
def test_json_schema_answers_parse_and_match_the_schema(client, case, sampling):
    reply = client.chat.completions.create(
        model="m", messages=USER, max_tokens=200, **sampling,
        response_format={"type": "json_schema", "json_schema": {"name": "record", "schema": RECORD, "strict": True}})
    for choice in reply.choices:
        assert choice.finish_reason == "stop", (case, choice.message.content)
        jsonschema.validate(json.loads(choice.message.content), RECORD)
        assert "  " not in choice.message.content and "\n" not in choice.message.content, case  # bounded space


def test_a_streamed_json_schema_answer_parses_whole(client):
    stream = client.chat.completions.create(
        model="m", messages=USER, max_tokens=200, temperature=1.0, seed=11, stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "record", "schema": RECORD}})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(text), RECORD)


def test_json_object_is_an_object_even_where_the_model_prefers_to_close_it_first(client):
    close = byte_tokenizer().encode("}")[0]  # without the grammar this token would come first and end nothing
    reply = client.chat.completions.create(model="m", messages=USER, max_tokens=50, temperature=0,
                                           response_format={"type": "json_object"}, logit_bias={str(close): 100})
    assert reply.choices[0].message.content == "{}" and reply.choices[0].finish_reason == "stop"


def test_max_tokens_inside_the_structure_ends_with_length_as_openai(client):
    schema = {"type": "object", "properties": {"text": {"type": "string", "maxLength": 40}}, "required": ["text"]}
    reply = client.chat.completions.create(model="m", messages=USER, max_tokens=4, temperature=0,
                                           response_format={"type": "json_schema",
                                                            "json_schema": {"name": "t", "schema": schema}})
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 4
    assert reply.choices[0].message.content.startswith('{"')


@pytest.mark.parametrize("case,extra,param,keyword", [
    ("not-in-response-format", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"not": {"type": "string"}}}}}, "response_format", "not"),
    ("a-ref-to-itself-admits-nothing", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"$defs": {"x": {"$ref": "#/$defs/x"}}, "$ref": "#/$defs/x"}}}}, "response_format",
     "admits no value"),
    ("contradicting-types", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"allOf": [{"type": "string"}, {"type": "integer"}]}}}}, "response_format",
     "incompatible types"),
    ("dependent-schemas-in-tool", {"tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "dependentSchemas": {"a": {}}}}}],
        "tool_choice": "required"}, "tools", "dependentSchemas"),
])
def test_a_schema_keyword_the_grammar_cannot_enforce_is_a_400_naming_it(client, case, extra, param, keyword):
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model="tools-m", messages=USER, max_tokens=5, **extra)
    assert (error.value.code, error.value.param) == ("UnsupportedSchema", param), case
    assert keyword in error.value.message, case


# tools
def _check_call(call, offered=("weather", "clock")):
    assert call.type == "function" and call.id.startswith("call_") and call.function.name in offered
    jsonschema.validate(json.loads(call.function.arguments), PARAMETERS[call.function.name])


@pytest.mark.parametrize("case,choice,offered", [
    ("named-weather", {"type": "function", "function": {"name": "weather"}}, ("weather",)),
    ("named-clock", {"type": "function", "function": {"name": "clock"}}, ("clock",)),
    ("required", "required", ("weather", "clock")),
])
def test_forced_tool_calls_parse_and_name_an_offered_function(client, case, choice, offered):
    reply = client.chat.completions.create(model="tools-m", messages=USER, max_tokens=200, tools=TOOLS,
                                           tool_choice=choice, parallel_tool_calls=False, temperature=1.0, seed=5,
                                           n=2)
    for answer in reply.choices:
        assert answer.finish_reason == "tool_calls", case
        assert answer.message.content is None and len(answer.message.tool_calls) == 1, case
        _check_call(answer.message.tool_calls[0], offered)


def test_tool_calls_stream_as_openai_deltas(client):
    stream = client.chat.completions.create(model="tools-m", messages=USER, max_tokens=200, tools=TOOLS,
                                            tool_choice={"type": "function", "function": {"name": "weather"}},
                                            temperature=0, stream=True)
    deltas = [c.choices[0].delta for c in stream if c.choices]
    calls = [d.tool_calls[0] for d in deltas if d.tool_calls]
    first, rest = calls[0], calls[1:]
    assert (first.index, first.type, first.function.name, first.function.arguments) == (0, "function", "weather", "")
    assert first.id.startswith("call_") and rest and all(c.id is None and c.function.name is None for c in rest)
    arguments = "".join(c.function.arguments for c in rest)
    jsonschema.validate(json.loads(arguments), CITY)
    whole = client.chat.completions.create(model="tools-m", messages=USER, max_tokens=200, tools=TOOLS,
                                           tool_choice={"type": "function", "function": {"name": "weather"}},
                                           temperature=0)
    assert whole.choices[0].message.tool_calls[0].function.arguments == arguments  # same tokens, same call


def test_auto_without_a_call_is_plain_text(client):
    reply = client.chat.completions.create(model="tools-m", messages=USER, max_tokens=8, tools=TOOLS,
                                           temperature=0)
    assert reply.choices[0].message.tool_calls is None and reply.choices[0].finish_reason in ("stop", "length")
    plain = client.chat.completions.create(model="tools-m", messages=USER, max_tokens=8, temperature=0,
                                           extra_body={"tools": TOOLS, "tool_choice": "none"})
    assert plain.choices[0].message.tool_calls is None


# vLLM's sampling extras
def test_stop_token_ids_end_the_answer_before_that_token(client, tiny_models):
    model = AutoModelForCausalLM.from_pretrained(tiny_models["qwen2"], local_files_only=True, dtype=torch.float32)
    prompt = byte_tokenizer().encode("ab")
    greedy = model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False)[0, len(prompt):].tolist()
    third = greedy[2]
    stopped = client.completions.create(model="m", prompt=prompt, max_tokens=6, temperature=0,
                                        extra_body={"stop_token_ids": [third]})
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.usage.completion_tokens == greedy.index(third)  # the stop token is not part of the answer


@pytest.mark.parametrize("case,extra,tokens,finish", [
    ("eos-first", {}, 0, "stop"),
    ("min-tokens-hold-eos-back", {"min_tokens": 5}, 5, "stop"),
    ("min-tokens-hold-stop-ids-back", {"min_tokens": 3, "stop_token_ids": [65]}, 3, "stop"),
    ("ignore-eos-runs-to-max-tokens", {"ignore_eos": True}, 6, "length"),
])
def test_eos_min_tokens_and_ignore_eos_act_as_vllm(client, case, extra, tokens, finish):
    reply = client.completions.create(model="m", prompt="ab", max_tokens=6, temperature=0,
                                      logit_bias={str(EOS): 100, "65": 50}, extra_body=extra)
    assert (reply.usage.completion_tokens, reply.choices[0].finish_reason) == (tokens, finish), case


@pytest.mark.parametrize("case,extra,param,code", [
    ("stop-token-outside-vocab", {"stop_token_ids": [10 ** 6]}, "stop_token_ids", "TokenOutOfVocabulary"),
    ("min-tokens-over-max", {"min_tokens": 9}, "min_tokens", "InvalidField"),
    ("ignore-eos-not-bool", {"ignore_eos": "yes"}, "ignore_eos", "InvalidField"),
])
def test_extras_out_of_range_are_400s_naming_them(client, case, extra, param, code):
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(model="m", prompt="ab", max_tokens=6, extra_body=extra)
    assert (error.value.param, error.value.code) == (param, code), case


# units
@pytest.mark.parametrize("case,shape,vocab", [("row", (), 70), ("batch", (3,), 64), ("ragged-tail", (2,), 40)])
def test_mask_logits_unpacks_the_library_bit_layout_on_the_logits_device(case, shape, vocab):
    generator = torch.Generator().manual_seed(1)
    words = torch.randint(-(1 << 31), 1 << 31, (*shape, 2), dtype=torch.int64, generator=generator).to(torch.int32)
    logits = torch.randn((*shape, vocab), generator=generator)
    masked = mask_logits(logits, words, banned=(3,))
    flat_words, flat_logits, flat_masked = words.reshape(-1, 2), logits.reshape(-1, vocab), masked.reshape(-1, vocab)
    for row in range(flat_words.shape[0]):
        for token in range(vocab):
            bit = token < 64 and (int(flat_words[row, token // 32]) >> (token % 32)) & 1 and token != 3
            expected = flat_logits[row, token] if bit else float("-inf")
            assert flat_masked[row, token] == expected, (case, row, token)


def test_banned_tokens_never_empty_a_row_the_grammar_leaves_them_alone_in():
    only_eos = torch.zeros(2, 9, dtype=torch.int32)
    only_eos[0, EOS // 32] = 1 << (EOS % 32)  # row 0: the grammar allows end-of-text only
    only_eos[1, 0] = 0b11  # row 1: tokens 0 and 1
    masked = mask_logits(torch.zeros(2, 258), only_eos, banned=(EOS, 1))
    assert [torch.isfinite(row).nonzero().flatten().tolist() for row in masked] == [[EOS], [0]]


TEXT = ('Let me see.\n<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "clock", "arguments": {"h": 7}}\n</tool_call>')


@pytest.mark.parametrize("case,text,content,calls", [
    ("content-then-two-calls", TEXT, "Let me see.", [("weather", '{"city": "Oslo"}'), ("clock", '{"h": 7}')]),
    ("text-only", "a <tool b", "a <tool b", []),
    ("unfinished-head-is-content", "x<tool_call>\n{\"na", "x<tool_call>\n{\"na", []),
    ("cut-in-the-arguments", '<tool_call>\n{"name": "f", "arguments": {"a": ', "", [("f", '{"a": ')]),
    ("braces-and-tags-inside-strings", '<tool_call>\n{"name": "f", "arguments": {"s": "}</tool_call>"}}\n'
     '</tool_call>', "", [("f", '{"s": "}</tool_call>"}')]),
])
@pytest.mark.parametrize("step", [1, 2, 5, 1000])
def test_tool_call_parser_streams_the_same_calls_at_any_chunking(case, text, content, calls, step):
    parser, shown, arguments, heads = ToolCallParser(), "", {}, []
    pieces = [parser.feed(text[i:i + step]) for i in range(0, len(text), step)] + [parser.close()]
    for piece, deltas in pieces:
        shown += piece
        for delta in deltas:
            if "id" in delta:
                heads.append((delta["index"], delta["function"]["name"], delta["function"]["arguments"]))
            else:
                arguments[delta["index"]] = arguments.get(delta["index"], "") + delta["function"]["arguments"]
    assert shown == content == parser.content, (case, step)
    assert heads == [(i, name, "") for i, (name, _) in enumerate(calls)], (case, step)
    assert [arguments.get(i, "") for i in range(len(calls))] == [a for _, a in calls], (case, step)
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in parser.calls] == calls, (case, step)


def test_an_auto_answer_with_text_and_a_call_streams_and_ends_as_openai():
    pieces = ["Hm, ", "let me look.\n<tool", '_call>\n{"name": "weather", "arguments": {"ci',
              'ty": "Oslo"}}\n</tool_call>']
    shape = ToolCallShape("m", lambda ids: [], False)
    chunks = [shape.chunk(0, text, (), None, i == 0)["choices"][0] for i, text in enumerate(pieces)]
    chunks.append(shape.chunk(0, "", (), "stop", False)["choices"][0])
    assert chunks[0]["delta"] == {"role": "assistant", "content": "Hm,"}
    assert "".join(c["delta"].get("content", "") for c in chunks) == "Hm, let me look."
    calls = [call for c in chunks for call in c["delta"].get("tool_calls", [])]
    assert calls[0]["function"] == {"name": "weather", "arguments": ""} and calls[0]["type"] == "function"
    assert json.loads("".join(call["function"]["arguments"] for call in calls)) == {"city": "Oslo"}
    assert [c["finish_reason"] for c in chunks] == [None] * len(pieces) + ["tool_calls"]
    whole = shape.final({0: "".join(pieces)}, {0: []}, {0: FinishEvent("stop", 3, 9)})["choices"][0]
    assert whole["finish_reason"] == "tool_calls" and whole["message"]["content"] == "Hm, let me look."
    assert json.loads(whole["message"]["tool_calls"][0]["function"]["arguments"]) == {"city": "Oslo"}


def _grammars(vocab: int = 258):
    tokenizer = byte_tokenizer()
    return tokenizer, Grammars(PromptEncoder(tokenizer, "t", vocab), vocab, frozenset({EOS}))


def _allowed(constraint) -> set[int]:
    words = constraint.bitmask()
    return {t for t in range(258) if (int(words[t // 32]) >> (t % 32)) & 1}


def test_auto_tool_choice_leaves_text_free_and_holds_an_opened_call_to_an_offered_function():
    tokenizer, grammars = _grammars()
    [constraint] = grammars.constraints(Structure(tools=tuple(TOOLS)), 1)
    assert set(range(128)) | {EOS} <= _allowed(constraint)  # free text (any UTF-8) or end-of-text
    for token in tokenizer.encode("Hm. <tool_call>"):
        assert token in _allowed(constraint)
        constraint.advance(token)
    assert _allowed(constraint) == set(tokenizer.encode("\n"))
    for token in tokenizer.encode('\n{"name": "'):
        constraint.advance(token)
    assert _allowed(constraint) == set(tokenizer.encode("wc"))  # weather or clock, nothing else
    for token in tokenizer.encode('clock", "arguments": {"h": 7}}\n</tool_call>'):
        assert token in _allowed(constraint)
        constraint.advance(token)
    assert not constraint.finished and EOS in _allowed(constraint)  # auto: text may follow the call


@pytest.mark.parametrize("case,vocab", [("padded-embeddings", 300), ("as-tokenizer", 258),
                                        ("embeddings-short-of-the-tokenizer", 250)])
def test_the_mask_fits_the_logits_whatever_the_tokenizer_holds(case, vocab):
    tokenizer, grammars = _grammars(vocab)
    [constraint] = grammars.constraints(Structure(schema={"type": "integer"}), 1)
    masked = mask_logits(torch.zeros(vocab), constraint.bitmask())
    assert masked.shape == (vocab,), case
    assert set(torch.isfinite(masked).nonzero().flatten().tolist()) == set(tokenizer.encode("-0123456789")), case


def test_a_grammar_broken_mid_answer_ends_it_with_end_of_text_instead_of_an_empty_row():
    tokenizer, grammars = _grammars()
    [constraint] = grammars.constraints(Structure(schema={"type": "integer"}), 1)
    constraint.advance(tokenizer.encode("x")[0])  # a token the grammar forbade (never sampled; a bug's shape)
    assert constraint.finished and _allowed(constraint) == {EOS}


def test_a_client_x_guidance_cannot_unbound_whitespace():
    tokenizer, grammars = _grammars()
    schema = {"type": "object", "x-guidance": {"whitespace_flexible": True}}
    [constraint] = grammars.constraints(Structure(schema=schema), 1)
    constraint.advance(tokenizer.encode("{")[0])
    assert not _allowed(constraint) & set(tokenizer.encode(" \n\t\r"))


@pytest.mark.gpu
def test_the_mask_lands_on_the_logits_device_and_the_grammar_holds_there():
    tokenizer, grammars = _grammars()
    [constraint] = grammars.constraints(Structure(schema=HOUR), 1)
    logits = torch.zeros(258, device="cuda")
    masked = mask_logits(logits, constraint.bitmask())
    assert masked.device == logits.device
    assert set(torch.isfinite(masked).nonzero().flatten().tolist()) == set(tokenizer.encode("{"))
