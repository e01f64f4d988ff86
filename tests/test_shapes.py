"""Template output read by its shape gives exactly what a full YAML parse gives, for any values a template
prints and whatever else its text holds (comments, other quoting styles, anchors, long keys, odd characters)."""
from __future__ import annotations

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.inputs.yamlin import parse_documents
from controller.rendering import shapes
from controller.rendering.quote import yaml_quote
from controller.rendering.yamlout import dump

# Pieces of a template line; "{v}" is a printed value (`{{ x | quote }}`), "{k}" a printed key.
_VALUE_LINES = ['{k}: {v}', 'plain: {v}', '{k}: [{v}, "lit", 3]', '{k}: {{a: {v}}}', '- {v}', 'n: 7',
                '{k}: {v}  # a "comment" with quotes', "single: 'it \"is\" {v}'", 'plain: a"b"c',
                '{k}: &anchor {v}', 'alias: *anchor', '<<: {{m: 1}}', 'block: |\n  "quoted" {v}\n',
                'multi: "one\n  two {v}"', '{k} : {v}', 'tagged: !!str {v}', 'esc: "\\x41\\t"']
_STRINGS = st.text(max_size=12) | st.sampled_from(["", "a\"b", "back\\slash", "new\nline", "tab\t", "é", "\u2028",
                                                    "\U0001F600", "#", ": x", "---", "1", "null", "\x07", "x" * 1100,
                                                    "\x000\x00", "\x0099\x00"])  # what marks a hole


@st.composite
def _template(draw):
    lines = draw(st.lists(st.sampled_from(_VALUE_LINES), min_size=1, max_size=8))
    return "\n".join(line if line.startswith("- ") else line for line in lines) + "\n"


def _render(template: str, values: list[str]) -> str:
    out, index = [], 0
    for line in template.split("\n"):
        while "{v}" in line or "{k}" in line:
            marker = "{v}" if line.find("{v}") != -1 and (line.find("{k}") == -1 or line.find("{v}") < line.find("{k}")) \
                else "{k}"
            line = line.replace(marker, yaml_quote(values[index % len(values)]), 1)
            index += 1
        out.append(line.replace("{{", "{").replace("}}", "}"))
    return "\n".join(out)


def _read(text):
    """The documents of `text` read by their shape; each canonical text the shape gives is the writer's own."""
    read = shapes.read_output(text)
    for document, canonical in read:
        assert canonical is None or canonical == dump(document)
    return [document for document, _ in read]


def _outcome(read, text):
    try:
        return ("value", read(text))
    except (yaml.YAMLError, RecursionError, ValueError, OverflowError) as exc:
        return ("error", type(exc).__name__)


@settings(max_examples=400, deadline=None)
@given(_template(), st.lists(st.lists(_STRINGS, min_size=1, max_size=6), min_size=2, max_size=4))
def test_a_text_read_by_its_shape_equals_a_full_parse(template, renders):
    shapes._SHAPES.clear()
    for values in renders:  # the first render of a shape keeps it, the others are read by it
        text = _render(template, values)
        assert _outcome(_read, text) == _outcome(parse_documents, text)


@pytest.mark.parametrize("first, second", [
    ('a: "x"\n', 'a: "y"\n'),
    ('"k": "v"\n', '"kk": "v"\n'),
    ('"k": 1\n"j": 2\n', '"k": 1\n"k": 2\n'),  # two keys become one: the later value wins, as in YAML
    ('"' + "k" * 10 + '": 1\n', '"' + "k" * 1100 + '": 1\n'),  # beyond YAML's simple key limit: an error
    ('a: "x"\n', 'a: "\\x07"\n'),  # an escape the quote filter never writes: parsed in full
    ('a: "x"\n', 'a: "\x07"\n'),  # a character YAML refuses inside quotes: the same error
    ('a: ["x", "y"]\n', 'a: ["\\u00e9", "\\U0001f600"]\n'),
    ('"\\u000099\\u0000": "v"\n"\\u00000\\u0000": "x"\n', '"\\u000099\\u0000": "w"\n"\\u00000\\u0000": "y"\n'),
], ids=["value", "key", "keys-merge", "key-too-long", "foreign-escape", "unprintable", "unicode-escapes",
        "keys-that-read-like-the-writers-hole-markers"])
def test_the_same_shape_with_other_values(first, second):
    shapes._SHAPES.clear()
    assert _read(first) == parse_documents(first)
    assert _outcome(_read, second) == _outcome(parse_documents, second)


def test_a_shape_is_kept_once_and_read_without_parsing(monkeypatch):
    shapes._SHAPES.clear()
    text = 'kind: Service\nmetadata:\n  name: "a"\n  labels:\n    "app": "x"\n'
    shapes.read_output(text)
    monkeypatch.setattr(shapes, "parse_documents", lambda text: pytest.fail("parsed in full"))
    monkeypatch.setattr(shapes, "dump", lambda document: pytest.fail("written in full"))
    assert shapes.read_output(text.replace('"a"', '"b c"')) == [({"kind": "Service", "metadata": {
        "name": "b c", "labels": {"app": "x"}}}, 'kind: Service\nmetadata:\n  labels:\n    app: x\n  name: "b c"\n')]


@pytest.mark.parametrize("second", [
    pytest.param('kind: Service\nmetadata:\n  name: "a\\u000ab"\n  labels:\n    "app": "x"\n', id="multi-line-value"),
    pytest.param('kind: Service\nmetadata:\n  name: "a"\n  labels:\n    "zz": "x"\n', id="another-key"),
])
def test_a_document_the_shape_cannot_write_is_written_in_full(second):
    shapes._SHAPES.clear()
    shapes.read_output('kind: Service\nmetadata:\n  name: "a"\n  labels:\n    "app": "x"\n')
    [(document, canonical)] = shapes.read_output(second)
    assert canonical is None and document == parse_documents(second)[0]


_ESCAPE_PIECES = ["a", " ", "#", "\\\\", '\\"', "\\u000a", "\\u00e9", "\\U0001f600", "\\ud800", "\\x41", "\\n", "\\",
                  "\\u00", "\\U0011ffff"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_ESCAPE_PIECES), max_size=12))
def test_an_escaped_scalar_reads_as_yaml_reads_it(pieces):
    raw = "".join(pieces)
    value = shapes._unescape(raw, printable=True)
    if value is not None:  # None: the text is parsed in full instead
        assert yaml.load(f'"{raw}"', Loader=yaml.CSafeLoader) == value


@pytest.mark.parametrize("raw, value", [
    ('line\\u000anext\\u000a', "line\nnext\n"),
    ('say \\"hi\\" \\\\ done', 'say "hi" \\ done'),
    ('\\\\u000a', "\\u000a"),
    ('caf\\u00e9 \\U0001f600', "café 😀"),
    ('\\\\"', None),
], ids=["newlines", "quotes-and-backslash", "escaped-backslash-before-u", "other-escapes",
        "bare-quote-after-an-escaped-backslash-is-no-scalar"])
def test_the_quote_filters_escapes_are_read(raw, value):
    assert shapes._unescape(raw, printable=True) == value
