"""OpenAI response objects for /v1/completions and /v1/chat/completions: whole answers, stream
chunks, usage, and log-probabilities in each endpoint's own shape.

Pure: api.py hands it texts, the sampler's Choices (engine.sampling.Choice) and finish
events; `token_texts` turns token ids into the text each one decodes to.
"""
from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence

from engine.sampling import Choice
from .events import FinishEvent

TokenTexts = Callable[[list[int]], list[str]]


def usage(finished: dict[int, FinishEvent]) -> dict:
    """One prompt, counted once; the completion tokens of every choice."""
    prompt = next(iter(finished.values())).prompt_tokens if finished else 0
    completion = sum(f.completion_tokens for f in finished.values())
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class CompletionShape:
    """/v1/completions objects."""

    chunk_kind = final_kind = "text_completion"
    prefix = "cmpl"

    def __init__(self, model: str, token_texts: TokenTexts, logprobs: bool):
        self.id, self.model, self.created = f"{self.prefix}-{uuid.uuid4().hex}", model, int(time.time())
        self.token_texts, self.logprobs = token_texts, logprobs
        self._offsets: dict[int, int] = {}  # per choice: characters of completion text reported so far

    def chunk(self, index: int, text: str, choices: Sequence[Choice], finish: str | None, first: bool) -> dict:
        logprobs = self._logprobs(index, choices) if choices else None
        return self._wrap(self.chunk_kind, [{"index": index, "text": text, "logprobs": logprobs,
                                             "finish_reason": finish}])

    def usage_chunk(self, finished: dict[int, FinishEvent]) -> dict:
        return {**self._wrap(self.chunk_kind, []), "usage": usage(finished)}

    def final(self, texts: dict[int, str], reported: dict[int, list[Choice]],
              finished: dict[int, FinishEvent]) -> dict:
        choices = [self._whole(i, texts[i], reported[i], finished[i].reason) for i in sorted(texts)]
        return {**self._wrap(self.final_kind, choices), "usage": usage(finished)}

    def _whole(self, index: int, text: str, choices: list[Choice], finish: str) -> dict:
        logprobs = self._logprobs(index, choices) if self.logprobs else None
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}

    def _logprobs(self, index: int, choices: Sequence[Choice]) -> dict:
        texts = self._texts(choices)
        tokens = [texts[c.token] for c in choices]
        offsets, at = [], self._offsets.get(index, 0)
        for token in tokens:
            offsets.append(at)
            at += len(token)
        self._offsets[index] = at
        top = []
        for choice in choices:
            alternatives: dict[str, float] = {}
            for token, logprob in choice.top:
                alternatives.setdefault(texts[token], logprob)  # two ids can decode alike: keep the likelier
            top.append(alternatives)
        return {"tokens": tokens, "token_logprobs": [c.logprob for c in choices], "top_logprobs": top,
                "text_offset": offsets}

    def _texts(self, choices: Sequence[Choice]) -> dict[int, str]:
        ids = sorted({c.token for c in choices} | {token for c in choices for token, _ in c.top})
        return dict(zip(ids, self.token_texts(ids)))

    def _wrap(self, kind: str, choices: list) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices}


class ChatShape(CompletionShape):
    """/v1/chat/completions objects."""

    chunk_kind, final_kind = "chat.completion.chunk", "chat.completion"
    prefix = "chatcmpl"

    def chunk(self, index: int, text: str, choices: Sequence[Choice], finish: str | None, first: bool) -> dict:
        delta = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
        logprobs = self._logprobs(index, choices) if choices else None
        return self._wrap(self.chunk_kind, [{"index": index, "delta": delta, "logprobs": logprobs,
                                             "finish_reason": finish}])

    def _whole(self, index: int, text: str, choices: list[Choice], finish: str) -> dict:
        logprobs = self._logprobs(index, choices) if self.logprobs else None
        return {"index": index, "message": {"role": "assistant", "content": text}, "logprobs": logprobs,
                "finish_reason": finish}

    def _logprobs(self, index: int, choices: Sequence[Choice]) -> dict:
        texts = self._texts(choices)

        def entry(token: int, logprob: float) -> dict:
            return {"token": texts[token], "logprob": logprob, "bytes": list(texts[token].encode("utf-8"))}

        content = [{**entry(c.token, c.logprob), "top_logprobs": [entry(t, lp) for t, lp in c.top]}
                   for c in choices]
        return {"content": content, "refusal": None}

