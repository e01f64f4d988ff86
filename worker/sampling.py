"""Sampling: one sequence's next token from one row of logits.

Owns the request's sampling parameters and the rule that turns logits into a
token: greedy at temperature 0, else temperature + top-p with a seeded generator.
The engine calls `Sampler.choose` once per sequence per step, with the row of the
batch that belongs to that sequence and the tokens it produced so far (the
history penalties look at). Pure torch on CPU tensors; no model, no device.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class Choice:
    """The chosen token (and, when asked for, its log-probability and the top alternatives)."""

    token: int
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()


class Sampler:
    """One sequence's sampler: holds its seeded generator across steps."""

    def __init__(self, params: SamplingParams):
        self.params = params
        self._generator: torch.Generator | None = None

    def choose(self, logits: torch.Tensor, history: Sequence[int] = ()) -> Choice:
        """The next token from `logits` (shape [vocab], any float dtype, any device)."""
        logits = logits.float()
        if self.params.temperature == 0:
            return Choice(int(logits.argmax()))
        probs = torch.softmax(logits.cpu() / self.params.temperature, dim=-1)
        if self.params.top_p < 1.0:
            sorted_probs, order = probs.sort(descending=True)
            outside = sorted_probs.cumsum(0) - sorted_probs > self.params.top_p
            sorted_probs[outside] = 0
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
        return Choice(int(torch.multinomial(probs, 1, generator=self._seeded())))

    def _seeded(self) -> torch.Generator:
        if self._generator is None:
            self._generator = torch.Generator()
            if self.params.seed is not None:
                self._generator.manual_seed(self.params.seed)
            else:
                self._generator.seed()
        return self._generator
