"""Recommend's edit of a user's ElasticModel file: `spec.memoryBudget` changes, every other byte stays.

ruamel.yaml parses the file round-trip (comments, key order, quoting and flow style
kept in its nodes) and says where the budget's scalar starts; the edit replaces that
token alone in the original text, in the quoting style the user wrote, and the
result is parsed again to check that this document's budget, and nothing else in any
document, changed. So comments, blank lines, indentation, other documents and the
file's line endings are byte-for-byte the user's. Pure: called by the Recommend step.
"""
from __future__ import annotations

import io

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from contract.quantity import parse_bytes

_PLAIN_END = (",", "}", "]", " #", "\t#", "\n", "\r")


class BudgetEditError(ValueError):
    """The file cannot be edited safely; `reason` is PascalCase."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def format_quantity(nbytes: int) -> str:
    """The shortest exact binary quantity: 5Gi, 4915Mi, or plain bytes."""
    for unit, size in (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if nbytes % size == 0:
            return f"{nbytes // size}{unit}"
    return str(nbytes)


def _documents(text: str) -> list:
    try:
        return list(YAML(typ="rt").load_all(io.StringIO(text)))
    except YAMLError as exc:
        raise BudgetEditError("UnparsableModelFile", f"the file is not YAML ruamel.yaml can round-trip: {exc}") from exc


def _offset(text: str, line: int, column: int) -> int:
    lines = text.splitlines(keepends=True)
    return sum(len(x) for x in lines[:line]) + column


def set_memory_budget(text: str, document: int, nbytes: int) -> str:
    """`text` with document `document`'s spec.memoryBudget set to `nbytes` (as a binary quantity)."""
    docs = _documents(text)
    if document >= len(docs) or not isinstance(docs[document], dict) or not isinstance(docs[document].get("spec"), dict):
        raise BudgetEditError("ModelDocumentNotFound", f"document {document} of the file has no spec mapping")
    spec = docs[document]["spec"]
    if "memoryBudget" not in spec:
        raise BudgetEditError("ModelDocumentNotFound", f"document {document} has no spec.memoryBudget")
    line, column = spec.lc.value("memoryBudget")
    start = _offset(text, line, column)
    quote = text[start]
    if quote in "*&!":
        raise BudgetEditError("BudgetNotPlain", "spec.memoryBudget is an alias, anchor or tagged value; "
                              "write it as a plain quantity so a recommendation can edit it")
    if quote in "\"'":
        end = text.index(quote, start + 1) + 1
        new = f"{quote}{format_quantity(nbytes)}{quote}"
    else:
        end = min((i for i in (text.find(stop, start) for stop in _PLAIN_END) if i != -1), default=len(text))
        while end > start and text[end - 1] in " \t":
            end -= 1
        new = format_quantity(nbytes)
    edited = text[:start] + new + text[end:]
    _check(docs, _documents(edited), document, nbytes)
    return edited


def _check(before: list, after: list, document: int, nbytes: int) -> None:
    if len(before) != len(after) or parse_bytes(after[document]["spec"]["memoryBudget"]) != nbytes:
        raise BudgetEditError("EditNotContained", "editing spec.memoryBudget in place would change the file's "
                              "structure; write the budget as a one-line scalar")
    after[document]["spec"]["memoryBudget"] = before[document]["spec"]["memoryBudget"]
    if _plain(before) != _plain(after):
        raise BudgetEditError("EditNotContained", "editing spec.memoryBudget would change another value")


def _plain(value):
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value
