"""Grammars for structured output: a request's Structure (protocol.py) compiled into token masks.

Owns the grammar library (llguidance; why this one: docs/worker.md), the JSON layout a
constrained answer has (no free whitespace: `", "` and `": "` separators only, so an answer's
length is bounded by its content), the refusal of a schema keyword the library does not
implement (a 400 naming it), the grammars a model keeps (`CACHE_ENTRIES` compiled or refused
grammars, the least recently used given up first), and one sequence's matcher state (`Constraint`,
which the engine asks for the next bitmask and tells the chosen token). The tool-call grammar's
wording is worker/tools.py's. Built once per served model (worker.runtime.ServedModel: the
library's view of the tokenizer is built on first use, about a second for a 128k vocabulary).

Nothing reaches the library unchecked: the schema (or each tool's parameters) is first held to
worker/schemabound.py's bounds on its resolved graph, then compiled on the model's own compile lane
(worker/compilelane.py: threads with a known stack, a bounded queue, `COMPILE_DEADLINE_S`), never
on the event loop or a thread of unknown stack. api.py awaits `compiled`; tests and benches call
`constraints`.
"""
from __future__ import annotations

import asyncio
import collections
import hashlib
import json
import threading
import time
from concurrent.futures import Future
from typing import Protocol

import llguidance
import llguidance.hf
import torch
from transformers import PreTrainedTokenizerFast

from .compilelane import CompileLane
from .errors import InvalidRequest, SchemaRefused
from .prompts import PromptEncoder
from .protocol import Structure
from .schemabound import check_schema, check_tools
from .tools import tools_grammar

# Overrides any "x-guidance" a schema carries: whitespace stays bounded whatever the client sends.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ", "lenient": False}
COMPILE_DEADLINE_S = 10.0  # of compiling one grammar, per request (worker/compilelane.py)
CACHE_ENTRIES = 64  # grammars kept per model, compiled or refused


class GrammarMetrics(Protocol):
    """What the grammars report (worker.metrics.WorkerMetrics)."""

    def grammar_lookup(self, model: str, kept: bool) -> None: ...

    def grammar_compiled(self, model: str, seconds: float) -> None: ...


class Grammars:
    """One model's compiler: its tokenizer as the grammar library reads it, its compile lane, the grammars it
    keeps, and `compiled` (or `constraints`) per request."""

    def __init__(self, prompts: PromptEncoder, vocab_size: int, eos_ids: frozenset[int], *,
                 deadline_s: float = COMPILE_DEADLINE_S, cache_entries: int = CACHE_ENTRIES):
        self.vocab_size, self.eos_ids, self.deadline_s = vocab_size, eos_ids, deadline_s
        self._prompts = prompts  # its tokenizer copy, read under its lock
        self._library_tokenizer = None
        self._lock = threading.Lock()
        self._kept = _Kept(cache_entries)
        self._compiling: dict[str, Future] = {}  # key -> the compile under way: the same schema compiles once
        self._compiling_lock = threading.RLock()  # re-entered when a compile is done before its callback is set
        self._lane = CompileLane(f"grammar-{prompts.model}")

    async def compiled(self, structure: Structure, n: int, metrics: GrammarMetrics | None = None
                       ) -> list["Constraint"]:
        """Fresh matchers for `n` sequences (one compile, or none when the grammar is kept), or the error that
        says why the grammar cannot be had: SchemaRefused (400), QueueFull (429), ModelUnavailable (503)."""
        key = await asyncio.to_thread(grammar_key, structure)  # bounded: the body's JSON, hashed
        entry = self._lookup(key, metrics)
        if entry is None:
            param = "response_format" if structure.schema is not None else "tools"
            entry = await self._lane.wait(self._compile(structure, key, metrics), self.deadline_s, param)
        return entry.constraints(n)

    def constraints(self, structure: Structure, n: int) -> list["Constraint"]:
        """`compiled` for a caller off the event loop (tests, benches): waits for the compile however long."""
        key = grammar_key(structure)
        entry = self._lookup(key, None) or self._compile(structure, key, None).result()
        return entry.constraints(n)

    def _lookup(self, key: str, metrics: GrammarMetrics | None) -> "_Compiled | _Refused | None":
        entry = self._kept.get(key)
        if metrics is not None:
            metrics.grammar_lookup(self._prompts.model, entry is not None)
        return entry

    def _compile(self, structure: Structure, key: str, metrics: GrammarMetrics | None) -> Future:
        """The compile of `key` under way, or a new one queued on the lane (QueueFull when it is full)."""
        with self._compiling_lock:
            future = self._compiling.get(key)
            if future is None:
                future = self._lane.submit(lambda: self._build(structure, key, metrics))
                self._compiling[key] = future
                future.add_done_callback(lambda done: self._finished(key, done))
            return future

    def _finished(self, key: str, future: Future) -> None:
        with self._compiling_lock:
            if self._compiling.get(key) is future:
                del self._compiling[key]

    def _build(self, structure: Structure, key: str, metrics: GrammarMetrics | None) -> "_Compiled | _Refused":
        """On a lane thread: check the bounds, compile, keep the outcome (a refusal too)."""
        started = time.perf_counter()
        try:
            entry: _Compiled | _Refused = self._matcher(structure)
        except SchemaRefused as refusal:
            entry = _Refused(refusal.limit, refusal.message, refusal.param)
        finally:
            if metrics is not None:
                metrics.grammar_compiled(self._prompts.model, time.perf_counter() - started)
        self._kept.put(key, entry)
        return entry

    def _matcher(self, structure: Structure) -> "_Compiled":
        """The library's matcher for `structure`, at its first step, or SchemaRefused naming what failed."""
        if structure.schema is not None:
            check_schema(structure.schema, "response_format")
        else:
            check_tools([tool["function"].get("parameters") or {"type": "object"} for tool in structure.tools])
        grammar, param = self._grammar(structure)
        tokenizer = self._tokenizer_for_library()
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise SchemaRefused("library", f"the JSON schema in {param} cannot be enforced: "
                                f"{_first_line(matcher.get_error())}; remove or rewrite that keyword (the worker "
                                "enforces schemas with llguidance; docs/worker.md says what it covers)", param=param)
        Constraint(matcher, tokenizer.vocab_size, self.eos_ids).bitmask()  # a schema that admits no value fails
        if matcher.is_error():                                              # here, not in the batch
            raise SchemaRefused("library", f"the JSON schema in {param} admits no value (the grammar library "
                                f"stops at once: {_first_line(matcher.get_error())}); look for a $ref that only "
                                "refers to itself or keywords that contradict each other", param=param)
        return _Compiled(matcher, tokenizer.vocab_size, self.eos_ids)

    def _grammar(self, structure: Structure) -> tuple[str, str]:
        try:
            if structure.schema is not None:
                return llguidance.LLMatcher.grammar_from_json_schema(
                    json.dumps(structure.schema), overrides=JSON_LAYOUT), "response_format"
            schemas = [json.dumps({**(tool["function"].get("parameters") or {"type": "object"}),
                                   "x-guidance": JSON_LAYOUT}) for tool in structure.tools]
        except ValueError as exc:  # the library's JSON reader refused it (its own nesting limit)
            raise SchemaRefused("library", f"the grammar library cannot read the JSON schema in response_format: "
                                f"{_first_line(str(exc))}", param="response_format") from exc
        lark = tools_grammar([t["function"]["name"] for t in structure.tools], schemas, structure.tool_choice,
                             structure.parallel)
        return llguidance.LLMatcher.grammar_from_lark(lark), "tools"

    def _tokenizer_for_library(self):
        with self._lock:
            if self._library_tokenizer is None:
                tokenizer = self._prompts.tokenizer
                if not isinstance(tokenizer, PreTrainedTokenizerFast):
                    raise InvalidRequest("StructuredOutputUnsupported", f"model {self._prompts.model} has a slow "
                                         "(Python) tokenizer, which the grammar library cannot read; serve it with "
                                         "a tokenizer.json (fast tokenizer) to use response_format or tools",
                                         param="response_format")
                vocab = max(self.vocab_size, len(tokenizer))  # the mask spans the logits and every token
                try:
                    with self._prompts.lock:
                        self._library_tokenizer = llguidance.hf.from_tokenizer(
                            tokenizer, n_vocab=vocab, eos_token=sorted(self.eos_ids) or None)
                except (ValueError, RuntimeError) as exc:
                    raise InvalidRequest("StructuredOutputUnsupported", f"the grammar library cannot read model "
                                         f"{self._prompts.model}'s tokenizer ({str(exc)[:200]}); response_format "
                                         "and tools are not available for it", param="response_format") from exc
            return self._library_tokenizer


def grammar_key(structure: Structure) -> str:
    """What names a grammar among those a model keeps: a digest of everything the grammar is built from."""
    text = json.dumps([structure.schema, structure.tools, structure.tool_choice, structure.parallel],
                      separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).hexdigest()


class _Compiled:
    """A compiled grammar at its first step: each request's matchers are copies of it."""

    def __init__(self, matcher, vocab_size: int, eos_ids: frozenset[int]):
        self._matcher, self._vocab_size, self._eos_ids = matcher, vocab_size, eos_ids
        self._lock = threading.Lock()

    def constraints(self, n: int) -> list["Constraint"]:
        with self._lock:
            return [Constraint(self._matcher.deep_copy(), self._vocab_size, self._eos_ids) for _ in range(n)]


class _Refused:
    """A refused grammar: each request asking for it again gets the same answer, without compiling."""

    def __init__(self, limit: str, message: str, param: str | None):
        self.limit, self.message, self.param = limit, message, param

    def constraints(self, n: int) -> list["Constraint"]:
        raise SchemaRefused(self.limit, self.message, param=self.param)


class _Kept:
    """At most `entries` grammars, the least recently used given up first."""

    def __init__(self, entries: int):
        self._entries = entries
        self._kept: collections.OrderedDict[str, _Compiled | _Refused] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> "_Compiled | _Refused | None":
        with self._lock:
            entry = self._kept.get(key)
            if entry is not None:
                self._kept.move_to_end(key)
            return entry

    def put(self, key: str, entry: "_Compiled | _Refused") -> None:
        with self._lock:
            self._kept[key] = entry
            self._kept.move_to_end(key)
            while len(self._kept) > self._entries:
                self._kept.popitem(last=False)


class Constraint:
    """One sequence's grammar state (engine.sampling.TokenConstraint): used by its executor thread only."""

    def __init__(self, matcher, vocab_size: int, eos_ids: frozenset[int]):
        self._matcher = matcher
        words = (vocab_size + 31) // 32
        self._bitmask = torch.empty(words, dtype=torch.int32, pin_memory=torch.cuda.is_available())
        self._eos_only = torch.zeros(words, dtype=torch.int32)
        for token in eos_ids:
            self._eos_only[token // 32] |= torch.tensor(1 << (token % 32)).to(torch.int32)
        self.finished = False

    def bitmask(self) -> torch.Tensor:
        """The tokens allowed next, bit per token, in host memory (pinned when CUDA is present: the copy to
        the logits' device does not block). A grammar that reached a dead end (or an error) allows only
        end-of-text: the answer ends there instead of leaving its row nothing to sample."""
        self._matcher.unsafe_compute_mask_ptr(self._bitmask.data_ptr(), self._bitmask.numel() * 4)
        if self._matcher.is_error() or not bool(self._bitmask.any()):
            self._bitmask.copy_(self._eos_only)
        return self._bitmask

    def advance(self, token: int) -> None:
        """Take the chosen token; `finished` once the grammar is complete (or, never expected, broken)."""
        accepted = self._matcher.consume_token(token)
        self.finished = not accepted or self._matcher.is_stopped()


def _first_line(message: str) -> str:
    return message.strip().splitlines()[0][:300] if message.strip() else "no detail given"
