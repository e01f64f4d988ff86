"""The canonical YAML writer: what PyYAML (a YAML 1.1 reader, like go-yaml v2) reads back is what was written."""
from __future__ import annotations

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.rendering.yamlout import NotData, dump

scalars = (st.none() | st.booleans() | st.integers(-2**63, 2**63) | st.floats(allow_nan=False)
           | st.text(max_size=40) | st.sampled_from(["yes", "No", "on", "OFF", "y", "N", "null", "~", "1e3", "0x1F",
                                                    "- x", "a: b", "-m", "--config", "---", "a:", "x:y", "-1", "--", "-", "#c", "{{ x }}", "---", "a\nb\n", " lead\n",
                                                    "tab\tx\n", "x\n\n", "\u2028", "é", "😀", "\x85"]))
data = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=25)


@settings(max_examples=400, deadline=None)
@given(data)
def test_pyyaml_reads_back_exactly_what_was_written(doc):
    assert yaml.safe_load(dump(doc)) == doc


@pytest.mark.parametrize("value,text", [
    ({"b": 1, "a": [1, {"y": "n"}]}, "a:\n- 1\n- \"y\": \"n\"\nb: 1\n"),
    ({"data": {"worker.yaml": "a: 1\nb:\n  - c\n"}}, "data:\n  worker.yaml: |\n    a: 1\n    b:\n      - c\n"),
    ({"x": 1e-06, "z": 0.5}, "x: 1.0e-06\nz: 0.5\n"),
    ({"k": "two words"}, "k: \"two words\"\n"),
    ({"empty": {}, "none": [], "nil": None}, "empty: {}\nnil: null\nnone: []\n"),
], ids=["sorted-keys-and-reserved-word-quoted", "multiline-text-as-literal-block", "float-keeps-a-dot",
        "space-means-quoted", "empty-collections-and-null"])
def test_canonical_layout(value, text):
    assert dump(value) == text


def test_injection_attempt_stays_one_string():
    hostile = "x\nhostNetwork: true\n---\nkind: Pod"
    assert yaml.safe_load(dump({"model": hostile})) == {"model": hostile}


def test_non_data_is_refused():
    with pytest.raises(NotData):
        dump({"when": object()})

