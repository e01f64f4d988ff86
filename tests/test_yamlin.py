"""The fast YAML reader returns exactly what PyYAML's libyaml loader returns, and refuses repeated keys."""
from __future__ import annotations

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.inputs.yamlin import YamlLimits, _from_events, _from_nodes, parse_documents
from controller.rendering.yamlout import dump
from tests.test_yamlout import data


@settings(max_examples=300, deadline=None)
@given(data)
def test_fast_parser_reads_what_pyyaml_reads(doc):
    for text in (dump(doc), yaml.safe_dump(doc), yaml.safe_dump(doc, default_flow_style=True)):
        assert parse_documents(text) == list(yaml.load_all(text, Loader=yaml.CSafeLoader))


@pytest.mark.parametrize("text", ["a: &x [1, 2]\nb: *x\n", "base: &b {k: 1}\nc:\n  <<: *b\n  j: 2\n",
                                  "? [a, b]\n: 1\n", "a: !!binary aGk=\nb: 0x1F\nc: 1_000\nd: 2026-11-30\n",
                                  "--- 1\n--- [x]\n---\n"], ids=["alias", "merge-key", "complex-key",
                                                                 "tagged-scalars", "several-documents"])
def test_fast_parser_matches_pyyaml_on_yaml_features(text):
    def outcome(read):
        try:
            return read(text)
        except yaml.YAMLError as exc:
            return type(exc)

    assert outcome(parse_documents) == outcome(lambda t: list(yaml.load_all(t, Loader=yaml.CSafeLoader)))



def test_repeated_key_is_refused_when_asked():
    text = "spec:\n  memoryBudget: 4Gi\n  memoryBudget: 40Gi\n"
    assert parse_documents(text) == [{"spec": {"memoryBudget": "40Gi"}}]  # PyYAML's silent override
    with pytest.raises(yaml.constructor.ConstructorError, match="duplicate key 'memoryBudget'"):
        parse_documents(text, unique_keys=True)


# ---------------------------------------------------------------- the event path answers as the node path does

def _outcome(read, text, **kwargs):
    try:
        return ("value", read(text, **kwargs))
    except (yaml.YAMLError, RecursionError, ValueError, OverflowError) as exc:
        return ("error", type(exc).__name__, str(exc))


_SMALL = YamlLimits(max_nodes=12, max_aliases=2, max_depth=3)
_CORNERS = {
    "duplicate-key": "a: 1\na: 2\n",
    "int-key": "1: a\n",
    "null-key": "~: a\n",
    "quoted-merge-key": '"<<": {a: 1}\n',
    "merge-key": "b: &b {k: 1}\nc: {<<: *b, j: 2}\n",
    "anchor-alias": "a: &x [1, 2]\nb: *x\n",
    "explicit-tags": "a: !!str 1\nb: !!int '2'\nc: !custom x\n",
    "non-specific-tag": "a: ! 1\n",
    "value-tag": "a: =\n",
    "flow-and-block": "a: {b: [1, 2.5, .inf, -.nan, 0o17, 0x1f, 2026-12-01]}\nc: |\n  x\n  y\nd: >-\n  folded\n  text\n",
    "booleans-1.1": "a: [yes, No, on, OFF, y, ~, null, '', ' ']\n",
    "empty-documents": "---\n---\na: 1\n--- \n...\n",
    "scalar-document": "--- 42\n--- text\n",
    "deep": "a: " + "[" * 5 + "1" + "]" * 5 + "\n",
    "many-nodes": "[" + ", ".join(str(i) for i in range(20)) + "]\n",
    "empty-collections": "a: {}\nb: []\nc: [{}, []]\n",
    "broken": "a: [1, 2\nb: 3\n",
    "broken-second-document": "a: 1\n---\nb: [\n",
    "binary-and-timestamps": "a: !!binary aGk=\nb: 2001-12-14t21:59:43.10-05:00\n",
    "complex-key": "? [a, b]\n: 1\n",
    "tab-indent-error": "a:\n\tb: 1\n",
}


@pytest.mark.parametrize("text", list(_CORNERS.values()), ids=list(_CORNERS))
@pytest.mark.parametrize("unique_keys", [False, True], ids=["overrides", "unique-keys"])
@pytest.mark.parametrize("limits", [None, YamlLimits(), _SMALL], ids=["no-limits", "default-limits", "small-limits"])
def test_the_event_path_gives_the_node_paths_answer(text, unique_keys, limits):
    """Where the event path answers, its value is the node path's; where the node path refuses, so does
    parse_documents (the event path hands such texts over, never answering wrongly)."""
    reference = _outcome(_from_nodes, text, unique_keys=unique_keys, limits=limits)
    try:
        fast = _from_events(text, unique_keys, limits)
    except Exception:  # noqa: BLE001 - parse_documents hands the text to the node path
        fast = None
    if fast is not None:
        assert ("value", fast) == reference
    assert _outcome(parse_documents, text, unique_keys=unique_keys, limits=limits) == reference


@settings(max_examples=300, deadline=None)
@given(data, st.booleans())
def test_the_event_path_answers_generated_documents_as_the_node_path(doc, flow):
    text = yaml.safe_dump(doc, default_flow_style=flow) + "---\n" + dump(doc)
    reference = _from_nodes(text, unique_keys=True, limits=YamlLimits())
    fast = _from_events(text, True, YamlLimits())
    assert fast is not None and fast == reference  # what gpushare writes never needs the node path


def test_the_event_path_reads_what_compose_writes():
    doc = {"status": {"assigned": {"predicted": {"tpotMs": 57.935, "swapInMs": None}, "estimated": True,
                                   "reason": "need 16.4Gi (weights \u00d7 2)", "budgetBytes": 21474836480}}}
    assert _from_events(dump(doc), True, YamlLimits()) == [doc]
