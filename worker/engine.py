"""One request's generation: chunked prefill, then one token per step, against a KV cache.

Owns stop conditions (end-of-text tokens, stop strings, max_tokens) and
incremental detokenisation. The scheduler calls `Generation.step` from its single
executor thread; the model it is given is already on the device in its mode.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable

import torch
from transformers import DynamicCache

from contract.footprint import PREFILL_CHUNK_TOKENS

from .sampling import Sampler, SamplingParams


@lru_cache(maxsize=None)
def _cache_argument(model_class: type) -> str:
    """transformers >= 5.24 names the KV cache argument `cache`; earlier releases `past_key_values`."""
    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"


@dataclass
class Generation:
    prompt_ids: list[int]
    params: SamplingParams
    eos_ids: frozenset[int]
    decode: Callable[[list[int]], str]
    prefill_chunk: int = PREFILL_CHUNK_TOKENS
    output_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    _fed: int = 0
    _emitted: int = 0
    _cache: DynamicCache | None = None
    _sampler: Sampler | None = None

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def prefilling(self) -> bool:
        return self._fed < len(self.prompt_ids)

    @torch.inference_mode()
    def step(self, model, device: torch.device) -> str | None:
        """Run one forward pass: a prefill chunk (returns None until the prompt is consumed) or one
        decode step. Returns the text that became final with this step ("" while it is held back)."""
        if self._cache is None:
            self._cache = DynamicCache(config=model.config)
        if self.prefilling:
            chunk = self.prompt_ids[self._fed: self._fed + self.prefill_chunk]
            self._fed += len(chunk)
            logits = self._forward(model, device, chunk)
            if self.prefilling:
                return None
        else:
            logits = self._forward(model, device, self.output_ids[-1:])
        token = self._sample(logits)
        self.output_ids.append(token)
        if token in self.eos_ids:
            self.output_ids.pop()
            self.finish_reason = "stop"
        elif len(self.output_ids) >= self.params.max_tokens:
            self.finish_reason = "length"
        return self._text_delta()

    def release(self) -> None:
        """Drop the KV cache (the request finished or was cancelled)."""
        self._cache = None

    def _forward(self, model, device: torch.device, ids: list[int]) -> torch.Tensor:
        input_ids = torch.tensor([ids], dtype=torch.long, device=device)
        out = model(input_ids=input_ids, use_cache=True, logits_to_keep=1,
                    **{_cache_argument(type(model)): self._cache})
        return out.logits[0, -1].float()

    def _sample(self, logits: torch.Tensor) -> int:
        if self._sampler is None:
            self._sampler = Sampler(self.params)
        return self._sampler.choose(logits, self.output_ids).token

    def _text_delta(self) -> str:
        """Newly final text: held back while it may end inside a UTF-8 sequence or a stop string."""
        text = self.decode(self.output_ids)
        for stop in self.params.stop:
            at = text.find(stop)
            if at != -1:
                text, self.finish_reason = text[:at], "stop"
        if not self.done:
            hold = max((len(s) - 1 for s in self.params.stop), default=0)
            safe = len(text) - hold
            while safe > 0 and text[safe - 1] == "\ufffd":
                safe -= 1
            text = text[:max(safe, self._emitted)]
        delta, self._emitted = text[self._emitted:], max(self._emitted, len(text))
        return delta
