"""Grammars for structured output: a request's Structure (protocol.py) compiled into token masks.

Owns the grammar library (llguidance; why this one: docs/worker.md), the JSON layout a
constrained answer has (no free whitespace: `", "` and `": "` separators only, so an answer's
length is bounded by its content), the refusal of a schema keyword the library does not
implement (a 400 naming it), and one sequence's matcher state (`Constraint`, which the engine
asks for the next bitmask and tells the chosen token). The tool-call grammar's wording is
worker/tools.py's. Built once per served model (worker.runtime.ServedModel: the library's view
of the tokenizer is built on first use, about a second for a 128k vocabulary); api.py calls
`constraints` in a worker thread, never on the event loop.
"""
from __future__ import annotations

import json
import threading

import llguidance
import llguidance.hf
import torch
from transformers import PreTrainedTokenizerFast

from .errors import InvalidRequest
from .prompts import PromptEncoder
from .protocol import Structure
from .tools import tools_grammar

# Overrides any "x-guidance" a schema carries: whitespace stays bounded whatever the client sends.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ", "lenient": False}


class Grammars:
    """One model's compiler: its tokenizer as the grammar library reads it, and `constraints` per request."""

    def __init__(self, prompts: PromptEncoder, vocab_size: int, eos_ids: frozenset[int]):
        self.vocab_size, self.eos_ids = vocab_size, eos_ids
        self._prompts = prompts  # its tokenizer copy, read under its lock
        self._library_tokenizer = None
        self._lock = threading.Lock()

    def constraints(self, structure: Structure, n: int) -> list["Constraint"]:
        """Fresh matchers for `n` sequences (one compile), or InvalidRequest naming what the grammar cannot
        express."""
        grammar, param = self._grammar(structure)
        tokenizer = self._tokenizer_for_library()
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise InvalidRequest("UnsupportedSchema", f"the JSON schema in {param} cannot be enforced: "
                                 f"{_first_line(matcher.get_error())}; remove or rewrite that keyword (the worker "
                                 "enforces schemas with llguidance; docs/worker.md says what it covers)", param=param)
        first = Constraint(matcher, tokenizer.vocab_size, self.eos_ids)
        first.bitmask()  # the first step's mask: a schema that admits no value fails here, not in the batch
        if matcher.is_error():
            raise InvalidRequest("UnsupportedSchema", f"the JSON schema in {param} admits no value (the grammar "
                                 f"library stops at once: {_first_line(matcher.get_error())}); look for a $ref "
                                 "that only refers to itself or keywords that contradict each other", param=param)
        return [first] + [Constraint(matcher.deep_copy(), tokenizer.vocab_size, self.eos_ids) for _ in range(n - 1)]

    def _grammar(self, structure: Structure) -> tuple[str, str]:
        if structure.schema is not None:
            return llguidance.LLMatcher.grammar_from_json_schema(
                json.dumps(structure.schema), overrides=JSON_LAYOUT), "response_format"
        schemas = [json.dumps({**(tool["function"].get("parameters") or {"type": "object"}),
                               "x-guidance": JSON_LAYOUT}) for tool in structure.tools]
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
