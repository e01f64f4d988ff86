"""Canonical YAML for every generated file: sorted keys, block style, no timestamps, fast.

Owns the one writer of generated YAML (rendered manifests, decisions). It handles
exactly the JSON data model (dict, list, str, int, float, bool, None), which is all
a Kubernetes object holds, and replaces PyYAML's representer, which dominated a
10,000-model pass (bench/reconcile_scale.py). Strings are plain only when they match a conservative
pattern that no YAML 1.1 or 1.2 parser reads as anything but that string; otherwise
they are double-quoted with every non-ASCII or control character escaped
(controller.rendering.quote.yaml_quote), or written as a `|` block when they are multi-line
text that a block keeps byte for byte. A property test checks that PyYAML reads back
exactly what was written. Called by controller.rendering.compose and controller.rendering.shapes
(`written`).
"""
from __future__ import annotations

import math
import re

from controller.inputs.canonical import PLAIN, RESERVED
from controller.rendering.quote import yaml_quote

_PLAIN = re.compile(PLAIN + r"\Z")  # the plain scalars the reader of this layout reads back as plain
_BLOCK_SAFE = re.compile(r"[\t\x20-\x7e]*\Z")


class NotData(TypeError):
    """A value outside the JSON data model reached the writer."""


def dump(doc: object) -> str:
    if isinstance(doc, (dict, list)) and doc:
        lines: list[str] = []
        _block(doc, 0, lines)
        return "\n".join(lines) + "\n"
    return (_scalar(doc) if isinstance(doc, str) else _inline(doc, 0)) + "\n"  # no top-level block scalar


def _block(value: dict | list, indent: int, lines: list[str]) -> None:
    pad = " " * indent
    if isinstance(value, dict):
        for key in sorted(value):
            if not isinstance(key, str):
                raise NotData(f"mapping key {key!r} is not a string")
            item, name = value[key], written(key)
            kind = type(item)
            if kind is dict and item:
                lines.append(f"{pad}{name}:")
                _block(item, indent + 2, lines)
            elif kind is list and item:
                lines.append(f"{pad}{name}:")
                _block(item, indent, lines)  # sequence entries at the key's indentation, as PyYAML writes them
            else:
                lines.append(f"{pad}{name}: {_inline(item, indent + 2)}")
        return
    for item in value:
        if isinstance(item, (dict, list)) and item:
            nested: list[str] = []
            _block(item, indent + 2, nested)
            lines.append(f"{pad}- {nested[0][indent + 2:]}")
            lines.extend(nested[1:])
        else:
            lines.append(f"{pad}- {_inline(item, indent + 2)}")


def _inline(value: object, indent: int) -> str:
    if type(value) is str:  # the common case first
        if "\n" in value and _literal_ok(value):
            pad = " " * indent
            return "|\n" + "\n".join(pad + line if line else "" for line in value[:-1].split("\n"))
        return written(value)
    if isinstance(value, dict):
        if value:
            raise NotData("a non-empty mapping cannot be inline")
        return "{}"
    if isinstance(value, list):
        if value:
            raise NotData("a non-empty sequence cannot be inline")
        return "[]"
    return _scalar(value)


_STRINGS: dict[str, str] = {}  # text -> its plain or quoted form: names and values recur across objects
_STRINGS_MAX = 200_000


def written(text: str) -> str:
    """A string as the writer writes a key or a value that is not a `|` block, wherever it stands: plain or
    double-quoted."""
    out = _STRINGS.get(text)
    if out is None:
        out = text if _PLAIN.match(text) and text not in RESERVED else yaml_quote(text)
        if len(_STRINGS) < _STRINGS_MAX:
            _STRINGS[text] = out
    return out


def _scalar(value: object) -> str:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _float(value)
    if isinstance(value, str):
        return written(str(value))
    raise NotData(f"{type(value).__name__} {value!r} is not JSON data")


def _float(value: float) -> str:
    if math.isnan(value):
        return ".nan"
    if math.isinf(value):
        return ".inf" if value > 0 else "-.inf"
    text = repr(value)
    if "." not in text and "e" in text:  # YAML 1.1 floats need a dot: 1e-06 -> 1.0e-06
        mantissa, exponent = text.split("e")
        text = f"{mantissa}.0e{exponent}"
    return text


def _literal_ok(text: str) -> bool:
    """Multi-line text a `|` block keeps exactly: one final newline, no leading blank or indent on the
    first line, no whitespace-only line, printable ASCII and tabs only."""
    if "\n" not in text[:-1] or not text.endswith("\n") or text.endswith("\n\n"):
        return False
    if text[0] in " \t\n":
        return False
    lines = text[:-1].split("\n")
    return all(_BLOCK_SAFE.match(line) and (line == "" or line.strip()) for line in lines)
