"""Sampling: one sequence's next token from one row of logits.

Owns the request's sampling parameters and every rule that turns logits into a
token: frequency/presence penalties over the tokens produced so far, `logit_bias`,
the tokens a grammar or min_tokens forbids (`mask_logits`, on the logits' device),
then greedy at temperature 0, else temperature, top-k and top-p with a seeded
generator; and, when asked, the log-probabilities the API reports. The engine
calls `Sampler.choose` once per sequence per step, with the row of the batch that
belongs to that sequence, the tokens it produced so far (the history the
penalties look at) and its grammar's bitmask (worker/grammar.py). Pure torch; no
model, no device of its own.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class SamplingParams:
    """One request's sampling fields, already checked by worker.protocol (OpenAI semantics).

    `top_k` 0 keeps every token; `logit_bias` holds (token id, bias) pairs, ids inside the
    vocabulary; `logprobs` None reports nothing, k >= 0 reports the chosen token's
    log-probability and the k most likely alternatives. vLLM's extras: `ignore_eos` does not
    stop at end-of-text, `min_tokens` forbids end-of-text and `stop_token_ids` before that many
    tokens, and a token of `stop_token_ids` ends the answer like end-of-text (not part of it).
    """

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    top_k: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: int | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()


class TokenConstraint(Protocol):
    """A grammar that one sequence's tokens must follow (worker/grammar.py implements it): the bitmask of
    the tokens allowed next (int32 words, host memory), then the chosen token; `finished` once the
    grammar admits nothing more, which ends the answer."""

    finished: bool

    def bitmask(self) -> torch.Tensor: ...

    def advance(self, token: int) -> None: ...


@dataclass(frozen=True)
class Choice:
    """The chosen token and, when asked for, its log-probability and the top alternatives.

    Log-probabilities are the model's own (log-softmax of the raw logits, before penalties,
    bias and temperature), as OpenAI and vLLM report them; `top` is most likely first.
    """

    token: int
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()


class Sampler:
    """One sequence's sampler: holds its seeded generator across steps."""

    def __init__(self, params: SamplingParams):
        self.params = params
        self._generator: torch.Generator | None = None

    def choose(self, logits: torch.Tensor, history: Sequence[int] = (), bitmask: torch.Tensor | None = None,
               banned: Sequence[int] = ()) -> Choice:
        """The next token from `logits` (shape [vocab], any float dtype, any device), among the tokens
        `bitmask` allows (None: all) less `banned`."""
        raw = logits.float()
        adjusted = mask_logits(self._adjusted(raw, history), bitmask, banned)
        if self.params.temperature == 0:
            token = int(adjusted.argmax())
        else:
            token = int(torch.multinomial(self._distribution(adjusted), 1, generator=self._seeded()))
        return self._reported(raw, token)

    def _adjusted(self, logits: torch.Tensor, history: Sequence[int]) -> torch.Tensor:
        """Penalties (OpenAI: logit - count * frequency - [count > 0] * presence) and logit_bias."""
        params = self.params
        penalised = history and (params.presence_penalty or params.frequency_penalty)
        if not penalised and not params.logit_bias:
            return logits
        logits = logits.clone()
        if penalised:
            ids = torch.tensor(list(history), dtype=torch.long, device=logits.device)
            counts = torch.bincount(ids, minlength=logits.shape[0])[: logits.shape[0]].to(logits.dtype)
            logits -= counts * params.frequency_penalty + (counts > 0).to(logits.dtype) * params.presence_penalty
        if params.logit_bias:
            ids = torch.tensor([i for i, _ in params.logit_bias], dtype=torch.long, device=logits.device)
            bias = torch.tensor([b for _, b in params.logit_bias], dtype=logits.dtype, device=logits.device)
            logits.index_add_(0, ids, bias)
        return logits

    def _distribution(self, logits: torch.Tensor) -> torch.Tensor:
        """Probabilities on the CPU (the seeded generator's device) after temperature, top-k and top-p."""
        scaled = logits.cpu() / self.params.temperature
        if 0 < self.params.top_k < scaled.shape[0]:
            kth = scaled.topk(self.params.top_k).values[-1]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        probs = torch.softmax(scaled, dim=-1)
        if self.params.top_p < 1.0:
            sorted_probs, order = probs.sort(descending=True)
            outside = sorted_probs.cumsum(0) - sorted_probs > self.params.top_p
            sorted_probs[outside] = 0
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
        return probs

    def _reported(self, raw: torch.Tensor, token: int) -> Choice:
        if self.params.logprobs is None:
            return Choice(token)
        logprobs = torch.log_softmax(raw, dim=-1)
        top: tuple[tuple[int, float], ...] = ()
        if self.params.logprobs > 0:
            values, ids = logprobs.topk(min(self.params.logprobs, logprobs.shape[0]))
            top = tuple(zip(ids.tolist(), values.tolist()))
        return Choice(token, float(logprobs[token]), top)

    def _seeded(self) -> torch.Generator:
        if self._generator is None:
            self._generator = torch.Generator()
            if self.params.seed is not None:
                self._generator.manual_seed(self.params.seed)
            else:
                self._generator.seed()
        return self._generator


def mask_logits(logits: torch.Tensor, bitmask: torch.Tensor | None, banned: Sequence[int] = ()) -> torch.Tensor:
    """`logits` ([vocab] or [batch, vocab]) with -inf wherever `bitmask` forbids a token or the token is in
    `banned`, computed on the logits' device (the one-place hook for structured output).

    `bitmask` is int32 words, one row per logits row ([words] or [batch, words]): bit b of word w allows
    token 32*w + b (the grammar library's layout). Logits columns past the mask's bits are forbidden.
    Where `banned` would leave a row nothing (a grammar that allows only end-of-text while min_tokens
    bans it), that row keeps what the bitmask allows: sampling never faces an empty row.
    """
    if bitmask is None and not banned:
        return logits
    vocab = logits.shape[-1]
    allowed = torch.ones(logits.shape, dtype=torch.bool, device=logits.device)
    if bitmask is not None:
        words = bitmask.to(logits.device, non_blocking=True)
        bits = torch.arange(32, dtype=torch.int32, device=logits.device)
        unpacked = ((words.unsqueeze(-1) >> bits) & 1).bool().flatten(-2)[..., :vocab]
        allowed[..., :unpacked.shape[-1]] = unpacked
        allowed[..., unpacked.shape[-1]:] = False
    if banned:
        kept = allowed.clone()
        kept[..., torch.tensor(list(banned), dtype=torch.long, device=logits.device)] = False
        allowed = torch.where(kept.any(-1, keepdim=True), kept, allowed)  # the grammar's last word wins
    return logits.masked_fill(~allowed, float("-inf"))
