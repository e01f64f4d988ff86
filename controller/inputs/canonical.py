"""Reading YAML in the exact layout gpushare's own writer produces, line by line, without a YAML parser.

Owns `from_canonical`, the first of `controller.inputs.yamlin.parse_documents`'s three paths: decision records
and rendered files are read back by the thousand, and a text in the writer's one layout (sorted keys, block
style, two-space indentation, sequence entries at their key's indentation, plain scalars only where no YAML 1.1
resolver reads anything else, every other string double-quoted with `\\"`, `\\\\`, `\\uXXXX` and `\\UXXXXXXXX`
escapes or a clipped `|` block) is read line by line with string operations and a regular expression per
new line; a short line already read (`kind: ElasticModel`, `    mode: resident` recur in every record) costs
one dictionary lookup. The grammar is defined here, and only here: this module imports nothing from the writer,
whose plain scalars (`PLAIN`, `RESERVED`) and the quote filter's escapes (`QUOTED_INSIDE`, `decode_escapes`)
controller.rendering.yamlout and controller.rendering.shapes take from it, nor from the reader that calls it
(controller.inputs.yamlin): the `limits` both take are controller.inputs.yaml_limits'.

It answers only where it is certain of PyYAML's (CSafeLoader's) answer, and returns None at the first line
that strays in any way from that layout: a comment, `---`, a flow collection other than `{}`/`[]`, an anchor,
tag or single quote, a tab or trailing space outside a `|` block, keys out of sorted order (so never a repeated
key), indentation other than the writer's, a plain scalar outside a conservative pattern (`1_000`, `0x1F`,
`012`, `1:30`, `+1`, `.5`, `yes`, `~`, timestamps, `=`, `<<` all stray), an escape other than those four, a
surrogate, a key longer than a YAML simple key may be, or a document near `limits`. Most other texts stray at
their first line, so trying this path first costs them next to nothing.
"""
from __future__ import annotations

import math
import re
import sys

from controller.inputs.yaml_limits import YamlLimits

# The layout's own grammar, which the writer (controller.rendering.yamlout) and the shapes of template output
# (controller.rendering.shapes) use too. A plain scalar: starts with a letter, '_', '/' or one or two '-' and a
# letter (flags such as --config); then only characters that never start YAML syntax inside a block-context
# plain scalar; never ends with ':'. No YAML 1.1 resolver reads it as anything but a string, except RESERVED.
PLAIN = r"(?:[A-Za-z_/]|--?[A-Za-z])(?:[A-Za-z0-9_./+:-]*[A-Za-z0-9_./+-])?"
# Words a YAML 1.1 resolver (PyYAML, go-yaml v2) reads as booleans or null, and y/n (which some read as booleans).
RESERVED = frozenset(w for base in ("y", "n", "yes", "no", "true", "false", "on", "off", "null")
                     for w in (base, base.capitalize(), base.upper()))
# The inside of a double-quoted scalar the quote filter writes: printable ASCII and four escapes.
QUOTED_INSIDE = r'(?:[ !#-\[\]-~]++|\\(?:["\\]|u[0-9A-Fa-f]{4}|U[0-9A-Fa-f]{8}))*+'
_QUOTED = f'"({QUOTED_INSIDE})"'
_KEY = re.compile(rf"(?:({PLAIN})|{_QUOTED})\Z")
_QUOTED_START = re.compile(_QUOTED)
_VALUE = re.compile(r"(?:(-?(?:0|[1-9][0-9]*+))"  # an int
                    r"|(-?(?:0|[1-9][0-9]*+)\.[0-9]++(?:e[-+][0-9]++)?)"  # a float as repr() writes it, with a dot
                    r"|(null|true|false|\.nan|\.inf|-\.inf|\{\}|\[\]|\|)"  # a word, an empty collection, a `|` block
                    rf"|({PLAIN})|{_QUOTED})\Z")
_INT, _FLOAT, _WORD, _PLAIN_STR = 1, 2, 3, 4  # _VALUE's groups; the fifth is a quoted string


class _Opens:
    """A value written inline that is read beyond its text: `{}` and `[]` (a new one each time), a `|` block."""


_EMPTY_MAP, _EMPTY_SEQ, _LITERAL, _OPENS_BLOCK = _Opens(), _Opens(), _Opens(), _Opens()  # the last: `key:`
_WORDS = {"null": None, "true": True, "false": False, ".nan": math.nan, ".inf": math.inf, "-.inf": -math.inf,
          "{}": _EMPTY_MAP, "[]": _EMPTY_SEQ, "|": _LITERAL}
_ESCAPE = re.compile(r'\\(?:(["\\])|u([0-9A-Fa-f]{4})|U([0-9A-Fa-f]{8}))')
_BLOCK_LINE = re.compile(r"[\t -~]*+\Z")  # a `|` block's line: printable ASCII and tabs
_END = "\0"  # stands for the text's final newline: no line form matches it, so every block ends there
_MISS = object()
_KEY_MAX = 1000  # a YAML simple key must end within 1024 characters of its start
_UNLIMITED_DEPTH = 500  # deeper without limits: the other paths answer
_INT_DIGITS_MAX = min(4000, sys.get_int_max_str_digits() or 4000)  # longer: int() refuses, the other paths answer
# Lines recur across records (`kind: ElasticModel`, `    mode: resident`): each distinct short line is read once.
_ENTRIES: dict[str, tuple[int, str, object]] = {}  # a mapping entry's line -> (indentation, key, value)
_ITEMS: dict[str, tuple[int, object]] = {}  # a sequence item's line -> (indentation, value)
_CACHED_MAX, _CACHED_CHARS = 50_000, 100


class _Stray(Exception):
    """The text left the canonical layout: the other paths read it."""


def from_canonical(text: str, limits: YamlLimits | None) -> list[object] | None:
    """[the one document of `text`] as the node path builds it, or None where `text` is not in the canonical
    layout or comes near `limits` (the other paths then answer, or refuse with the reference error).

    Every node takes at least one character of its own (a scalar its text, `{}`/`[]` their brackets, a mapping
    its first key's `:`, a sequence its first `- `), so a text shorter than `max_nodes` is within it."""
    if not text or text[0] not in _FIRST or (limits is not None and len(text) >= limits.max_nodes):
        return None
    lines = text.split("\n")
    if lines[-1] != "":
        return None
    lines[-1] = _END
    room = (limits.max_depth if limits is not None else _UNLIMITED_DEPTH) - 1
    try:
        if lines[0].startswith("- "):
            value, end = _sequence(lines, 0, 0, room)
        else:
            value, end = _mapping(lines, 0, 0, room)
    except _Stray:
        return None
    return [value] if end == len(lines) - 1 else None


_FIRST = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_/-\"")


# `room` is how many more levels fit below the current one: a collection whose scalars would reach
# max_depth strays (the node path refuses beyond it). A block ends at the first line not its own.

def _mapping(lines: list[str], i: int, indent: int, room: int) -> tuple[dict, int]:
    """The block mapping whose keys sit at `indent` from line i; (mapping, the first line after it)."""
    if room < 2:
        raise _Stray
    entries = _ENTRIES
    out: dict = {}
    previous = None
    while True:
        line = lines[i]
        entry = entries.get(line)
        if entry is None and (entry := _new_entry(line, indent)) is None:
            break
        at, key, value = entry
        if at != indent:
            break
        if previous is not None and key <= previous:
            raise _Stray  # out of sorted order, or repeated
        previous = key
        if type(value) is _Opens:
            if value is not _OPENS_BLOCK:
                out[key], i = _opened(value, lines, i + 1, indent + 2)
            elif lines[i + 1].startswith(" " * indent + "- "):  # a sequence at the key's indentation
                out[key], i = _sequence(lines, i + 1, indent, room - 1)
            else:  # or a mapping below the key
                out[key], i = _mapping(lines, i + 1, indent + 2, room - 1)
            continue
        out[key] = value
        i += 1
    if not out:
        raise _Stray
    return out, i


def _sequence(lines: list[str], i: int, indent: int, room: int) -> tuple[list, int]:
    """The block sequence whose `- ` sit at `indent` from line i; (sequence, the first line after it)."""
    if room < 2:
        raise _Stray
    items = _ITEMS
    out: list = []
    while True:
        line = lines[i]
        item = items.get(line)
        if item is None and (item := _new_item(line, indent)) is None:
            break
        at, value = item
        if at != indent:
            break
        if value is _OPENS_BLOCK:  # a collection starts on the dash's line: read it as if it stood below
            rest = line[indent + 2:]
            lines[i] = " " * (indent + 2) + rest
            if rest.startswith("- "):
                value, i = _sequence(lines, i, indent + 2, room - 1)
            else:
                value, i = _mapping(lines, i, indent + 2, room - 1)
        elif type(value) is _Opens:
            value, i = _opened(value, lines, i + 1, indent + 2)
        else:
            i += 1
        out.append(value)
    if not out:
        raise _Stray
    return out, i


def _new_entry(line: str, indent: int) -> tuple[int, str, object] | None:
    """(indent, key, value) of a mapping entry at `indent` (its value _OPENS_BLOCK for `key:`), or None where
    `line` is no such entry (the mapping ends there)."""
    body = line[indent:]
    if not line.startswith(" " * indent) or body[:1] == " ":
        return None
    if body[:1] == '"':  # a quoted key may hold ": "
        match = _QUOTED_START.match(body)
        if match is None:
            return None
        written, rest = match[0], body[match.end():]
        if rest == ":":
            text = None
        elif rest[:2] == ": ":
            text = rest[2:]
        else:
            return None
    else:
        written, colon, text = body.partition(": ")  # a plain key holds no space
        if not colon:
            if body[-1:] != ":":
                return None
            written, text = body[:-1], None
    key = _key(written)
    if key is None:
        return None
    value = _OPENS_BLOCK if text is None else _value(text)
    if value is _MISS:
        raise _Stray
    entry = (indent, key, value)
    if len(line) <= _CACHED_CHARS and len(_ENTRIES) < _CACHED_MAX:
        _ENTRIES[line] = entry
    return entry


def _new_item(line: str, indent: int) -> tuple[int, object] | None:
    """(indent, value) of a sequence item at `indent` (_OPENS_BLOCK where a collection starts on its line), or None
    where `line` is no such item (the sequence ends there)."""
    if not line.startswith(" " * indent + "- "):
        return None
    value = _value(line[indent + 2:])
    item = (indent, _OPENS_BLOCK if value is _MISS else value)
    if value is not _MISS and len(line) <= _CACHED_CHARS and len(_ITEMS) < _CACHED_MAX:
        _ITEMS[line] = item
    return item


def _key(written: str) -> str | None:
    """The key `written` stands for, or None where it is not a key in the canonical layout."""
    match = _KEY.match(written)
    if match is None or len(written) >= _KEY_MAX or match[1] in RESERVED:
        return None
    return match[1] if match[1] is not None else _unescape(match[2])


def _value(text: str) -> object:
    """The scalar (or _Opens) `text` stands for; _MISS where it is no inline value (a collection may start there)."""
    match = _VALUE.match(text)
    if match is None:
        return _MISS
    kind = match.lastindex
    if kind == _INT:
        if len(text) > _INT_DIGITS_MAX:
            raise _Stray
        return int(text)
    if kind == _FLOAT:
        return float(text)
    if kind == _WORD:
        return _WORDS[text]
    if kind == _PLAIN_STR:
        if text in RESERVED:
            raise _Stray
        return text
    return _unescape(match[kind])


def _opened(value: _Opens, lines: list[str], i: int, indent: int) -> tuple[object, int]:
    """The value of `{}`, `[]` or `|` (whose block lines start at i, at `indent`) and the next line."""
    if value is _EMPTY_MAP:
        return {}, i
    if value is _EMPTY_SEQ:
        return [], i
    pad = " " * indent
    body = []
    while (line := lines[i]).startswith(pad) or line == "":
        text = line[indent:]
        if text and (not _BLOCK_LINE.match(text) or text.isspace()):
            raise _Stray
        body.append(text)
        i += 1
    if not body or not body[0] or body[0][0] in " \t" or not body[-1]:
        raise _Stray  # no first line, a first line the parser would re-indent, or blank lines clipped away
    return "\n".join(body) + "\n", i


def _unescape(body: str) -> str:
    try:
        return decode_escapes(body)
    except ValueError:
        raise _Stray from None


def decode_escapes(body: str) -> str:
    """The value of a double-quoted scalar's inside that matches QUOTED_INSIDE; ValueError for an escape of a
    surrogate or of a code point beyond Unicode, which libyaml refuses."""
    return _ESCAPE.sub(_decoded, body) if "\\" in body else body


def _decoded(match: re.Match) -> str:
    if match[1] is not None:
        return match[1]
    code = int(match[2] or match[3], 16)
    if 0xD800 <= code <= 0xDFFF or code > 0x10FFFF:
        raise ValueError(code)
    return chr(code)
