"""The OpenAI fields a new user reaches for, through the official `openai` client against a real worker on
127.0.0.1: n, logprobs/top_logprobs (chat and completions, streamed and whole), response_format text, tools
through the chat template (JSON modes and tool calls: test_worker_structured.py), top_k, presence/frequency
penalties, logit_bias, and SSE keep-alive comments while a first token is slow. Nothing is silently dropped: what is not supported is a 400 naming it."""
from __future__ import annotations

import json
import time

import httpx
import openai
import pytest
import torch
from transformers import AutoModelForCausalLM

from tinymodels import byte_tokenizer
from worker.api import create_app
from engine.batch import Generation
from engine.sampling import BatchSampler, SamplingParams
from worker_support import (  # noqa: F401  (fixtures are used by name)
    ServerThread, config_document, model_entry, single_threaded_torch, started_worker, tiny_models,
    with_tools_template,
)

WEATHER = {"type": "function", "function": {
    "name": "weather", "description": "the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
SWAP_RESIDENCY_MS = 1500  # how long `hot` and `cold` hold the device: the slow first token of the other
KEEPALIVE_MS = 50


@pytest.fixture(scope="module")
def tools_model(tiny_models, tmp_path_factory):
    """The tiny llama with a chat template that renders tools (as Qwen's and Llama 3's do)."""
    return with_tools_template(tiny_models["llama"], tmp_path_factory.mktemp("tools-model"))


@pytest.fixture(scope="module")
def server(tiny_models, tools_model):
    models = [model_entry("m", tiny_models["llama"], "resident"),
              model_entry("tools-m", tools_model, "resident"),
              model_entry("hot", tiny_models["qwen2"], "swap"),
              model_entry("cold", tiny_models["llama-b"], "swap")]
    document = config_document(models, min_residency_ms=SWAP_RESIDENCY_MS)
    document["server"]["sseKeepAliveMs"] = KEEPALIVE_MS
    worker = started_worker(document)
    with ServerThread(create_app(worker)) as thread:
        yield thread
    worker.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def reference(tiny_models):
    """Generates with the saved model and engine.sampling directly (no cache, no server): the tokens the
    worker must give for the same sampling fields."""
    model = AutoModelForCausalLM.from_pretrained(tiny_models["llama"], local_files_only=True, dtype=torch.float32)
    tokenizer = byte_tokenizer()

    @torch.inference_mode()
    def generate(prompt: str, max_tokens: int, **fields) -> tuple[str, list[torch.Tensor]]:
        ids = tokenizer.encode(prompt)
        sampler, rows = BatchSampler(), []
        sequence = Generation(prompt_ids=ids, params=SamplingParams(max_tokens=max_tokens, **fields),
                              eos_ids=frozenset(), decode=tokenizer.decode)
        for _ in range(max_tokens):
            rows.append(model(input_ids=torch.tensor([ids + sequence.output_ids])).logits[0, -1].float())
            sequence.output_ids.append(sampler.choose(rows[-1][None], [sequence])[0].token)
        return tokenizer.decode(sequence.output_ids, skip_special_tokens=True), rows

    return generate


# n
def test_n_completions_are_separate_sequences_counted_once_for_the_prompt(client):
    greedy = client.completions.create(model="m", prompt="Count", max_tokens=5, temperature=0, n=3)
    assert [c.index for c in greedy.choices] == [0, 1, 2]
    assert len({c.text for c in greedy.choices}) == 1  # greedy: every sequence takes the same path
    assert greedy.usage.completion_tokens == 15 and greedy.usage.prompt_tokens == len("Count")
    sampled = client.completions.create(model="m", prompt="Count", max_tokens=8, temperature=1.0, n=3, seed=42)
    assert len({c.text for c in sampled.choices}) > 1, "each choice gets its own seed"
    again = client.completions.create(model="m", prompt="Count", max_tokens=8, temperature=1.0, n=3, seed=42)
    assert [c.text for c in again.choices] == [c.text for c in sampled.choices]


def test_n_streamed_chat_interleaves_choices_that_equal_the_whole_answer(client):
    request = dict(model="m", messages=[{"role": "user", "content": "Go"}], max_tokens=6, temperature=0.9, seed=7, n=2)
    whole = client.chat.completions.create(**request)
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    chunks = list(client.chat.completions.create(**request, stream=True, stream_options={"include_usage": True}))
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    assert texts == {c.index: c.message.content for c in whole.choices}
    assert finishes == {0: "length", 1: "length"}
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens == 12


# logprobs
def test_completion_logprobs_are_the_models_own(client, reference):
    reply = client.completions.create(model="m", prompt="Tell", max_tokens=4, temperature=0, logprobs=3)
    text, rows = reference("Tell", 4, temperature=0)
    assert reply.choices[0].text == text
    logprobs = reply.choices[0].logprobs
    expected = [float(torch.log_softmax(row, -1).max()) for row in rows]
    assert logprobs.token_logprobs == pytest.approx(expected, abs=1e-4)  # greedy took the likeliest token
    assert len(logprobs.tokens) == 4 and logprobs.text_offset[0] == 0
    for chosen, top in zip(logprobs.token_logprobs, logprobs.top_logprobs):
        assert 1 <= len(top) <= 3 and max(top.values()) == pytest.approx(chosen, abs=1e-6)


def test_chat_logprobs_streamed_and_whole_agree_with_top_alternatives(client):
    request = dict(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=5, temperature=0,
                   logprobs=True, top_logprobs=2)
    whole = client.chat.completions.create(**request)
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens == 5
    for entry in content:
        assert [alt.logprob for alt in entry.top_logprobs] == sorted((a.logprob for a in entry.top_logprobs),
                                                                    reverse=True)
        assert len(entry.top_logprobs) == 2 and entry.logprob == pytest.approx(entry.top_logprobs[0].logprob)
        assert entry.bytes == list(entry.token.encode("utf-8")) and entry.logprob <= 0
    streamed = [e for chunk in client.chat.completions.create(**request, stream=True) for c in chunk.choices
                if c.logprobs for e in c.logprobs.content]
    assert [(e.token, round(e.logprob, 5)) for e in streamed] == [(e.token, round(e.logprob, 5)) for e in content]


def test_no_logprobs_unless_asked(client):
    assert client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                          max_tokens=2).choices[0].logprobs is None


# sampling fields
def test_top_k_one_samples_the_greedy_answer_at_any_seed(client, reference):
    greedy, _ = reference("Top", 6, temperature=0)
    for seed in (1, 2, 3):
        reply = client.completions.create(model="m", prompt="Top", max_tokens=6, temperature=1.5, seed=seed,
                                          extra_body={"top_k": 1})
        assert reply.choices[0].text == greedy


@pytest.mark.parametrize("fields", [
    {"presence_penalty": 2.0}, {"frequency_penalty": 1.5}, {"frequency_penalty": -2.0, "presence_penalty": 0.5},
], ids=["presence", "frequency", "negative-frequency-and-presence"])
def test_penalties_give_the_tokens_the_sampler_gives(client, reference, fields):
    text, _ = reference("Again and again", 12, temperature=0, **fields)
    plain, _ = reference("Again and again", 12, temperature=0)
    assert text != plain, "the penalty must change this answer, or the test proves nothing"
    reply = client.completions.create(model="m", prompt="Again and again", max_tokens=12, temperature=0, **fields)
    assert reply.choices[0].text == text


def test_logit_bias_forces_and_bans_tokens(client, reference):
    forced = client.completions.create(model="m", prompt="x", max_tokens=5, temperature=0, logit_bias={"65": 100})
    assert forced.choices[0].text == "AAAAA"  # byte tokenizer: id 65 is "A"
    _, rows = reference("x", 1, temperature=0)
    first = int(rows[0].argmax())
    banned = client.completions.create(model="m", prompt="x", max_tokens=1, temperature=0, logprobs=1,
                                       logit_bias={str(first): -100})
    text, _ = reference("x", 1, temperature=0, logit_bias=((first, -100.0),))
    assert banned.choices[0].text == text != byte_tokenizer().decode([first])


# response_format, tools, unknown fields
def test_response_format_text_is_accepted(client):
    assert client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=1,
                                          response_format={"type": "text"}).choices


def test_tools_reach_a_template_that_renders_them(client):
    messages = [{"role": "user", "content": "Rain in Oslo?"}]
    plain = client.chat.completions.create(model="tools-m", messages=messages, max_tokens=1)
    with_tools = client.chat.completions.create(model="tools-m", messages=messages, max_tokens=1, tools=[WEATHER])
    # byte tokenizer: one token per byte of the rendered prompt
    assert with_tools.usage.prompt_tokens - plain.usage.prompt_tokens == len("<|tools|>weather;\n")
    declined = client.chat.completions.create(model="tools-m", messages=messages, max_tokens=1, tools=[WEATHER],
                                              tool_choice="none")
    assert declined.usage.prompt_tokens == plain.usage.prompt_tokens


def test_a_tool_conversation_renders_calls_and_results(client):
    arguments = json.dumps({"city": "Oslo"})
    messages = [{"role": "user", "content": "Rain?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": arguments}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "rain"}]
    reply = client.chat.completions.create(model="tools-m", messages=messages, max_tokens=1, tools=[WEATHER])
    rendered = ("<|tools|>weather;\n<|user|>Rain?\n<|assistant|>[weather {\"city\": \"Oslo\"}]\n<|tool|>rain\n"
                "<|assistant|>")
    assert reply.usage.prompt_tokens == len(rendered)


def test_tools_for_a_template_without_them_is_a_clear_400(client):
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], tools=[WEATHER])
    assert error.value.code == "ToolsUnsupported" and "chat template" in error.value.message


@pytest.mark.parametrize("extra,param", [
    ({"repetition_penalty": 1.2}, "repetition_penalty"), ({"min_p": 0.1}, "min_p"), ({"echo": True}, "echo"),
])
def test_fields_the_worker_cannot_honour_are_named_not_dropped(client, extra, param):
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model="tools-m", messages=[{"role": "user", "content": "x"}], max_tokens=1,
                                       extra_body=extra)
    assert error.value.param == param and error.value.code == "UnsupportedField"


# SSE keep-alive
def test_a_slow_first_token_gets_keep_alive_comments_and_the_client_still_reads_the_answer(server, client):
    client.completions.create(model="hot", prompt="a", max_tokens=1)  # hot holds the device for its residency
    lines = []
    with httpx.stream("POST", server.base_url + "/v1/completions", timeout=30,
                      json={"model": "cold", "prompt": "b", "max_tokens": 3, "temperature": 0, "stream": True}) as r:
        lines = [line for line in r.iter_lines() if line]
    first_data = next(i for i, line in enumerate(lines) if line.startswith("data:"))
    assert first_data >= 2 and set(lines[:first_data]) == {": keep-alive"}, lines[:first_data + 1]
    assert lines[-1] == "data: [DONE]"
    # now hot waits for cold's residency: the official client skips the comments and reads the same answer
    request = dict(model="hot", prompt="same", max_tokens=4, temperature=0)
    streamed = "".join(c.choices[0].text for c in client.completions.create(**request, stream=True) if c.choices)
    assert streamed == client.completions.create(**request).choices[0].text


def test_a_client_that_gives_up_on_a_whole_answer_has_its_request_cancelled(server, client):
    def cancelled_requests() -> float:
        for line in httpx.get(server.base_url + "/metrics", timeout=10).text.splitlines():
            if line.startswith('gpushare_worker_requests_total{model="cold",outcome="cancelled"}'):
                return float(line.split()[-1])
        return 0.0

    before = cancelled_requests()
    client.completions.create(model="cold", prompt="a", max_tokens=1)
    client.completions.create(model="hot", prompt="a", max_tokens=1)  # swapped in now: cold waits its residency
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.base_url + "/v1/completions", timeout=0.3,
                   json={"model": "cold", "prompt": "never read", "max_tokens": 50})
    deadline = time.monotonic() + 3 * SWAP_RESIDENCY_MS / 1000
    while cancelled_requests() == before:
        assert time.monotonic() < deadline, "the abandoned request was not cancelled"
        time.sleep(0.05)


# stop strings
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_stop_string_ends_the_answer_before_it_and_counts_the_tokens_up_to_it(client, stream):
    """The stop string is two ASCII tokens of the greedy answer (matched across tokens): the answer is the text
    before it, finish_reason "stop", and usage counts the tokens up to and with the one that completed it; the
    tokens the model made after it are dropped."""
    plain = client.completions.create(model="m", prompt="Once upon a time", max_tokens=16, temperature=0, logprobs=0)
    text, tokens = plain.choices[0].text, plain.choices[0].logprobs.tokens
    assert "".join(tokens) == text, "each token of this answer decodes alone to its own text"
    last = next(k for k in range(2, len(tokens)) if all(len(t) == 1 and t.isascii() and t.isprintable()
                                                        for t in tokens[k - 1:k + 1])
                and text.find(tokens[k - 1] + tokens[k]) == len("".join(tokens[:k - 1])))
    stop, before = tokens[last - 1] + tokens[last], "".join(tokens[:last - 1])
    fields = dict(model="m", prompt="Once upon a time", max_tokens=16, temperature=0, stop=[stop])
    if stream:
        chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **fields))
        got = "".join(c.choices[0].text for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        usage = chunks[-1].usage
    else:
        reply = client.completions.create(**fields)
        got, finish, usage = reply.choices[0].text, reply.choices[0].finish_reason, reply.usage
    assert (got, finish, usage.completion_tokens) == (before, "stop", last + 1)
