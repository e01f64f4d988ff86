"""Prompts to token ids: tokenising, chat templates (with tools) and the vocabulary check.

Owns turning a request's prompt or messages into the token ids a Generation starts
from. It tokenises with its own copy of the model's tokenizer, so a long prompt
being tokenised (api.py runs this in a worker thread, off the event loop) never
holds up the executor, which decodes with the original. Built once per loaded model
by worker.runtime.ServedModel; called by api.py.
"""
from __future__ import annotations

import copy
import threading

from jinja2 import Environment, TemplateError, meta

from .errors import InvalidRequest


class PromptEncoder:
    def __init__(self, tokenizer, model: str, vocab_size: int):
        self.tokenizer = copy.deepcopy(tokenizer)
        self.model = model
        self.vocab_size = vocab_size
        self.lock = threading.Lock()  # a fast tokenizer is not safe to call from two threads at once
        template = getattr(tokenizer, "chat_template", None)
        self.has_chat_template = bool(template)
        self.supports_tools = bool(template) and _mentions(template, "tools")

    def encode(self, text: str) -> list[int]:
        with self.lock:
            return self.tokenizer.encode(text, add_special_tokens=True)

    def chat(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """The chat template applied to `messages` (and `tools`), tokenised."""
        if not self.has_chat_template:
            raise InvalidRequest("NoChatTemplate", f"model {self.model} has no chat template; use "
                                 "/v1/completions or serve a model whose tokenizer defines one", param="messages")
        if tools and not self.supports_tools:
            raise InvalidRequest("ToolsUnsupported", f"model {self.model}'s chat template does not take tools; "
                                 "omit tools (or describe them in a message) or serve a model whose template "
                                 "renders them", param="tools")
        extra = {"tools": tools} if tools else {}
        with self.lock:
            try:
                text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                          **extra)
            except (TemplateError, TypeError, ValueError) as exc:  # the template refuses this conversation
                raise InvalidRequest("ChatTemplateRejected", f"model {self.model}'s chat template cannot render "
                                     f"these messages: {str(exc)[:300]}; check the roles' order and content",
                                     param="messages") from exc
            return self.tokenizer.encode(text, add_special_tokens=False)

    def check_ids(self, ids: list[int] | tuple[int, ...], param: str) -> None:
        """InvalidRequest unless every id is a token of the model's vocabulary [0, vocab_size)."""
        bad = next((i for i in ids if not 0 <= i < self.vocab_size), None)
        if bad is not None:
            raise InvalidRequest("TokenOutOfVocabulary", f"{param} holds token id {str(bad)[:30]}, outside model "
                                 f"{self.model}'s vocabulary of {self.vocab_size} tokens (ids 0 to "
                                 f"{self.vocab_size - 1})", param=param)


def _mentions(template: str | dict, variable: str) -> bool:
    """Whether a chat template (or any of a tokenizer's named templates) reads `variable`."""
    sources = template.values() if isinstance(template, dict) else [template]
    env = Environment()
    try:
        return any(variable in meta.find_undeclared_variables(env.parse(source)) for source in sources)
    except TemplateError:
        return False
