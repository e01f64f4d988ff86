"""Recommend's round-trip edit: spec.memoryBudget changes and every other byte of the user's file stays."""
from __future__ import annotations

import pytest

from controller.rightsizing.edit import BudgetEditError, format_quantity, set_memory_budget

GiB, MiB = 1 << 30, 1 << 20

USER_FILE = """\
# Team chat models. Owner: @chat-team   (keep this header)
apiVersion: gpushare.dev/v1alpha1
kind: ElasticModel
metadata:
  name: chat-small      # the served name
  namespace: llm
spec:
  model: Qwen/Qwen2.5-0.5B-Instruct
  # budget agreed with the platform team on 2026-10-01
  memoryBudget:   8Gi     # trailing comment, odd spacing
  slo: {contextTokens: 4096,   concurrency: 4}
  rightsizing:
    policy: Recommend
---
# second model, flow style and quoted budget
apiVersion: gpushare.dev/v1alpha1
kind: ElasticModel
metadata: {name: coder, namespace: llm}
spec: {model: "Qwen/Qwen2.5-Coder-7B", memoryBudget: "24Gi", gpu: {product: NVIDIA-H200}}
...
---
apiVersion: gpushare.dev/v1alpha1
kind: ElasticModel
metadata:
    name: writer
spec:
    memoryBudget: 'wrong-order-keys-are-fine'
    model: org/writer
"""


@pytest.mark.parametrize("document,new,old_token,new_token", [
    (0, 5 * GiB, "8Gi", "5Gi"),
    (1, 20 * GiB + 512 * MiB, '"24Gi"', '"20992Mi"'),
    (2, 3 * GiB, "'wrong-order-keys-are-fine'", "'3Gi'"),
], ids=["plain-with-comment", "quoted-in-flow-mapping", "single-quoted-indent-4"])
def test_edit_changes_only_the_budget_token(document, new, old_token, new_token):
    edited = set_memory_budget(USER_FILE, document, new)
    at = edited.index(new_token, _line_start(USER_FILE, old_token, document))
    assert edited[:at] == USER_FILE[:at]
    assert edited[at + len(new_token):] == USER_FILE[at + len(old_token):]


def _line_start(text: str, token: str, document: int) -> int:
    start = 0
    for _ in range(document):
        start = text.index("\n---", start) + 4
    return text.index(token, start) - 1


def test_crlf_line_endings_and_no_trailing_newline_are_kept():
    text = USER_FILE.split("---")[0].replace("\n", "\r\n").rstrip("\r\n")
    edited = set_memory_budget(text, 0, 6 * GiB)
    assert edited == text.replace("memoryBudget:   8Gi ", "memoryBudget:   6Gi ")
    assert edited.count("\r\n") == text.count("\r\n")


def test_an_integer_budget_becomes_a_quantity_in_place():
    text = "kind: ElasticModel\nspec:\n  memoryBudget: 8589934592 # bytes\n  model: a/b\n"
    assert set_memory_budget(text, 0, 4 * GiB) == "kind: ElasticModel\nspec:\n  memoryBudget: 4Gi # bytes\n  model: a/b\n"


@pytest.mark.parametrize("text,reason", [
    ("spec:\n  model: a\n", "ModelDocumentNotFound"),
    ("x: &b 4Gi\nspec:\n  memoryBudget: *b\n", "BudgetNotPlain"),
    ("spec:\n  memoryBudget: [\n", "UnparsableModelFile"),
], ids=["no-budget", "alias", "not-yaml"])
def test_edits_that_cannot_be_contained_are_refused(text, reason):
    with pytest.raises(BudgetEditError) as caught:
        set_memory_budget(text, 0, GiB)
    assert caught.value.reason == reason


@pytest.mark.parametrize("nbytes,text", [(5 * GiB, "5Gi"), (4915 * MiB, "4915Mi"), (1 << 40, "1Ti"), (1000, "1000")])
def test_quantities_are_exact(nbytes, text):
    assert format_quantity(nbytes) == text
