"""OpenAI request bodies, parsed and checked: pure functions that name the bad field.

Owns which fields of /v1/completions and /v1/chat/completions the worker accepts,
their types, ranges and defaults. Nothing is silently dropped: a field the worker
does not know, or cannot honour at the value sent, is a 400 that names it.
api.py calls `parse_completion` / `parse_chat` on the decoded JSON body; checks that
need the model (token ids and logit_bias keys inside its vocabulary, `n` against the
queue) happen in api.py once the model is known. A problem raises InvalidRequest
with `param` set to the offending field.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from .errors import InvalidRequest
from .schemabound import check_tool_list

COMPLETION_DEFAULT_MAX_TOKENS = 16  # as OpenAI's legacy completions endpoint
MAX_LOGPROBS = 20  # top alternatives per token, as OpenAI's top_logprobs
MAX_LOGIT_BIAS = 1024  # biased tokens per request: each costs the engine work on every step
MAX_STOP_TOKEN_IDS = 1024  # stop_token_ids per request, bounded like logit_bias
MAX_MODEL_NAME = 253  # a Kubernetes object name, which the served names are
SEED_RANGE = (-(1 << 63), (1 << 64) - 1)  # what a 64-bit generator seed can hold
_TOKEN_KEY = re.compile(r"-?[0-9]+")  # a logit_bias key: one token id in decimal ("--5" is none)
_ROLES = {"system", "user", "assistant", "developer", "tool"}
# Accepted and without effect on a self-hosted worker (OpenAI account features).
_NO_EFFECT = {"user", "metadata", "store", "service_tier"}
# vLLM's extra sampling fields, which benchmark clients send
_VLLM_EXTRA = {"ignore_eos", "min_tokens", "stop_token_ids"}
_COMMON = {"model", "stream", "stream_options", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop",
           "n", "presence_penalty", "frequency_penalty", "logit_bias", *_NO_EFFECT, *_VLLM_EXTRA}
_COMPLETION_FIELDS = _COMMON | {"prompt", "logprobs", "echo", "suffix", "best_of"}
_CHAT_FIELDS = _COMMON | {"messages", "max_completion_tokens", "logprobs", "top_logprobs", "response_format",
                          "tools", "tool_choice", "parallel_tool_calls"}
_MESSAGE_FIELDS = {"role", "content", "name", "tool_calls", "tool_call_id", "refusal", "annotations"}


@dataclass(frozen=True)
class Sampling:
    """A request's completion limit (None: the model's default) and its engine.sampling.SamplingParams fields."""

    max_tokens: int | None
    fields: dict

    @property
    def logprobs(self) -> int | None:
        return self.fields["logprobs"]

    @property
    def logit_bias(self) -> tuple[tuple[int, float], ...]:
        return self.fields["logit_bias"]

    def as_kwargs(self, index: int = 0) -> dict:
        """SamplingParams keyword arguments for the `index`-th of n sequences (each its own seed)."""
        seed = self.fields["seed"]
        return {**self.fields, "seed": None if seed is None else (seed + index) % (1 << 64)}


@dataclass(frozen=True)
class Structure:
    """What a chat answer must be, enforced by a grammar (worker/grammar.py): a JSON document matching
    `schema` (response_format; {} is any JSON value), or tool calls of `tools` (`tool_choice` "auto": text
    or calls, "required": at least one call, else the one function of that name; `parallel` False: at
    most one call)."""

    schema: dict | None = None
    tools: tuple[dict, ...] = ()
    tool_choice: str = "auto"
    parallel: bool = True


@dataclass(frozen=True)
class CompletionRequest:
    model: str
    prompt: str | list[int]
    sampling: Sampling
    n: int
    stream: bool
    include_usage: bool


@dataclass(frozen=True)
class ChatRequest:
    model: str
    messages: list[dict]
    sampling: Sampling
    n: int
    stream: bool
    include_usage: bool
    tools: list[dict] | None = None
    structure: Structure | None = None


def parse_completion(body: object) -> CompletionRequest:
    body = _object(body, _COMPLETION_FIELDS, "/v1/completions")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if not (isinstance(prompt, str) or (isinstance(prompt, list) and all(_is_int(t) for t in prompt))):
        raise InvalidRequest("InvalidField", "prompt must be a string or a list of token ids (one prompt per "
                             "request; send several requests, or n for several completions of one prompt)",
                             param="prompt")
    _neutral(body, "echo", False, "the prompt is not echoed; prepend it yourself")
    _neutral(body, "suffix", None, "insertion (suffix) is not supported")
    n = _count(body, "n")
    best_of = body.get("best_of")
    if best_of is not None and (not _is_int(best_of) or best_of != n):
        raise InvalidRequest("UnsupportedField", f"best_of={best_of!r} is not supported: the worker returns every "
                             "sequence it generates; omit best_of or set it equal to n", param="best_of")
    logprobs = _optional_int(body, "logprobs", 0, MAX_LOGPROBS)
    return CompletionRequest(model=_model(body), prompt=prompt, sampling=_sampling(body, "max_tokens", logprobs),
                             n=n, stream=_stream(body), include_usage=_include_usage(body))


def parse_chat(body: object) -> ChatRequest:
    body = _object(body, _CHAT_FIELDS, "/v1/chat/completions")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("InvalidField", "messages must be a non-empty list of {role, content}",
                             param="messages")
    parsed = [_message(message, i) for i, message in enumerate(messages)]
    limit_field = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    schema = _response_format(body.get("response_format"))
    logprobs = body.get("logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        raise InvalidRequest("InvalidField", "logprobs must be true or false", param="logprobs")
    top = _optional_int(body, "top_logprobs", 0, MAX_LOGPROBS)
    if top is not None and not logprobs:
        raise InvalidRequest("InvalidField", "top_logprobs needs logprobs: true", param="top_logprobs")
    reported = (top or 0) if logprobs else None
    tools, choice = _tools(body)
    parallel = _parallel(body)
    if schema is not None and choice != "auto":
        raise InvalidRequest("ConflictingConstraints", "response_format asks for a JSON answer and tool_choice "
                             f"{choice!r} for a tool call; send one of them (tool arguments follow their own "
                             "parameters schema)", param="response_format")
    structure = (Structure(schema=schema) if schema is not None
                 else Structure(tools=tuple(tools), tool_choice=choice, parallel=parallel) if tools else None)
    return ChatRequest(model=_model(body), messages=parsed, sampling=_sampling(body, limit_field, reported),
                       n=_count(body, "n"), stream=_stream(body), include_usage=_include_usage(body),
                       tools=tools, structure=structure)


def _object(body: object, fields: set[str], route: str) -> dict:
    if not isinstance(body, dict):
        raise InvalidRequest("InvalidBody", "the request body must be a JSON object", param=None)
    unknown = sorted(set(body) - fields)
    if unknown:
        raise InvalidRequest("UnsupportedField", f"{unknown[0]!r} is not a field this worker supports on {route}; "
                             f"remove it (supported: {', '.join(sorted(fields))})", param=unknown[0])
    return body


def _neutral(body: dict, key: str, neutral: object, why: str) -> None:
    if body.get(key) not in (None, neutral):
        raise InvalidRequest("UnsupportedField", f"{key}={body[key]!r} is not supported by this worker ({why}); "
                             f"omit it or send {neutral!r}", param=key)


def _model(body: dict) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not 0 < len(model) <= MAX_MODEL_NAME:
        raise InvalidRequest("InvalidField", "model is required: one of the names GET /v1/models lists "
                             f"(at most {MAX_MODEL_NAME} characters)", param="model")
    return model


def _message(message: object, i: int) -> dict:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str) or message["role"] not in _ROLES:
        raise InvalidRequest("InvalidField", f"messages[{i}].role must be one of {sorted(_ROLES)}",
                             param=f"messages[{i}].role")
    unknown = sorted(set(message) - _MESSAGE_FIELDS)
    if unknown:
        raise InvalidRequest("UnsupportedField", f"messages[{i}].{unknown[0]} is not supported (audio, function "
                             "calls and other non-text parts are not served here); remove it",
                             param=f"messages[{i}].{unknown[0]}")
    parsed: dict = {"role": message["role"]}
    tool_calls = message.get("tool_calls")
    if tool_calls is not None:
        parsed["tool_calls"] = _tool_calls(tool_calls, i)
    content = message.get("content")
    parsed["content"] = "" if content is None and tool_calls is not None else _content(content, i)
    for key in ("name", "tool_call_id"):
        value = message.get(key)
        if value is not None:
            if not isinstance(value, str):
                raise InvalidRequest("InvalidField", f"messages[{i}].{key} must be a string",
                                     param=f"messages[{i}].{key}")
            parsed[key] = value
    return parsed


def _content(content: object, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise InvalidRequest("InvalidField", f"messages[{i}].content must be a string or a list of text parts "
                         "(images and audio are not served here)", param=f"messages[{i}].content")


def _tool_calls(calls: object, i: int) -> list[dict]:
    """An assistant message's tool calls, with arguments as objects (what chat templates expect)."""
    where = f"messages[{i}].tool_calls"
    if not isinstance(calls, list):
        raise InvalidRequest("InvalidField", f"{where} must be a list", param=where)
    parsed = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not (isinstance(function, dict) and isinstance(function.get("name"), str)
                and isinstance(function.get("arguments", "{}"), str)):
            raise InvalidRequest("InvalidField", f"{where}[{j}] must be {{id, type: function, function: {{name, "
                                 "arguments (a JSON string)}}}}", param=f"{where}[{j}]")
        try:
            arguments = json.loads(function.get("arguments", "{}"))
        except (ValueError, RecursionError):  # invalid or too deeply nested JSON: hand it back as it was
            arguments = function.get("arguments")
        parsed.append({"id": call.get("id"), "type": "function",
                       "function": {"name": function["name"], "arguments": arguments}})
    return parsed


def _tools(body: dict) -> tuple[list[dict] | None, str]:
    """The tools the template renders (None: none, or tool_choice "none") and the tool choice: "auto",
    "required" or the name of the one function to call."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is not None and (not isinstance(tools, list) or not all(
            isinstance(t, dict) and t.get("type") == "function" and isinstance(t.get("function"), dict)
            and isinstance(t["function"].get("name"), str) and isinstance(t["function"].get("parameters", {}), dict)
            for t in tools)):
        raise InvalidRequest("InvalidField", "tools must be a list of {type: function, function: {name, "
                             "description, parameters (an object)}}", param="tools")
    names = [t["function"]["name"] for t in tools or ()]
    if isinstance(choice, dict):
        function = choice.get("function") if choice.get("type") == "function" else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str):
            raise InvalidRequest("InvalidField", "tool_choice must be \"none\", \"auto\", \"required\" or "
                                 "{type: function, function: {name}}", param="tool_choice")
        if name not in names:
            raise InvalidRequest("UnknownTool", f"tool_choice names function {name[:100]!r}, which is not among "
                                 f"the tools sent ({', '.join(names) or 'none'}); name one of them",
                                 param="tool_choice")
        choice = name
    elif choice == "required" and not names:
        raise InvalidRequest("InvalidField", "tool_choice \"required\" needs tools", param="tool_choice")
    elif choice not in (None, "auto", "none", "required"):
        raise InvalidRequest("InvalidField", "tool_choice must be \"none\", \"auto\", \"required\" or "
                             "{type: function, function: {name}}", param="tool_choice")
    if choice == "none" or not tools:
        return None, "auto"
    check_tool_list(tools)  # before the chat template renders them
    return tools, choice or "auto"


def _parallel(body: dict) -> bool:
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise InvalidRequest("InvalidField", "parallel_tool_calls must be true or false", param="parallel_tool_calls")
    return parallel is not False


def _response_format(value: object) -> dict | None:
    """The JSON schema the answer must match ({} for any JSON value, json_object: any object); None: text."""
    kind = value.get("type") if isinstance(value, dict) else None
    if value is None or kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema", {}) if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise InvalidRequest("InvalidField", "response_format json_schema must be {type: json_schema, "
                                 "json_schema: {name, schema (an object), strict}}", param="response_format")
        return schema
    raise InvalidRequest("InvalidField", "response_format must be {\"type\": \"text\"}, {\"type\": "
                         "\"json_object\"} or {\"type\": \"json_schema\", \"json_schema\": {...}}",
                         param="response_format")


def _sampling(body: dict, limit_field: str, logprobs: int | None) -> Sampling:
    max_tokens = body.get(limit_field)
    if max_tokens is not None and (not _is_int(max_tokens) or max_tokens < 1):
        raise InvalidRequest("InvalidField", f"{limit_field} must be an integer >= 1", param=limit_field)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    if top_p == 0:
        raise InvalidRequest("InvalidField", "top_p must be > 0", param="top_p")
    top_k = _optional_int(body, "top_k", -1, None)
    return Sampling(max_tokens, {
        "temperature": _number(body, "temperature", 1.0, 0.0, 2.0), "top_p": top_p,
        "seed": _optional_int(body, "seed", *SEED_RANGE), "stop": _stop(body.get("stop")),
        "top_k": max(top_k or 0, 0),
        "presence_penalty": _number(body, "presence_penalty", 0.0, -2.0, 2.0),
        "frequency_penalty": _number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        "logit_bias": _logit_bias(body.get("logit_bias")), "logprobs": logprobs, **_vllm_extra(body, max_tokens)})


def _vllm_extra(body: dict, max_tokens: int | None) -> dict:
    """ignore_eos, min_tokens and stop_token_ids, as vLLM defines them."""
    ignore_eos = body.get("ignore_eos")
    if ignore_eos is not None and not isinstance(ignore_eos, bool):
        raise InvalidRequest("InvalidField", "ignore_eos must be true or false", param="ignore_eos")
    min_tokens = _optional_int(body, "min_tokens", 0, max_tokens)
    ids = body.get("stop_token_ids")
    if ids is not None and (not isinstance(ids, list) or len(ids) > MAX_STOP_TOKEN_IDS
                            or not all(_is_int(i) for i in ids)):
        raise InvalidRequest("InvalidField", f"stop_token_ids must be a list of at most {MAX_STOP_TOKEN_IDS} token "
                             "ids", param="stop_token_ids")
    return {"ignore_eos": bool(ignore_eos), "min_tokens": min_tokens or 0, "stop_token_ids": tuple(ids or ())}


def _stop(stop: object) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = (stop,) if isinstance(stop, str) else stop
    if not isinstance(stops, list | tuple) or len(stops) > 4 or not all(isinstance(s, str) and s for s in stops):
        raise InvalidRequest("InvalidField", "stop must be a string or a list of up to 4 non-empty strings",
                             param="stop")
    return tuple(stops)


def _logit_bias(bias: object) -> tuple[tuple[int, float], ...]:
    """(token id, bias) pairs; the ids are checked against the model's vocabulary by the caller."""
    if bias is None:
        return ()
    message = "logit_bias must map token ids (decimal strings) to numbers in [-100, 100]"
    if not isinstance(bias, dict) or len(bias) > MAX_LOGIT_BIAS:
        raise InvalidRequest("InvalidField", f"{message}, at most {MAX_LOGIT_BIAS} of them", param="logit_bias")
    pairs = []
    for key, value in bias.items():
        if not (_TOKEN_KEY.fullmatch(key) and len(key) <= 20) or not _in_range(value, -100, 100):
            raise InvalidRequest("InvalidField", f"{message}; got {key[:40]!r}: {str(value)[:40]}",
                                 param="logit_bias")
        pairs.append((int(key), float(value)))
    return tuple(sorted(pairs))


def _number(body: dict, key: str, default: float, low: float, high: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if not _in_range(value, low, high):
        raise InvalidRequest("InvalidField", f"{key} must be a number in [{low}, {high}]", param=key)
    return float(value)


def _in_range(value: object, low: float, high: float) -> bool:
    """A JSON number (not a boolean) inside [low, high]; NaN is never inside."""
    return not isinstance(value, bool) and isinstance(value, int | float) and low <= value <= high


def _optional_int(body: dict, key: str, low: int, high: int | None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if not _is_int(value) or value < low or (high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise InvalidRequest("InvalidField", f"{key} must be an integer {bound}", param=key)
    return value


def _count(body: dict, key: str) -> int:
    value = _optional_int(body, key, 1, None)
    return 1 if value is None else value


def _stream(body: dict) -> bool:
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise InvalidRequest("InvalidField", "stream must be true or false", param="stream")
    return bool(stream)


def _include_usage(body: dict) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    include = options.get("include_usage") if isinstance(options, dict) else "not an object"
    if not isinstance(include, bool | None):
        raise InvalidRequest("InvalidField", "stream_options must be an object {include_usage: true|false}",
                             param="stream_options")
    return bool(include)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
