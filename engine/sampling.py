"""Sampling on the device: the next token of every sequence of a step, for the whole batch at once.

Owns the request's sampling parameters and every rule that turns logits into a token:
repetition, frequency and presence penalties, `logit_bias`, then greedy at temperature 0,
else temperature, top-k and top-p, and, when asked, the log-probabilities the API reports.
`BatchSampler.choose` takes the step's logits [B, vocab] (on the model's device) and one
`SampleRow` per row, runs every rule as one set of batched tensor operations on that
device, and brings the result to the host with one device-to-host copy per step (the
chosen tokens, with their log-probabilities when a row asked). Called by the engine
(engine/batch.py) once per step; pure torch, no model.

Randomness is counter-based: a row's Gumbel noise is a hash of (its seed, its step, the
token id), so a seeded request gives the same tokens on any device, alone or in any batch,
and a greedy row ignores the noise. Sampling argmax(logits / T + Gumbel) over the kept
tokens is exactly sampling from their softmax.

Per-row state that lives across steps (token counts for the penalties, the dense logit bias,
the seen-token mask of the repetition penalty, the step counters) stays on the device while
the batch keeps its rows; any change in the batch (a join, a leave, a row that did not take
its token) rebuilds it from the rows' host-side history.

Constrained decoding: a row's grammar (`constraint`, worker/grammar.py) gives the bitmask of the
tokens allowed next, and `banned` the tokens min_tokens forbids; `allowed_tokens` turns the
batch's bitmasks and bans into one [B, vocab] mask on the logits' device (one upload), applied
first, before penalties, bias and temperature, so a forbidden token is never sampled, greedy or
not; reported log-probabilities stay the model's own. `mask_logits` is the same rule for one
bitmask and one ban list (the grammar tests and bench/grammar_masks.py).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from .transfer import download, upload

_MASK32 = 0xFFFFFFFF
_MIX = 0x45D9F3B  # the multiplier of a well-mixing 32-bit integer hash; products stay below 2**59
_GOLDEN = 0x9E3779B9
_TOKEN_STRIDE = 0x85EBCA6B


@dataclass(frozen=True)
class SamplingParams:
    """One request's sampling fields, already checked by worker.protocol (OpenAI semantics).

    `top_k` 0 keeps every token; `logit_bias` holds (token id, bias) pairs, ids inside the
    vocabulary; `repetition_penalty` (vLLM's, 1 is off) divides a positive logit of a token seen
    in the prompt or the output and multiplies a negative one; `logprobs` None reports nothing,
    k >= 0 reports the chosen token's log-probability and the k most likely alternatives.
    vLLM's extras: `ignore_eos` does not stop at end-of-text, `min_tokens` forbids end-of-text and
    `stop_token_ids` before that many tokens, and a token of `stop_token_ids` ends the answer like
    end-of-text (not part of it).
    """

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    top_k: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
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


class SampleRow(Protocol):
    """What the sampler reads of one sequence: its parameters, its resolved 64-bit seed, its history, its
    grammar (None: any token) and the tokens it must not choose now (engine/batch.py's Generation)."""

    params: SamplingParams
    seed: int
    prompt_ids: Sequence[int]
    output_ids: Sequence[int]
    constraint: TokenConstraint | None
    banned: tuple[int, ...]


def mix32(x):
    """A 32-bit integer hash (python int or int64 tensor holding values below 2**32)."""
    x = (((x >> 16) ^ x) * _MIX) & _MASK32
    x = (((x >> 16) ^ x) * _MIX) & _MASK32
    return (x >> 16) ^ x


def seed_key(seed: int) -> int:
    """A 64-bit seed (any sign) folded into 32 well-mixed bits."""
    seed &= (1 << 64) - 1
    return mix32(seed & _MASK32) ^ mix32((seed >> 32) ^ _GOLDEN)


def step_keys(seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """The 32-bit key of each row's noise: its folded seed and its step (the tokens it produced so far)."""
    return mix32((seeds + steps * _GOLDEN) & _MASK32)


def gumbel(keys: torch.Tensor, vocab: int) -> torch.Tensor:
    """Gumbel(0, 1) noise [B, vocab] from per-row keys [B] (int64): a pure function of (key, token id)."""
    ids = torch.arange(vocab, device=keys.device, dtype=torch.int64) * _TOKEN_STRIDE & _MASK32
    bits = mix32(keys[:, None] ^ ids)
    uniform = ((bits >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))
    return -torch.log(-torch.log(uniform))


@dataclass
class _Table:
    """The batch's per-row parameters and history as device tensors (rebuilt when the batch changes)."""

    rows: tuple[object, ...]
    lengths: list[int]  # each row's output length this table expects at the next step
    temperature: torch.Tensor  # [B, 1], 1 where greedy (the noise is off there)
    greedy: torch.Tensor  # [B] bool
    all_greedy: bool  # no row samples: no noise, no filtering
    top_k: torch.Tensor | None  # [B, 1] int64, vocab where off
    top_p: torch.Tensor | None  # [B, 1]
    keys: torch.Tensor  # [B] int64: this step's noise keys
    seeds: torch.Tensor  # [B] int64: each row's folded seed
    steps: torch.Tensor  # [B] int64
    counts: torch.Tensor | None  # [B, V] float: output token counts (frequency/presence)
    frequency: torch.Tensor | None
    presence: torch.Tensor | None
    seen: torch.Tensor | None  # [B, V] bool: tokens in the prompt or output (repetition)
    repetition: torch.Tensor | None
    bias: torch.Tensor | None  # [B, V]
    logprobs: int | None  # the most alternatives a row asked for; None: no row asked


class BatchSampler:
    """The sampler of one model's batch; keeps the device-side table between steps."""

    def __init__(self) -> None:
        self._table: _Table | None = None

    def choose(self, logits: torch.Tensor, rows: Sequence[SampleRow]) -> list[Choice]:
        """The next token of each row from `logits` [len(rows), vocab] (any float dtype, any device)."""
        raw = logits.float()
        table = self._prepare(rows, raw.shape[1], raw.device)
        allowed = allowed_tokens(rows, raw.shape[1], raw.device)
        adjusted = raw if allowed is None else raw.masked_fill(~allowed, float("-inf"))
        adjusted = _penalised(adjusted, table)
        tokens = adjusted.argmax(dim=-1)
        if not table.all_greedy:
            scaled = adjusted / table.temperature
            noise = gumbel(table.keys, raw.shape[1])
            if table.top_k is None and table.top_p is None:
                sampled = (scaled + noise).argmax(dim=-1)
            else:
                sampled = _filtered_sample(scaled, noise, table)
            tokens = torch.where(table.greedy, tokens, sampled)
        packed = tokens[:, None].to(torch.float64)
        if table.logprobs is not None:
            logprobs = torch.log_softmax(raw, dim=-1)
            chosen = logprobs.gather(1, tokens[:, None]).double()
            top = logprobs.topk(min(table.logprobs, raw.shape[1]), dim=-1)
            packed = torch.cat((packed, chosen, top.values.double(), top.indices.double()), dim=1)
        self._advance(table, tokens)
        return _choices(download(packed).tolist(), rows)

    def _prepare(self, rows: Sequence[SampleRow], vocab: int, device: torch.device) -> _Table:
        table = self._table
        if table is not None and len(table.rows) == len(rows) and all(a is b for a, b in zip(table.rows, rows)) \
                and table.lengths == [len(r.output_ids) for r in rows]:
            table.lengths = [n + 1 for n in table.lengths]
            return table
        self._table = table = _build(rows, vocab, device)
        return table

    def _advance(self, table: _Table, tokens: torch.Tensor) -> None:
        """After a step: each row took `tokens` (device); counts, seen mask and noise keys move on."""
        table.steps += 1
        table.keys = step_keys(table.seeds, table.steps)
        if table.counts is not None:
            table.counts.scatter_add_(1, tokens[:, None], torch.ones_like(table.counts[:, :1]))
        if table.seen is not None:
            table.seen.scatter_(1, tokens[:, None], True)


def _penalised(logits: torch.Tensor, table: _Table) -> torch.Tensor:
    """Repetition (vLLM), then frequency and presence (OpenAI: logit - count * f - [count > 0] * p), then bias."""
    if table.seen is not None:
        scaled = torch.where(logits > 0, logits / table.repetition, logits * table.repetition)
        logits = torch.where(table.seen, scaled, logits)
    if table.counts is not None:
        logits = logits - table.counts * table.frequency - (table.counts > 0).float() * table.presence
    if table.bias is not None:
        logits = logits + table.bias
    return logits


def _filtered_sample(scaled: torch.Tensor, noise: torch.Tensor, table: _Table) -> torch.Tensor:
    """Gumbel-max over the tokens top-k and top-p keep (ranked by the tempered logits)."""
    ranked, order = scaled.sort(dim=-1, descending=True)
    drop = torch.zeros_like(ranked, dtype=torch.bool)
    if table.top_k is not None:
        drop |= torch.arange(ranked.shape[1], device=ranked.device)[None, :] >= table.top_k
        ranked = ranked.masked_fill(drop, float("-inf"))
    if table.top_p is not None:
        probs = torch.softmax(ranked, dim=-1)
        drop |= probs.cumsum(dim=-1) - probs > table.top_p
    picked = (ranked.masked_fill(drop, float("-inf")) + noise.gather(1, order)).argmax(dim=-1, keepdim=True)
    return order.gather(1, picked)[:, 0]


def _build(rows: Sequence[SampleRow], vocab: int, device: torch.device) -> _Table:
    """The table for `rows` from their host-side parameters and histories (one upload per tensor)."""
    params = [r.params for r in rows]
    greedy = [p.temperature == 0 for p in params]
    lengths = [len(r.output_ids) for r in rows]
    top_k = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
    sampled_rows = [p for p, g in zip(params, greedy) if not g]
    any_k = any(0 < p.top_k < vocab for p in sampled_rows)
    any_p = any(p.top_p < 1.0 for p in sampled_rows)
    counting = any(p.frequency_penalty or p.presence_penalty for p in params)
    repeating = any(p.repetition_penalty != 1.0 for p in params)
    asked = [p.logprobs for p in params if p.logprobs is not None]
    seeds = upload([seed_key(r.seed) for r in rows], torch.int64, device)
    steps = upload(lengths, torch.int64, device)
    column = lambda values, dtype: upload(values, dtype, device)[:, None]  # noqa: E731
    counts = seen = bias = None
    if counting:
        counts = upload([_histogram(r.output_ids, vocab) for r in rows], torch.float32, device)
    if repeating:
        seen = upload([_histogram([*r.prompt_ids, *r.output_ids], vocab) for r in rows], torch.float32, device) > 0
    if any(p.logit_bias for p in params):
        dense = [[0.0] * vocab for _ in rows]
        for row, p in zip(dense, params):
            for token, value in p.logit_bias:
                row[token] += value
        bias = upload(dense, torch.float32, device)
    return _Table(
        rows=tuple(rows), lengths=[n + 1 for n in lengths],
        temperature=column([p.temperature or 1.0 for p in params], torch.float32),
        greedy=upload(greedy, torch.bool, device), all_greedy=all(greedy),
        top_k=column(top_k, torch.int64) if any_k else None,
        top_p=column([p.top_p for p in params], torch.float32) if any_p else None,
        keys=step_keys(seeds, steps), seeds=seeds, steps=steps,
        counts=counts,
        frequency=column([p.frequency_penalty for p in params], torch.float32) if counting else None,
        presence=column([p.presence_penalty for p in params], torch.float32) if counting else None,
        seen=seen, repetition=column([p.repetition_penalty for p in params], torch.float32) if repeating else None,
        bias=bias, logprobs=max(asked) if asked else None,
    )


def _histogram(ids: Sequence[int], vocab: int) -> list[float]:
    counts = [0.0] * vocab
    for token in ids:
        if 0 <= token < vocab:
            counts[token] += 1
    return counts


def _choices(packed: list[list[float]], rows: Sequence[SampleRow]) -> list[Choice]:
    out = []
    for values, row in zip(packed, rows):
        token, asked = int(values[0]), row.params.logprobs
        if asked is None:
            out.append(Choice(token))
            continue
        k = (len(values) - 2) // 2
        top = tuple((int(i), v) for v, i in zip(values[2:2 + k], values[2 + k:]))[:asked]
        out.append(Choice(token, values[1], top))
    return out


def unpack_bitmask(words: torch.Tensor, vocab: int, device: torch.device) -> torch.Tensor:
    """bool [..., vocab] from int32 words [..., words]: bit b of word w allows token 32*w + b (the grammar
    library's layout); tokens past the mask's bits are forbidden."""
    words = words.to(device, non_blocking=True)
    bits = torch.arange(32, dtype=torch.int32, device=device)
    unpacked = ((words.unsqueeze(-1) >> bits) & 1).bool().flatten(-2)[..., :vocab]
    return torch.nn.functional.pad(unpacked, (0, vocab - unpacked.shape[-1]), value=False)


def without(allowed: torch.Tensor, rows: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """`allowed` [B, vocab] less the (row, token) pairs, except in a row they would leave empty (a grammar
    that allows only end-of-text while min_tokens bans it): there the grammar's last word wins."""
    kept = allowed.clone()
    kept[rows, tokens] = False
    return torch.where(kept.any(-1, keepdim=True), kept, allowed)


def allowed_tokens(rows: Sequence[SampleRow], vocab: int, device: torch.device) -> torch.Tensor | None:
    """[len(rows), vocab] bool of the tokens each row may choose (its grammar's bitmask less its bans), on
    `device`; None when no row is constrained."""
    masks = [None if r.constraint is None else r.constraint.bitmask() for r in rows]
    bans = [(i, token) for i, r in enumerate(rows) for token in r.banned if 0 <= token < vocab]
    if all(m is None for m in masks) and not bans:
        return None
    allowed = torch.ones(len(rows), vocab, dtype=torch.bool, device=device)
    constrained = [i for i, m in enumerate(masks) if m is not None]
    if constrained:
        width = max(masks[i].shape[-1] for i in constrained)
        words = torch.zeros(len(constrained), width, dtype=torch.int32)
        for at, i in enumerate(constrained):  # a host copy: the grammar reuses its bitmask buffer next step
            words[at, : masks[i].shape[-1]] = masks[i]
        allowed[upload(constrained, torch.long, device)] = unpack_bitmask(upload(words, torch.int32, device), vocab,
                                                                          device)
    if bans:
        allowed = without(allowed, upload([i for i, _ in bans], torch.long, device),
                          upload([t for _, t in bans], torch.long, device))
    return allowed


def mask_logits(logits: torch.Tensor, bitmask: torch.Tensor | None, banned: Sequence[int] = ()) -> torch.Tensor:
    """`logits` ([vocab] or [batch, vocab]) with -inf wherever `bitmask` ([words] or [batch, words], one row
    per logits row) forbids a token or the token is in `banned`, computed on the logits' device."""
    if bitmask is None and not banned:
        return logits
    vocab = logits.shape[-1]
    flat = logits.reshape(-1, vocab)
    allowed = torch.ones(flat.shape, dtype=torch.bool, device=logits.device)
    if bitmask is not None:
        allowed = unpack_bitmask(bitmask, vocab, logits.device).reshape(flat.shape).clone()
    if banned:
        tokens = torch.tensor(list(banned), dtype=torch.long, device=logits.device)
        rows = torch.arange(flat.shape[0], device=logits.device).repeat_interleave(len(tokens))
        allowed = without(allowed, rows, tokens.repeat(flat.shape[0]))
    return logits.masked_fill(~allowed.reshape(logits.shape), float("-inf"))
