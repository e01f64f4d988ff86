"""Tool calls: the text form a model writes them in, the grammar that holds it to that form, and the
OpenAI `tool_calls` (whole, or streamed as deltas) read back from the text.

Owns the one tool-call format the worker enforces, Hermes/Qwen's:
`<tool_call>\\n{"name": "NAME", "arguments": {...}}\\n</tool_call>`, what the chat templates of
Qwen2.5/Qwen3, Hermes and many fine-tunes teach. `tools_grammar` writes the Lark grammar for a
tool choice (worker/grammar.py compiles it): "auto" lets text run free until the model opens a
call, which must then be well formed; "required" is one or more calls and nothing else; a named
function is exactly one call of it. `ToolCallParser` splits the answer, as it streams, into
content and calls; `ToolCallShape` is worker.responses.ChatShape with those calls in OpenAI's
shape and finish_reason "tool_calls". api.py picks ToolCallShape when a request's tools are live.
"""
from __future__ import annotations

import copy
import json
import re
import uuid
from collections.abc import Sequence

from .responses import ChatShape
from engine.sampling import Choice

OPEN = "<tool_call>"
CLOSE = "}\n</tool_call>"  # the call object's end, then the tag: a raw newline never occurs inside JSON
_HEAD = re.compile(r'\n\{"name": ("(?:[^"\\]|\\.)*"), "arguments": ')


def call_head(name: str) -> str:
    """What follows OPEN up to the arguments object."""
    return '\n{"name": ' + json.dumps(name) + ', "arguments": '


def tools_grammar(names: Sequence[str], schemas: Sequence[str], choice: str, parallel: bool = True) -> str:
    """The Lark grammar (llguidance's dialect) for `choice` over functions `names` with their parameters'
    JSON schemas (`schemas`, as JSON text); `parallel` False allows one call at most."""
    offered = [i for i, name in enumerate(names) if choice in ("auto", "required") or name == choice]
    rules = [f"call_{i}: {json.dumps(call_head(names[i]))} %json {schemas[i]} {json.dumps(CLOSE)}" for i in offered]
    body = " | ".join(f"call_{i}" for i in offered)
    if choice == "auto":
        start = (f"start: tagged{'*' if parallel else '?'} TEXT\nTEXT: /(.|\\n)*/\n"
                 f"open[lazy]: TEXT {json.dumps(OPEN)}\ntagged: open ({body})")
    elif choice == "required":
        more = ' ("\\n" call)*' if parallel else ""
        start = f"start: call{more}\ncall: {json.dumps(OPEN)} ({body})"
    else:
        start = f"start: {json.dumps(OPEN)} {body}"
    return "%llguidance {}\n" + start + "\n" + "\n".join(rules) + "\n"


class ToolCallParser:
    """One choice's answer, fed as it streams: content deltas and OpenAI tool-call deltas.

    Text that may be the start of OPEN is held back until it is known not to be; the arguments stream
    as they come, less the last len(CLOSE) characters, which may be the call's end. Whitespace that ends
    the text before or between calls is not content. `calls` holds the calls so far, whole.
    """

    def __init__(self):
        self.calls: list[dict] = []
        self.content = ""
        self._buffer = ""
        self._held = ""  # whitespace that ended the content so far
        self._state = "text"  # text | head | arguments

    def feed(self, text: str) -> tuple[str, list[dict]]:
        self._buffer += text
        content, deltas = "", []
        while True:
            if self._state == "text":
                at = self._buffer.find(OPEN)
                if at == -1:
                    keep = _partial_suffix(self._buffer, OPEN)
                    content += self._content(self._buffer[:len(self._buffer) - keep])
                    self._buffer = self._buffer[len(self._buffer) - keep:]
                    return content, deltas
                content += self._content(self._buffer[:at])
                self._buffer, self._state = self._buffer[at + len(OPEN):], "head"
            elif self._state == "head":
                match = _HEAD.match(self._buffer)
                if match is None:
                    return content, deltas
                call = {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                        "function": {"name": json.loads(match.group(1)), "arguments": ""}}
                self.calls.append(call)
                deltas.append({"index": len(self.calls) - 1, **copy.deepcopy(call)})
                self._buffer, self._state = self._buffer[match.end():], "arguments"
            else:
                at = self._buffer.find(CLOSE)
                end = at if at != -1 else max(len(self._buffer) - len(CLOSE), 0)
                if end:
                    deltas.append(self._arguments(self._buffer[:end]))
                if at == -1:
                    self._buffer = self._buffer[end:]
                    return content, deltas
                self._buffer, self._state = self._buffer[at + len(CLOSE):], "text"

    def close(self) -> tuple[str, list[dict]]:
        """The answer ended: what was held back. An unfinished head becomes content again; unfinished
        arguments (max_tokens reached) stay the call's, as OpenAI returns them."""
        rest, self._buffer = self._buffer, ""
        if self._state == "arguments":
            return "", [self._arguments(rest)] if rest else []
        if self._state == "head":
            rest = OPEN + rest
        self._state = "text"
        return self._content(rest, last=True), []

    def _content(self, text: str, last: bool = False) -> str:
        """Content as it may be shown: trailing whitespace waits for text to follow, and at the end is
        dropped when the answer holds calls."""
        pending = self._held + text
        body = pending if last and not self.calls else pending.rstrip()
        self._held = pending[len(body):]
        self.content += body
        return body

    def _arguments(self, fragment: str) -> dict:
        self.calls[-1]["function"]["arguments"] += fragment
        return {"index": len(self.calls) - 1, "function": {"arguments": fragment}}


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of `text` that begins `tag`."""
    for size in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


class ToolCallShape(ChatShape):
    """Chat objects whose answers may be tool calls: `tool_calls` and finish_reason "tool_calls"."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._parsers: dict[int, ToolCallParser] = {}

    def chunk(self, index: int, text: str, choices: Sequence[Choice], finish: str | None, first: bool) -> dict:
        parser = self._parsers.setdefault(index, ToolCallParser())
        content, calls = parser.feed(text)
        if finish is not None:
            rest, more = parser.close()
            content, calls = content + rest, calls + more
        delta: dict = {"role": "assistant"} if first else {}
        if content or (first and not calls):
            delta["content"] = content
        if calls:
            delta["tool_calls"] = calls
        logprobs = self._logprobs(index, choices) if choices else None
        return self._wrap(self.chunk_kind, [{"index": index, "delta": delta, "logprobs": logprobs,
                                             "finish_reason": _finish(finish, parser)}])

    def _whole(self, index: int, text: str, choices: list[Choice], finish: str) -> dict:
        parser = ToolCallParser()
        parser.feed(text)
        parser.close()
        message = {"role": "assistant", "content": parser.content or (None if parser.calls else "")}
        if parser.calls:
            message["tool_calls"] = parser.calls
        logprobs = self._logprobs(index, choices) if self.logprobs else None
        return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": _finish(finish, parser)}


def _finish(reason: str | None, parser: ToolCallParser) -> str | None:
    return "tool_calls" if reason == "stop" and parser.calls else reason
