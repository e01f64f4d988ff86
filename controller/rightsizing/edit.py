"""Recommend's edit of a user's ElasticModel file: `spec.memoryBudget` changes, every other byte stays.

The document is found by what it is (apiVersion, kind ElasticModel, metadata.namespace and
name), never by its position, so a directive, a comment-only or an empty document cannot make
the edit land on another model. It is refused (BudgetEditError, reason and fix, for that model
only) when the file has a document that does not parse, when the model is not in it exactly
once, and when its document uses a form whose edit could reach further than one scalar:
anchors, aliases, merge keys (`<<`), block scalars (`|`, `>`), flow style (`{}`, `[]`) or
explicit tags. Otherwise ruamel.yaml says where the budget's scalar starts; the edit replaces
that token alone in the original text, in the quoting style the user wrote, and the result is
parsed again to check that this document's budget, and nothing else in any document, changed.
So comments, blank lines, indentation, other documents and the file's line endings are
byte-for-byte the user's. Pure: called by the right-sizing pass (controller.rightsizing.apply).
"""
from __future__ import annotations

import io

import yaml
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from contract.quantity import parse_bytes
from contract.wire import API_VERSION
from controller.types import DEFAULT_NAMESPACE

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
    except (YAMLError, ValueError, RecursionError):
        raise BudgetEditError("UnparsableModelFile", "a document in the file does not parse; fix it (`gpushare "
                              "validate` names it) so the budget can be edited safely") from None


def _identity(doc) -> tuple | None:
    if not isinstance(doc, dict) or not isinstance(doc.get("metadata"), dict):
        return None
    meta = doc["metadata"]
    return doc.get("apiVersion"), doc.get("kind"), meta.get("namespace") or DEFAULT_NAMESPACE, meta.get("name")


def find_document(text: str, namespace: str, name: str) -> int:
    """The index of the one ElasticModel document `namespace/name` in `text`, after checking that every document
    parses and that this one holds no form an in-place edit could not contain."""
    try:
        events = list(yaml.parse(text, Loader=yaml.SafeLoader))
        docs = list(yaml.safe_load_all(text))
    except (yaml.YAMLError, ValueError, RecursionError):
        raise BudgetEditError("UnparsableModelFile", "a document in the file does not parse; fix it (`gpushare "
                              "validate` names it) so the budget can be edited safely") from None
    wanted = (API_VERSION, "ElasticModel", namespace, name)
    found = [i for i, doc in enumerate(docs) if _identity(doc) == wanted]
    if len(found) != 1:
        raise BudgetEditError("ModelDocumentNotFound" if not found else "ModelDocumentAmbiguous",
                              f"the file holds {len(found)} ElasticModel documents {namespace}/{name} "
                              f"({API_VERSION}); keep exactly one")
    odd = _odd_forms(events, found[0])
    if odd:
        raise BudgetEditError("BudgetFormNotEditable", f"the document of {namespace}/{name} uses {', '.join(odd)}, "
                              "which an in-place edit of spec.memoryBudget cannot keep contained; write that "
                              "document in plain block style (no anchors, aliases, merge keys, block scalars, flow "
                              "collections or tags) or change the budget by hand")
    return found[0]


def _odd_forms(events: list, document: int) -> list[str]:
    """The forms in document `document` of the event stream that the edit refuses, by name."""
    index, odd = -1, set()
    for event in events:
        if isinstance(event, yaml.DocumentStartEvent):
            index += 1
        if index != document:
            continue
        if isinstance(event, yaml.AliasEvent):
            odd.add("aliases")
        elif getattr(event, "anchor", None):
            odd.add("anchors")
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            if event.flow_style:
                odd.add("flow style")
            if event.tag and not event.implicit:
                odd.add("tags")
        if isinstance(event, yaml.ScalarEvent):
            if event.style in ("|", ">"):
                odd.add("block scalars")
            if event.value == "<<" and event.style is None:
                odd.add("merge keys")
            if event.tag and not any(event.implicit):
                odd.add("tags")
    return sorted(odd)


def _offset(text: str, line: int, column: int) -> int:
    lines = text.splitlines(keepends=True)
    return sum(len(x) for x in lines[:line]) + column


def set_memory_budget(text: str, namespace: str, name: str, nbytes: int) -> str:
    """`text` with ElasticModel `namespace/name`'s spec.memoryBudget set to `nbytes` (as a binary quantity)."""
    document = find_document(text, namespace, name)
    docs = _documents(text)
    if len(docs) <= document or _identity(docs[document]) != (API_VERSION, "ElasticModel", namespace, name):
        raise BudgetEditError("UnparsableModelFile", "the file's documents parse differently in the two YAML "
                              "readers; remove directives and empty documents around the model")
    if not isinstance(docs[document].get("spec"), dict):
        raise BudgetEditError("ModelDocumentNotFound", f"{namespace}/{name} has no spec mapping")
    spec = docs[document]["spec"]
    if "memoryBudget" not in spec:
        raise BudgetEditError("ModelDocumentNotFound", f"{namespace}/{name} has no spec.memoryBudget")
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
