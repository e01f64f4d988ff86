"""The fast YAML reader returns exactly what PyYAML's libyaml loader returns, and refuses repeated keys."""
from __future__ import annotations

import pytest
import yaml
from hypothesis import given, settings

from controller.inputs.yamlin import parse_documents
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
