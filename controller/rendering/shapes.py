"""Reading template output by its shape: one YAML parse per shape, not per rendered object.

Owns `read_output`, which returns what controller.inputs.yamlin.parse_documents returns for the
text a composition template rendered, faster when many renders share a shape, and with each document
its canonical text (controller.rendering.yamlout.dump) where the shape gives it. Every printed value
reaches a template's output through the `quote` filter as a double-quoted scalar, so the renders of
one template for 10,000 models differ, as a rule, only inside such scalars. The text with the inside
of every double-quoted scalar removed is its shape. The first text of a shape is parsed in full; its
double-quoted scalars, found by libyaml at exactly the places the shape's scanner found them, become
numbered holes in a copy of the parsed documents, which is kept once filling the holes back gives
exactly the parsed documents. A later text of that shape is the kept copy with its own scalars
filled in: the rest of its text is the same, so YAML reads the same structure around them.

Nothing but what libyaml itself would read back is taken on trust: a scalar is filled in only when
every character of it is printable ASCII or one of the escapes the `quote` filter writes (`\\"`,
`\\\\`, `\\uXXXX`, `\\UXXXXXXXX` outside the surrogates), and a key only when YAML's 1,024-character
limit on a simple key cannot apply. Anything else, a shape with anchors, merge keys, tags on a quoted
scalar or a quote YAML does not read as a scalar, and a text whose shape is not kept, is parsed in
full.

The canonical text of a shape's document is kept the same way: written once with a marker in each value
hole and cut there, so a later document is its pieces with its values written in between, as the writer
writes a one-line string anywhere. It is kept only when the pieces give the first document's own text
back, and used only when the key holes hold the first text's keys (which fix the order of the keys) and
no value is multi-line (a `|` block's indentation depends on where it stands); else the document is
written in full. Called by controller.rendering.render.
"""
from __future__ import annotations

import json
import re
from typing import NamedTuple

import yaml

from controller.inputs.canonical import QUOTED_INSIDE, decode_escapes
from controller.inputs.yamlin import parse_documents
from controller.rendering.yamlout import NotData, dump, written

_TOKEN = re.compile(r'"[^"\\\n]*(?:\\.[^"\\\n]*)*"')  # a one-line double-quoted scalar, as YAML's scanner ends it
_SPLIT = re.compile(f"({_TOKEN.pattern})")  # text, token, text, token, ..., text
_PRINTABLE = re.compile(r'[ -~]*\Z')
_ESCAPED = re.compile(QUOTED_INSIDE + r"\Z")  # printable or the filter's escapes
_PRINTABLE_LINES = re.compile(r'[ -~\n]*\Z')
_STR_TAG = "tag:yaml.org,2002:str"
_MAX_KEY_CHARS = 1000  # YAML refuses a simple key of more than 1,024 characters: a longer key is parsed in full
_MAX_SHAPES = 1024
_NOT_KEPT = object()


class _Hole:
    """Where the n-th double-quoted scalar of a text goes."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


_SHAPES: dict[str, object] = {}  # shape -> _Kept, or _NOT_KEPT


class _Kept(NamedTuple):
    documents: list[object]  # the documents with holes
    holes: int
    key_holes: frozenset[int]
    keys: tuple[str, ...]  # the key holes' values in the first text: the order of the keys is known for these
    canonical: tuple[tuple[tuple[str, ...], tuple[int, ...]] | None, ...]  # per document: its dump's text
    # pieces and the value holes between them, or None where it has none


def read_output(text: str) -> list[tuple[object, str | None]]:
    """parse_documents(text) for template output (no limits, repeated keys override), each document with
    its canonical text (controller.rendering.yamlout.dump) when its shape gives it (else None)."""
    parts = _SPLIT.split(text)
    tokens = parts[1::2]
    shape = '""'.join(parts[0::2])
    kept = _SHAPES.get(shape)
    if kept is None:
        documents = parse_documents(text)
        if len(_SHAPES) < _MAX_SHAPES:
            _SHAPES[shape] = _keep(text, documents)
        return [(document, None) for document in documents]
    if kept is not _NOT_KEPT:
        values = _values(text, tokens, kept.key_holes) if len(tokens) == kept.holes else None
        if values is not None:
            known = tuple(values[index] for index in sorted(kept.key_holes)) == kept.keys
            return [(_fill(shaped, values), _canonical(pieces, values) if known and pieces else None)
                    for shaped, pieces in zip(kept.documents, kept.canonical)]
    return [(document, None) for document in parse_documents(text)]


def _values(text: str, tokens: list[str], key_holes: frozenset[int]) -> list[str] | None:
    """Each double-quoted scalar's value, or None when one is not certain to read as the kept shape says."""
    plain_text = _PRINTABLE_LINES.match(text) is not None  # then only escapes need a look
    values = []
    for index, token in enumerate(tokens):
        raw = token[1:-1]
        if "\\" in raw:
            raw = _unescape(raw, plain_text)
            if raw is None:
                return None
        elif not plain_text and not _PRINTABLE.match(raw):
            return None
        if index in key_holes and len(token) > _MAX_KEY_CHARS:
            return None
        values.append(raw)
    return values


def _unescape(raw: str, printable: bool) -> str | None:
    """The value of a double-quoted scalar's inside that holds only the quote filter's escapes, else None.
    `printable`: every character of it is known to be printable ASCII."""
    if printable and "\\" not in raw.replace("\\\\", "").replace('\\"', "").replace("\\u000a", ""):
        try:  # only escaped backslashes, quotes and newlines (a worker's config): JSON reads them as YAML does
            return json.loads(f'"{raw}"')
        except ValueError:  # a bare `"`, which no double-quoted scalar holds
            return None
    if not _ESCAPED.match(raw):
        return None
    try:
        return decode_escapes(raw)
    except ValueError:  # a surrogate or a code point beyond Unicode
        return None


def _keep(text: str, documents: list[object]) -> object:
    """The documents with a hole for each double-quoted scalar, if filling them in gives `documents` back."""
    spans = [match.span() for match in _TOKEN.finditer(text)]
    reading = _Reading(text, spans, yaml.CSafeLoader(text))
    try:
        shaped = []
        while reading.loader.check_node():
            reading.seen.clear()  # (node ids are per document: an alias never crosses documents)
            shaped.append(reading.with_holes(reading.loader.get_node()))
    except (_Unshaped, yaml.YAMLError, RecursionError, ValueError, OverflowError):
        return _NOT_KEPT
    finally:
        reading.loader.dispose()
    key_holes = frozenset(reading.key_holes)
    values = _values(text, [text[start:end] for start, end in spans], key_holes)
    if reading.used != set(range(len(spans))) or values is None or _fill(shaped, values) != documents:
        return _NOT_KEPT
    return _Kept(shaped, len(spans), key_holes, tuple(values[index] for index in sorted(key_holes)),
                 tuple(_pieces(document, values, key_holes, filled) for document, filled in zip(shaped, documents)))


_MARKED = re.compile(r'"\\u0000(\d+)\\u0000"')  # how the writer writes a marked hole: "\u0000<n>\u0000"


def _pieces(shaped: object, values: list[str], key_holes: frozenset[int], document: object
            ) -> tuple[tuple[str, ...], tuple[int, ...]] | None:
    """The canonical text of a document of this shape, cut at its value holes: written with a marker in each
    (a NUL can be in no constant of YAML text, so the writer quotes a marker as nothing else), cut where each
    marker came out; kept only if it gives `document`'s own text back with the first text's values."""
    marked = [value if index in key_holes else f"\0{index}\0" for index, value in enumerate(values)]
    try:
        parts = _MARKED.split(dump(_fill(shaped, marked)))
    except (NotData, RecursionError):
        return None  # not JSON data (a date, bytes): the writer refuses it anyway
    pieces = (tuple(parts[0::2]), tuple(int(index) for index in parts[1::2]))
    holes = pieces[1]
    if len(set(holes)) != len(holes) or any(index >= len(values) or index in key_holes for index in holes):
        return None  # a key that reads like a marker
    return pieces if _canonical(pieces, values) == dump(document) else None


def _canonical(pieces: tuple[tuple[str, ...], tuple[int, ...]], values: list[str]) -> str | None:
    """The text the pieces give with these values, or None when a value is multi-line (a `|` block: its
    indentation depends on where it stands)."""
    texts, holes = pieces
    out = [texts[0]]
    for hole, text in zip(holes, texts[1:]):
        value = values[hole]
        if "\n" in value:
            return None
        out.append(written(value))
        out.append(text)
    return "".join(out)


class _Unshaped(Exception):
    """A construct the shape cannot stand for (anchors, merge keys, a tagged quoted scalar)."""


class _Reading:
    """One text's nodes turned into documents with holes, each node read once (an alias is _Unshaped)."""

    def __init__(self, text: str, spans: list[tuple[int, int]], loader: yaml.CSafeLoader) -> None:
        self.text, self.spans, self.loader = text, spans, loader
        self.starts = {start: index for index, (start, _end) in enumerate(spans)}
        self.used: set[int] = set()
        self.key_holes: set[int] = set()
        self.seen: set[int] = set()

    def with_holes(self, node: yaml.Node, key: bool = False) -> object:
        if id(node) in self.seen:
            raise _Unshaped  # an alias: one node in two places
        self.seen.add(id(node))
        if isinstance(node, yaml.ScalarNode):
            return self._scalar(node, key)
        if isinstance(node, yaml.SequenceNode):
            return [self.with_holes(item) for item in node.value]
        if node.tag != "tag:yaml.org,2002:map":
            raise _Unshaped
        pairs = []
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                raise _Unshaped
            pairs.append((self.with_holes(key_node, key=True), self.with_holes(value_node)))
        return _Mapping(pairs)

    def _scalar(self, node: yaml.ScalarNode, key: bool) -> object:
        index = self.starts.get(node.start_mark.index)
        if index is None:
            if node.style == '"':
                raise _Unshaped  # a double-quoted scalar the scanner above did not find (a multi-line one)
            return node.value if node.tag == _STR_TAG else self.loader.construct_object(node, deep=True)
        end = self.spans[index][1]
        if node.style != '"' or node.tag != _STR_TAG or node.end_mark.index != end or index in self.used:
            raise _Unshaped
        if key and self.text[end:end + 1] != ":":
            raise _Unshaped  # a key whose colon is further away: its length limit would depend on the gap
        self.used.add(index)
        if key:
            self.key_holes.add(index)
        return _Hole(index)


class _Mapping(tuple):
    """A kept mapping: its (key, value) pairs in order (keys may be holes, so no dict until filled)."""


def _fill(shaped: object, values: list[str]) -> object:
    kind = type(shaped)
    if kind is _Hole:
        return values[shaped.index]
    if kind is _Mapping:
        return {_fill(key, values): _fill(value, values) for key, value in shaped}
    if kind is list:
        return [_fill(item, values) for item in shaped]
    return shaped  # a scalar: str, int, float, bool, None, a date (all immutable)
