"""One model's continuous batch: sequences join and leave at step boundaries, prefill is chunked
and interleaved with decode, and each step is one forward pass for the whole batch.

`Generation` is one request's state: prompt, sampled tokens, the stop conditions a token
decides (end-of-text tokens, stop_token_ids, max_tokens, a complete grammar), and its grammar's
constraint when it has one. Its text (detokenising, stop strings) is the consumer's work, off
the step (engine/text.py: `decode` and `params.stop` are for it). `ModelEngine` seats up
to `concurrency` generations in static KV slots (kept compact: a leaving sequence's slot
is refilled by the last one) and runs a step: every decoding sequence feeds one token,
and what is left of the prefill chunk (the shared footprint constant) goes to prefilling
sequences in join order, so a long prompt is cut across steps while the running
sequences keep decoding. Tokens are chosen by engine/sampling.py for every sampling row of the
step at once, on the device, with one device-to-host copy.

Called by worker/scheduler.py (one executor thread per model), the profiler and the
benches; the forward passes live in engine/forward/.
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from itertools import count
from typing import Callable


from contract.footprint import PREFILL_CHUNK_TOKENS

from .forward import Row, make_forward
from .residency import Residency
from .sampling import BatchSampler, Choice, SamplingParams, TokenConstraint
from .transfer import swap_allocations

_join_order = count()


@dataclass(eq=False)
class Generation:
    prompt_ids: list[int]
    params: SamplingParams
    eos_ids: frozenset[int]
    decode: Callable[[list[int]], str]
    constraint: TokenConstraint | None = None  # response_format / tools: the grammar the answer follows
    output_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    cached: int = 0  # tokens of this sequence in its KV slot
    slot: int | None = None
    joined: int = 0
    seed: int = -1  # the request's seed, else one drawn at random (set in __post_init__)
    _reported: list[Choice] = field(default_factory=list)
    # The tokens that end the answer (not part of it): stop_token_ids, and end-of-text unless ignore_eos.
    stops: frozenset[int] = field(init=False)

    def __post_init__(self) -> None:
        params = self.params
        self.seed = params.seed if params.seed is not None else secrets.randbits(64)
        self.stops = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else self.eos_ids)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def prefilling(self) -> bool:
        return self.cached < len(self.prompt_ids)

    def next_tokens(self, budget: int) -> tuple[int, ...]:
        """The tokens this sequence feeds next: up to `budget` prompt tokens, else its last output token."""
        if self.prefilling:
            return tuple(self.prompt_ids[self.cached: self.cached + budget])
        return (self.output_ids[-1],)

    @property
    def banned(self) -> tuple[int, ...]:
        """The tokens the sampler must not choose now: the stop tokens while min_tokens is not reached."""
        return tuple(sorted(self.stops)) if len(self.output_ids) < self.params.min_tokens else ()

    def accept(self, choice: Choice) -> None:
        """Take the sampled token (a stop token ends the answer and is not part of it)."""
        params = self.params
        if params.logprobs is not None:
            self._reported.append(choice)
        token = choice.token
        self.output_ids.append(token)
        if self.constraint is not None:
            self.constraint.advance(token)
        if token in self.stops:
            self.output_ids.pop()
            if self._reported:
                self._reported.pop()  # the end-of-text (or stop) token is not part of the answer
            self.finish_reason = "stop"
        elif self.constraint is not None and self.constraint.finished:
            self.finish_reason = "stop"  # the structure is complete: nothing but end-of-text could follow
        elif len(self.output_ids) >= params.max_tokens:
            self.finish_reason = "length"

    def take_reported(self) -> tuple[Choice, ...]:
        """The log-probabilities of the tokens sampled since the last call (empty unless the request asked)."""
        reported, self._reported = tuple(self._reported), []
        return reported


class ModelEngine:
    """The running batch of one model and the forward it steps with."""

    def __init__(self, residency: Residency, *, concurrency: int, context_tokens: int, kv_bytes: int,
                 prefill_chunk: int = PREFILL_CHUNK_TOKENS, graphs: bool = True):
        self.residency = residency
        self.concurrency = concurrency
        self.prefill_chunk = prefill_chunk
        self.forward = make_forward(residency, slots=concurrency, context_tokens=context_tokens,
                                    kv_bytes=kv_bytes, graphs=graphs)
        self.seated: list[Generation] = []  # index = KV slot
        self.sampler = BatchSampler()
        self.steps = 0
        if residency.on_device:
            self.forward.allocate()

    @property
    def path(self) -> str:
        return self.forward.path

    @property
    def fallback(self) -> str | None:
        """None, or why this model runs transformers' forward one sequence at a time (no batched forward)."""
        return self.forward.fallback

    @property
    def free_slots(self) -> int:
        return self.concurrency - len(self.seated)

    def activate(self) -> None:
        """Swap-in: weights onto the device, then the KV slots, on the swap group's allocation stream."""
        with swap_allocations(self.residency.device):
            self.residency.activate()
            self.forward.allocate()

    def deactivate(self) -> None:
        """Swap-out (the batch is empty): drop the KV slots and the device weights."""
        for generation in list(self.seated):
            self.leave(generation)
        self.forward.release()
        self.residency.deactivate()

    def join(self, generation: Generation) -> None:
        """Seat `generation` in a free slot; it takes part from the next step on."""
        if not self.free_slots:
            raise RuntimeError(f"{self.residency.ledger.model}: all {self.concurrency} KV slots are taken")
        generation.slot, generation.joined = len(self.seated), next(_join_order)
        self.seated.append(generation)

    def leave(self, generation: Generation) -> None:
        """Free `generation`'s slot at once; the last seated sequence moves into it (slots stay compact)."""
        slot = generation.slot
        if slot is None:
            return
        self.forward.free(slot)
        last = self.seated.pop()
        if last is not generation:
            self.forward.move(last.slot, slot, last.cached)
            last.slot = slot
            self.seated[slot] = last
        generation.slot = None

    def step(self) -> list[tuple[Generation, tuple[int, ...] | None]]:
        """One forward pass for every seated sequence. Returns (generation, the tokens it added to its
        answer) per sequence that took part: None for a prefill chunk that did not finish the prompt, ()
        when a stop token ended the answer. Finished sequences leave the batch."""
        decoding = [g for g in self.seated if not g.prefilling]
        prefilling = sorted((g for g in self.seated if g.prefilling), key=lambda g: g.joined)
        budget = self.prefill_chunk - len(decoding)
        plan: list[tuple[Generation, tuple[int, ...]]] = [(g, g.next_tokens(1)) for g in decoding]
        for generation in prefilling:
            if budget <= 0:
                break
            tokens = generation.next_tokens(budget)
            plan.append((generation, tokens))
            budget -= len(tokens)
        if not plan:
            return []
        logits = self.forward.run([Row(g.slot, g.cached, tokens) for g, tokens in plan])
        self.steps += 1
        for generation, tokens in plan:
            generation.cached += len(tokens)
        # the rows that sample are a prefix of the plan: decoding rows, then prompts that finished (only the
        # last prefill of a step can be cut short)
        sampling = [g for g, _ in plan if not g.prefilling]
        choices = self.sampler.choose(logits[: len(sampling)], sampling) if sampling else []
        results: list[tuple[Generation, tuple[int, ...] | None]] = []
        for generation, choice in zip(sampling, choices):
            held = len(generation.output_ids)
            generation.accept(choice)
            results.append((generation, tuple(generation.output_ids[held:])))
        results += [(g, None) for g, _ in plan[len(sampling):]]
        for generation, _ in results:
            if generation.done:
                self.leave(generation)
        return results
