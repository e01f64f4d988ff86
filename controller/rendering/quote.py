"""The one way a value reaches YAML text as a string: a double-quoted scalar that reads back exactly.

Owns `yaml_quote` (the templates' `quote` filter, and the writer's form for a string that cannot stay plain)
and `Quoted`, the text it returns. Called by controller.rendering.render (the filter, and the sandbox's
`finalize`, which lets nothing else out) and controller.rendering.yamlout.
"""
from __future__ import annotations

import re


class Quoted(str):
    """Text the `quote` filter produced: a complete YAML double-quoted scalar."""


_NEEDS_ESCAPE = re.compile(r'[^ !#-\[\]-~]')  # anything but printable ASCII, and `"` and `\`


def _escape(match: re.Match) -> str:
    ch = match.group()
    if ch in '"\\':
        return "\\" + ch
    code = ord(ch)
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def _escaped(text: str) -> str:
    """The inside of `text`'s double-quoted scalar. Multi-line ASCII text (a worker's config) takes three
    replaces, which give what the per-character escape gives when nothing else needs escaping."""
    if "\n" in text and text.isascii():
        lines = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\u000a")
        if lines.isprintable():  # ASCII: 0x20-0x7e, every `"` and `\\` now escaped
            return lines
    return _NEEDS_ESCAPE.sub(_escape, text)


def yaml_quote(value: object) -> Quoted:
    """A YAML double-quoted scalar that parses back to exactly `str(value)`.

    Printable ASCII stays as-is except `"` and `\\`; everything else is escaped
    (\\uXXXX, or \\UXXXXXXXX beyond the BMP, which YAML decodes without surrogates),
    so newlines, `{{ }}`, `: `, `#`, `---` and unicode stay inside the string.
    """
    text = str(value)
    quoted = _QUOTED.get(text)
    if quoted is None:
        quoted = Quoted(f'"{_escaped(text)}"')
        if len(_QUOTED) < _QUOTED_MAX:
            _QUOTED[text] = quoted
    return quoted


_QUOTED: dict[str, Quoted] = {}  # text -> its quoted form: names, labels and namespaces recur on every object
_QUOTED_MAX = 200_000
