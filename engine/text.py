"""One answer's text as its tokens come: incremental detokenisation and stop strings.

The engine's step only chooses tokens (engine/batch.py); turning them into text is the consumer's
work, off the step's critical path (worker/emitter.py runs a TextStream per request on its own
thread). Text is held back while it may end inside a UTF-8 sequence or be the start of a stop
string; a stop string ends the answer, is not part of it, and tokens after it are ignored.
Each token costs one decode of a few tokens of context (the context moves every CONTEXT_TOKENS
tokens, with one single-token decode), so a long answer costs the same per token as a short one.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

CONTEXT_TOKENS = 3  # tokens of decoded context, at most, before the window moves on


class TextStream:
    def __init__(self, decode: Callable[[list[int]], str], stop: Sequence[str] = ()):
        self.decode, self.stop = decode, tuple(stop)
        self.tokens = 0  # tokens of the answer (up to and with the one that completed a stop string)
        self.stopped = False  # a stop string ended the answer
        self._longest = max((len(s) for s in self.stop), default=0)
        self._ids: list[int] = []
        self._text = ""  # the answer detokenised so far
        self._emitted = 0  # characters of _text handed out
        self._prefix = 0  # the decoded window starts at this token ...
        self._read = 0  # ... and the tokens before this one are in _text
        self._head = ""  # decode(_ids[_prefix:_read])

    def feed(self, ids: Sequence[int], done: bool) -> str:
        """The text that became final with the answer's next tokens `ids`; `done`: the answer ends with them
        (everything held back is released). After a stop string, returns "" and ignores what follows."""
        parts = []
        for at, token in enumerate(ids):
            if self.stopped:
                break
            self._ids.append(token)
            self.tokens += 1
            parts.append(self._delta(done and at == len(ids) - 1))
        if done and not ids and not self.stopped:
            parts.append(self._delta(True))
        return "".join(parts)

    def _delta(self, done: bool) -> str:
        before = len(self._text)
        window = self.decode(self._ids[self._prefix:])
        if len(window) > len(self._head) and (done or not window.endswith("\ufffd")):
            self._text += window[len(self._head):]
            self._read, self._head = len(self._ids), window
            if self._read - self._prefix > CONTEXT_TOKENS:  # keep one token of context
                self._prefix = self._read - 1
                self._head = self.decode(self._ids[self._prefix:self._read])
        for stop in self.stop:
            at = self._text.find(stop, max(0, before - self._longest + 1))
            if at != -1:
                self._text, self.stopped, done = self._text[:at], True, True
        final = len(self._text) if done else max(len(self._text) - max(self._longest - 1, 0), self._emitted)
        delta, self._emitted = self._text[self._emitted:final], max(self._emitted, final)
        return delta
