"""A quick look at where each document of an ElasticModel file is placed, without reading the documents.

Owns `placement_blocks(text)`: for a file written in plain block YAML (the way people and tools write
ElasticModels), the text of each document's `spec.placement` entry with what is indented below it, as a YAML
text of its own (`  placement:\\n    clusters:\\n    - eu-1\\n`), or "" for a document without one; None as soon
as it cannot be sure. The entry's meaning is left to the real YAML reader: this module only finds where it
begins and ends, which in block YAML is fixed by indentation, as long as no line reaches into the lines around
it. So it answers None for a text with any of: a tab or carriage return, a `|` or `>` block, a flow mapping
other than `{}`, an anchor, alias or tag, a complex key (`?`), a directive or `...`, a `---` line with more on it,
a quote or `[` not closed on its line (a line holding one must be a plain `key: value` or `- value` line), a
document whose first line is not a top-level key at column 0, one with other than one top-level line that starts
`spec:` or where that line holds no block mapping, or a repeated `placement` in it. A line that breaks YAML's
indentation rules is the real reader's error, reported by the clusters the document is placed on.

Pure. Called by controller.inputs.clusters.Elsewhere, for controller.inputs.reader (`read_models`): a cluster's
controller reads no further a file under models/ whose every document is placed on other clusters only, so its
pass costs what its own models cost, not what the whole repository holds.
"""
from __future__ import annotations

import functools
import re

# Characters after which a line may mean something beyond itself (or YAML beyond plain block mappings, sequences
# and scalars); `{` is allowed only as the empty flow mapping `{}`.
_UNSURE = re.compile(r"[\t\r|>*&!?%`{]")
_BRACKETS = re.compile(r"[\"'\[]")  # a quote or `[`: its line must close it
_SPECIAL = "\t\r|>*&!?%`{\"'["  # either of the two above (looked for one by one: `in` scans a text fastest)
_SAFE = r"[A-Za-z0-9_./+=~()@-]"
_DQ, _SQ = r'"[^"\\\n]*"', r"'[^'\n]*'"
_PLAIN = rf"(?:[A-Za-z0-9_./+=~(]|-(?=[A-Za-z0-9_.])){_SAFE}*+(?:(?::| +){_SAFE}++)*+"
_FLOW_ITEM = rf"(?:[A-Za-z0-9_./+=~@]|-(?=[A-Za-z0-9_.]))[A-Za-z0-9_./+=~@-]*+|{_DQ}|{_SQ}"
_VALUE = rf"(?>{_PLAIN}|{_DQ}|{_SQ}|\[ *+(?:(?:{_FLOW_ITEM})(?: *+, *+(?:{_FLOW_ITEM}))*+ *+,?+ *+)?+\]|\{{\}})"
_ONE_LINE = re.compile(rf" *+#[^\n]*| *+(?:- +)*+(?:[A-Za-z0-9_][A-Za-z0-9_./-]*+:(?: ++{_VALUE})?|-(?: ++{_VALUE})?)"
                       r"(?: ++#[^\n]*| *+)")  # a line whose quotes and brackets close on it
# Each document is searched with patterns that begin with a newline (the document's text begins with one): the
# regular expression engine skips to each newline, where a `^` in multi-line mode tried every position.
_CONTENT = re.compile(r"\n *[^ \n#]")
_TOP = re.compile(r"\n(?: *(?:#[^\n]*)?\n)*[A-Za-z0-9_]")  # the first line with content is a key at column 0
_SPEC = re.compile(r"\nspec:(?: +#[^\n]*| *)(?=\n|\Z)")
_CHILD = re.compile(r"\n(?: *(?:#[^\n]*)?\n)*( +)[^ \n#-]")  # spec's first key, and its indentation
_COLUMN_0 = re.compile(r"\n[^ \n#]")  # the next top-level line ends spec


def placement_blocks(text: str) -> list[str] | None:
    """For each document of `text` (in order; empty ones left out, as the reader leaves them), its spec.placement
    entry as a YAML text of its own, or "" where the document has none; None where this layout cannot tell."""
    if any(char in text for char in _SPECIAL):  # most files hold none of these
        if any(found[0] != "{" or text[found.end():found.end() + 1] != "}" for found in _UNSURE.finditer(text)):
            return None
        if _BRACKETS.search(text) is not None and any(
                _ONE_LINE.fullmatch(line) is None for line in text.split("\n") if _BRACKETS.search(line)):
            return None
    blocks = []
    for document in ("\n" + text + "\n").split("\n---\n"):
        document = document if document.startswith("\n") else "\n" + document
        if "\n---" in document or "\n..." in document:
            return None  # a `---` line with more on it, or a document end: where documents part is unsure
        if _TOP.match(document) is None:
            if _CONTENT.search(document) is None:
                continue
            return None  # the first line with content is no top-level key
        block = _placement(document)
        if block is None:
            return None
        blocks.append(block)
    return blocks


def _placement(document: str) -> str | None:
    spec = _SPEC.match(document, max(document.find("\nspec:"), 0))
    if spec is None or document.find("\nspec:", spec.end()) >= 0:
        return None  # no `spec:` line holding a block, or more than one
    child = _CHILD.match(document, spec.end())
    if child is None:
        return None  # spec holds no block mapping
    key = f"\n{child[1]}placement:"
    at = document.find(key, spec.end())
    if at < 0 or _COLUMN_0.search(document, spec.end(), at + 1) is not None:
        return ""  # none in spec (one under a later top-level key is not spec's)
    found = _entry(len(child[1])).match(document, at + 1)
    if found is None or document.find(key, found.end() - 1) >= 0:
        return None  # `placement:x`, or a repeated key: the reader's to read, or report
    return found[0]


@functools.lru_cache(maxsize=64)
def _entry(indent: int) -> re.Pattern:
    """spec's `placement` key at `indent` spaces, with the lines indented below it (and blank or comment lines)."""
    pad = " " * indent
    return re.compile(rf"{pad}placement:(?: [^\n]*)?(?:\n|\Z)(?:(?:{pad} [^\n]*| *(?:#[^\n]*)?)(?:\n|\Z))*")
