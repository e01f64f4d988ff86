"""Hostile request values for the worker API tests: every JSON type and edge, and the fields they go in.

Imported by tests/test_worker_protocol.py (parser level) and tests/test_worker_hostile.py and the soak
(over HTTP): each field gets each value, so a whole class of mistakes is covered, not one example.
"""
from __future__ import annotations

# Values of every JSON type and edge: each field gets each of them (fuzz-ish, by construction).
HOSTILE = [None, True, False, 0, 1, -1, 2, 7, 21, 1.5, -0.5, 100.5, 1e308, 2 ** 63, 2 ** 64, -(2 ** 64), 2 ** 200,
           "", "x", "auto", "none", "text", [], [1], [-1], [258], [2 ** 70], [None], ["a", "b"], [[1], [2]], [1.5],
           [True],
           {}, {"type": "text"}, {"type": "json_object"}, {"type": "json_schema"}, {"1": 1}, {"x": 1},
           {"-5": 1}, {"1": 1000}, {"include_usage": "yes"}, [{"role": "user"}], [{"type": "function"}],
           [{"type": "function", "function": {"name": 3}}], "x" * 5000]
COMPLETION_FIELDS = ["model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "n", "stream",
                     "stream_options", "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "echo",
                     "suffix", "best_of", "user", "ignore_eos", "min_tokens", "stop_token_ids", "made_up_field"]
CHAT_FIELDS = ["model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed",
               "stop", "n", "stream", "stream_options", "presence_penalty", "frequency_penalty", "logit_bias",
               "logprobs", "top_logprobs", "response_format", "tools", "tool_choice", "parallel_tool_calls",
               "ignore_eos", "min_tokens", "stop_token_ids", "functions"]
MESSAGE_FIELDS = ["role", "content", "name", "tool_calls", "tool_call_id", "audio"]
# Whole bodies that are not acceptable JSON documents, as raw bytes.
RAW_BODIES = [b"", b"{", b"null", b"[]", b'"text"', b"5", b"{nope", b'{"model": NaN}', b'{"model": Infinity}',
              b"\xff\xfe\x00", b'{"prompt": "\\ud800"}', b"[" * 100_000 + b"]" * 100_000,
              b'{"a":' * 100_000 + b"1" + b"}" * 100_000, b'{"seed": ' + b"9" * 5000 + b"}"]


def mutations(base: dict, fields: list[str]):
    """(id, body) for `base` with each field set to each hostile value."""
    for field in fields:
        for i, value in enumerate(HOSTILE):
            yield f"{field}={i}", {**base, field: value}


def message_mutations(base: dict):
    """(id, body) for a chat body whose second message has each message field set to each hostile value."""
    for field in MESSAGE_FIELDS:
        for i, value in enumerate(HOSTILE):
            message = {"role": "assistant", "content": "a", field: value}
            yield f"messages[1].{field}={i}", {**base, "messages": [base["messages"][0], message]}
