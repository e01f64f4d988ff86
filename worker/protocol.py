"""OpenAI request bodies, parsed and checked: pure functions that name the bad field.

Owns which fields of /v1/completions and /v1/chat/completions the worker accepts
and their defaults. api.py calls `parse_completion` / `parse_chat`; a problem
raises InvalidRequest with `param` set to the offending field.
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import InvalidRequest

COMPLETION_DEFAULT_MAX_TOKENS = 16  # as OpenAI's legacy completions endpoint
_ROLES = {"system", "user", "assistant", "developer", "tool"}
# Options a single-sequence server cannot honour: accepted only at their neutral value.
_NEUTRAL = {"n": 1, "best_of": 1, "echo": False, "logprobs": None, "suffix": None, "tools": None,
            "tool_choice": None, "top_logprobs": None, "response_format": None}


@dataclass(frozen=True)
class Sampling:
    max_tokens: int | None
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple[str, ...]

    def as_kwargs(self) -> dict:
        return {"temperature": self.temperature, "top_p": self.top_p, "seed": self.seed, "stop": self.stop}


@dataclass(frozen=True)
class CompletionRequest:
    model: str
    prompt: str | list[int]
    sampling: Sampling
    stream: bool
    include_usage: bool


@dataclass(frozen=True)
class ChatRequest:
    model: str
    messages: list[dict]
    sampling: Sampling
    stream: bool
    include_usage: bool


def parse_completion(body: object) -> CompletionRequest:
    body = _object(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if not (isinstance(prompt, str) or (isinstance(prompt, list) and all(_is_int(t) for t in prompt))):
        raise InvalidRequest("InvalidField", "prompt must be a string or a list of token ids (one prompt per "
                             "request)", param="prompt")
    return CompletionRequest(model=_model(body), prompt=prompt, sampling=_sampling(body, "max_tokens"),
                             stream=_stream(body), include_usage=_include_usage(body))


def parse_chat(body: object) -> ChatRequest:
    body = _object(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("InvalidField", "messages must be a non-empty list of {role, content}",
                             param="messages")
    parsed = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            raise InvalidRequest("InvalidField", f"messages[{i}].role must be one of {sorted(_ROLES)}",
                                 param=f"messages[{i}].role")
        parsed.append({"role": message["role"], "content": _content(message.get("content"), i)})
    limit_field = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    return ChatRequest(model=_model(body), messages=parsed, sampling=_sampling(body, limit_field),
                       stream=_stream(body), include_usage=_include_usage(body))


def _object(body: object) -> dict:
    if not isinstance(body, dict):
        raise InvalidRequest("InvalidBody", "the request body must be a JSON object", param=None)
    for key, neutral in _NEUTRAL.items():
        if body.get(key) not in (None, False, neutral):
            raise InvalidRequest("UnsupportedField", f"{key}={body[key]!r} is not supported by this worker; "
                                 f"omit it or send {neutral!r}", param=key)
    return body


def _model(body: dict) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("InvalidField", "model is required: one of the names GET /v1/models lists",
                             param="model")
    return model


def _content(content: object, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise InvalidRequest("InvalidField", f"messages[{i}].content must be a string or a list of text parts",
                         param=f"messages[{i}].content")


def _sampling(body: dict, limit_field: str) -> Sampling:
    max_tokens = body.get(limit_field)
    if max_tokens is not None and (not _is_int(max_tokens) or max_tokens < 1):
        raise InvalidRequest("InvalidField", f"{limit_field} must be an integer >= 1", param=limit_field)
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    if top_p == 0:
        raise InvalidRequest("InvalidField", "top_p must be > 0", param="top_p")
    seed = body.get("seed")
    if seed is not None and not _is_int(seed):
        raise InvalidRequest("InvalidField", "seed must be an integer", param="seed")
    stop = body.get("stop")
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    if not all(isinstance(s, str) and s for s in stops) or len(stops) > 4:
        raise InvalidRequest("InvalidField", "stop must be a string or a list of up to 4 non-empty strings",
                             param="stop")
    return Sampling(max_tokens, temperature, top_p, seed, stops)


def _number(body: dict, key: str, default: float, low: float, high: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise InvalidRequest("InvalidField", f"{key} must be a number in [{low}, {high}]", param=key)
    return float(value)


def _stream(body: dict) -> bool:
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise InvalidRequest("InvalidField", "stream must be true or false", param="stream")
    return bool(stream)


def _include_usage(body: dict) -> bool:
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise InvalidRequest("InvalidField", "stream_options must be an object", param="stream_options")
    return bool(options.get("include_usage", False))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
