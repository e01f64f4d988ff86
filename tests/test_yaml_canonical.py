"""The canonical path reads what yamlout writes as PyYAML does, and hands everything else to the other paths."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.inputs import yamlin
from controller.inputs.canonical import from_canonical
from controller.inputs.yamlin import YamlLimits, _from_nodes, parse_documents
from controller.rendering.yamlout import dump

GOLDEN = Path(__file__).resolve().parent / "golden"
RECORD = GOLDEN / "fleet" / "decisions" / "research" / "tiny-70b.yaml"

_WORDS = ["yes", "No", "on", "OFF", "y", "N", "null", "Null", "~", "1_000", "1:30", "0x1F", "012", "+1", ".5", "-",
          "- a", ": ", "a: b", "#", "# c", "=", "<<", "---", "...", "2026-12-01", "1e3", "-.inf", ".NaN", "x:y",
          "--config", "a\nb\n", "two\n\nlines\n", " lead\n", "tab\tx\n", "x\n\n", "trail \nx\n", "\u2028", "é",
          "😀", "\x85", "\r\n"]
scalars = (st.none() | st.booleans() | st.integers() | st.floats() | st.sampled_from([-0.0, 1e-06, 1e+20, 1e16])
           | st.text(max_size=30) | st.sampled_from(_WORDS))
data = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=10) | st.sampled_from(_WORDS), inner, max_size=4),
                    max_leaves=30)
collections = st.dictionaries(st.text(max_size=10) | st.sampled_from(_WORDS), data, min_size=1, max_size=5) \
    | st.lists(data, min_size=1, max_size=4)


def same(a: object, b: object, ordered: bool = True) -> bool:
    """Equal with types kept apart (True is not 1), NaN equal to NaN, -0.0 told from 0.0 and, where `ordered`,
    mapping keys in the same order."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return repr(a) == repr(b)
    if isinstance(a, dict):
        keys_match = list(a) == list(b) if ordered else a.keys() == b.keys()
        return keys_match and all(same(a[k], b[k], ordered) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y, ordered) for x, y in zip(a, b))
    return a == b


def outcome(text: str, limits: YamlLimits | None) -> tuple:
    try:
        return ("value", _from_nodes(text, True, limits))
    except (yaml.YAMLError, RecursionError, ValueError, OverflowError) as exc:
        return ("error", type(exc).__name__)


@settings(max_examples=300, deadline=None)
@given(collections)
def test_what_the_writer_writes_is_read_by_the_canonical_path(doc):
    text = dump(doc)
    reference = list(yaml.load_all(text, Loader=yaml.CSafeLoader))
    fast = from_canonical(text, YamlLimits())
    assert fast is not None, text  # every non-empty collection the writer writes: the fast path never goes unused
    assert same(fast, reference) and same(fast, [doc], ordered=False)
    assert same(parse_documents(text, unique_keys=True, limits=YamlLimits()), reference)


@settings(max_examples=100, deadline=None)
@given(data)
def test_any_document_reads_the_same_whichever_path_answers(doc):
    text = dump(doc)  # bare scalars and empty collections too: the canonical path hands those on
    assert same(parse_documents(text, unique_keys=True, limits=YamlLimits()),
                list(yaml.load_all(text, Loader=yaml.CSafeLoader)))


_NOISE = [" ", "  ", "\t", "#", "# c", "-", "- ", ":", ": ", "\n", "'", '"', "&a ", "*a", "!!str ", "{", "}", "[", "]",
          "?", "? ", "\\", "\\n", "\\u", "\\ud800", "|", "|-", ">", "0", "1", ".", "_", "a", "z", "\r", "\x85", "é",
          "---\n", "...\n", "~", "yes", "<<", "=", "b", "9", "/", "x:"]


@st.composite
def mutated(draw):
    """A canonical dump with a few edits: characters inserted, deleted or replaced, lines swapped, repeated or
    re-indented, markers and comments around it."""
    text = dump(draw(collections))
    for _ in range(draw(st.integers(1, 3))):
        edit = draw(st.sampled_from(["insert", "delete", "replace", "swap", "repeat", "indent", "outdent", "wrap"]))
        lines = text.split("\n")
        at = draw(st.integers(0, max(len(text) - 1, 0)))
        row = draw(st.integers(0, max(len(lines) - 2, 0)))
        if edit == "insert":
            text = text[:at] + draw(st.sampled_from(_NOISE)) + text[at:]
        elif edit == "delete":
            text = text[:at] + text[at + 1:]
        elif edit == "replace":
            text = text[:at] + draw(st.sampled_from(_NOISE)) + text[at + 1:]
        elif edit in ("swap", "repeat") and len(lines) > 2:
            other = draw(st.integers(0, len(lines) - 2))
            if edit == "swap":
                lines[row], lines[other] = lines[other], lines[row]
            else:
                lines.insert(other, lines[row])
            text = "\n".join(lines)
        elif edit in ("indent", "outdent"):
            lines[row] = " " * draw(st.integers(1, 3)) + lines[row] if edit == "indent" else lines[row][1:]
            text = "\n".join(lines)
        elif edit == "wrap":
            text = draw(st.sampled_from(["---\n", "# c\n", "%YAML 1.1\n---\n", ""])) + text + \
                draw(st.sampled_from(["...\n", "---\n", "# c\n", "x", ""]))
    return text


@settings(max_examples=600, deadline=None)
@given(st.one_of(mutated(), mutated(), st.text(max_size=60), st.text(alphabet="ab:- \n\"#|{}[]0.", max_size=60)),
       st.sampled_from([None, YamlLimits(), YamlLimits(max_nodes=40, max_aliases=2, max_depth=4)]))
def test_the_canonical_path_answers_only_with_the_node_paths_answer(text, limits):
    fast = from_canonical(text, limits)
    if fast is not None:
        reference = outcome(text, limits)
        assert reference[0] == "value" and same(fast, reference[1]), text


_LONG_KEY = '"' + "k" * 1100 + '": 1\n'
_REFUSED = {
    "unsorted-keys-fall-through": ("b: 1\na: 2\n", None),
    "repeated-key-falls-through": ("a: 1\na: 2\n", None),
    "same-key-plain-and-quoted-falls-through": ('a: 1\n"a": 2\n', None),
    "sexagesimal-plain-falls-through": ("a: 1:30\n", None),
    "underscored-int-falls-through": ("a: 1_000\n", None),
    "hex-int-falls-through": ("a: 0x1F\n", None),
    "leading-zero-int-falls-through": ("a: 012\n", None),
    "plus-sign-falls-through": ("a: +1\n", None),
    "dot-first-float-falls-through": ("a: .5\n", None),
    "float-without-dot-falls-through": ("a: 1e3\n", None),
    "yaml11-boolean-word-falls-through": ("a: yes\n", None),
    "y-word-falls-through": ("a: y\n", None),
    "tilde-null-falls-through": ("a: ~\n", None),
    "capitalised-null-falls-through": ("a: Null\n", None),
    "timestamp-falls-through": ("a: 2026-12-01\n", None),
    "value-tag-falls-through": ("a: =\n", None),
    "merge-key-falls-through": ("<<: {}\n", None),
    "boolean-key-falls-through": ("on: 1\n", None),
    "leading-comment-falls-through": ("# c\na: 1\n", None),
    "trailing-comment-falls-through": ("a: 1 # c\n", None),
    "document-start-falls-through": ("---\na: 1\n", None),
    "document-end-falls-through": ("a: 1\n...\n", None),
    "two-documents-fall-through": ("a: 1\n---\nb: 2\n", None),
    "flow-mapping-falls-through": ("a: {b: 1}\n", None),
    "flow-sequence-falls-through": ("a: [1]\n", None),
    "anchor-falls-through": ("a: &x 1\n", None),
    "tag-falls-through": ("a: !!str 1\n", None),
    "single-quotes-fall-through": ("a: 'x'\n", None),
    "explicit-key-falls-through": ("? a\n: 1\n", None),
    "tab-falls-through": ("a:\t1\n", None),
    "trailing-space-falls-through": ("a: 1 \n", None),
    "crlf-falls-through": ("a: 1\r\n", None),
    "no-final-newline-falls-through": ("a: 1", None),
    "blank-line-falls-through": ("a: 1\n\nb: 2\n", None),
    "three-space-indent-falls-through": ("a:\n   b: 1\n", None),
    "indented-sequence-falls-through": ("a:\n  - 1\n", None),
    "empty-value-falls-through": ("a:\nb: 1\n", None),
    "keep-chomping-falls-through": ("a: |+\n  x\n\n", None),
    "strip-chomping-falls-through": ("a: |-\n  x\n", None),
    "indentation-indicator-falls-through": ("a: |2\n   x\n", None),
    "more-indented-first-block-line-falls-through": ("a: |\n   x\n  y\n", None),
    "blank-block-tail-falls-through": ("a: |\n  x\n\nb: 1\n", None),
    "whitespace-block-line-falls-through": ("a: |\n  x\n   \n  y\n", None),
    "folded-block-falls-through": ("a: >\n  x\n", None),
    "surrogate-escape-falls-through": ('a: "\\ud800"\n', None),
    "escape-beyond-unicode-falls-through": ('a: "\\U00110000"\n', None),
    "x-escape-falls-through": ('a: "\\x41"\n', None),
    "n-escape-falls-through": ('a: "x\\ny"\n', None),
    "non-ascii-in-quotes-falls-through": ('a: "é"\n', None),
    "key-too-long-for-a-simple-key-falls-through": (_LONG_KEY, None),
    "int-too-long-for-int-falls-through": ("a: " + "1" * 5000 + "\n", None),
    "depth-near-limit-falls-through": ("a:\n  b: 1\n", YamlLimits(max_depth=3)),
    "depth-beyond-limit-falls-through": ("a:\n  b:\n    c: 1\n", YamlLimits(max_depth=3)),
    "nodes-near-limit-falls-through": ("a: 1\nb: 2\nc: 3\n", YamlLimits(max_nodes=12)),
    "bare-scalar-falls-through": ("text\n", None),
    "empty-mapping-document-falls-through": ("{}\n", None),
    "empty-text-falls-through": ("", None),
}


@pytest.mark.parametrize("text,limits", list(_REFUSED.values()), ids=list(_REFUSED))
def test_text_off_the_canonical_layout_goes_to_the_other_paths(text, limits):
    assert from_canonical(text, limits) is None
    try:
        answer = ("value", parse_documents(text, unique_keys=True, limits=limits))
    except (yaml.YAMLError, RecursionError, ValueError, OverflowError) as exc:
        answer = ("error", type(exc).__name__)
    reference = outcome(text, limits)
    assert answer[0] == reference[0] and (answer[0] == "error" or same(answer[1], reference[1]))


_READ = {
    "nested-sequences-and-mappings": "a:\n- - 1\n  - x: 2\n    z: []\n- {}\nb: -0.0\n",
    "block-in-a-sequence-item-mapping": "- k: |\n    line\n\n    \tmore \n  z: .nan\n",
    "quoted-key-holding-a-colon": '"a: b": 1\n"b":\n  c: -.inf\n',
    "escapes": 'a: "\\"\\\\\\u00e9\\U0001f600\\u2028"\n',
    "plain-flags-and-paths": "args:\n- --config\n- -v\n- /etc/x:y\n",
    "depth-just-inside-limit": ("a:\n  b: 1\n", YamlLimits(max_depth=4)),
}


@pytest.mark.parametrize("case", list(_READ.values()), ids=list(_READ))
def test_canonical_texts_are_read_by_the_canonical_path(case):
    text, limits = case if isinstance(case, tuple) else (case, YamlLimits())
    fast = from_canonical(text, limits)
    assert fast is not None and same(fast, outcome(text, limits)[1])


def test_a_decision_record_is_read_by_the_canonical_path(monkeypatch):
    text = RECORD.read_text()
    reference = _from_nodes(text, True, YamlLimits())
    assert same(from_canonical(text, YamlLimits()), reference)
    def other_path(*args):
        raise AssertionError("parse_documents read a canonical record by another path")

    monkeypatch.setattr(yamlin, "_from_events", lambda *args: None)
    monkeypatch.setattr(yamlin, "_from_nodes", other_path)
    assert same(parse_documents(text, unique_keys=True, limits=YamlLimits()), reference)


def test_every_golden_decision_record_is_canonical():
    records = sorted(GOLDEN.glob("*/decisions/**/*.yaml"))
    assert records
    for path in records:
        text = path.read_text()
        assert same(from_canonical(text, YamlLimits()), _from_nodes(text, True, YamlLimits())), path


def test_a_remembered_line_counts_only_at_its_own_indentation():
    assert from_canonical("a:\n  b: 1\nc:\n- - x\n  - z\n", None) == [{"a": {"b": 1}, "c": [["x", "z"]]}]
    for text in ("a: 1\n  b: 1\n", "a:\n- x\n  - z\n", "  b: 1\n"):  # the same lines, where they do not belong
        assert from_canonical(text, None) is None
