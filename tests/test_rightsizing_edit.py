"""Recommend's round-trip edit: the right document (by apiVersion, kind, namespace and name), spec.memoryBudget
changes and every other byte of the user's file stays; a corpus of odd forms round-trips byte for byte or is
refused for that model with a reason."""
from __future__ import annotations

import pytest

from controller.rightsizing.edit import BudgetEditError, format_quantity, set_memory_budget

GiB, MiB = 1 << 30, 1 << 20
HEAD = "apiVersion: gpushare.dev/v1alpha1\nkind: ElasticModel\n"


def model(name: str, budget: str = "8Gi", namespace: str | None = "llm", extra: str = "") -> str:
    ns = f"  namespace: {namespace}\n" if namespace else ""
    return f"{HEAD}metadata:\n  name: {name}\n{ns}spec:\n  model: org/{name}\n  memoryBudget: {budget}\n{extra}"


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
  rightsizing:
    policy: Recommend
---
# second model, quoted budget
apiVersion: gpushare.dev/v1alpha1
kind: ElasticModel
metadata:
  name: coder
  namespace: llm
spec:
  model: "Qwen/Qwen2.5-Coder-7B"
  memoryBudget: "24Gi"
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


@pytest.mark.parametrize("namespace,name,new,old_token,new_token", [
    ("llm", "chat-small", 5 * GiB, "8Gi", "5Gi"),
    ("llm", "coder", 20 * GiB + 512 * MiB, '"24Gi"', '"20992Mi"'),
    ("default", "writer", 3 * GiB, "'wrong-order-keys-are-fine'", "'3Gi'"),
], ids=["plain-with-comment", "double-quoted", "single-quoted-indent-4-default-namespace"])
def test_edit_changes_only_the_budget_token(namespace, name, new, old_token, new_token):
    edited = set_memory_budget(USER_FILE, namespace, name, new)
    at = edited.index(new_token, USER_FILE.index(f"name: {name}"))
    assert edited[:at] == USER_FILE[:at]
    assert edited[at + len(new_token):] == USER_FILE[at + len(old_token):]


# A corpus of odd but editable forms: each must round-trip with only the target's budget token (7Gi, or its
# byte count) changed; other models carry 8Gi.
T = "7Gi"
CORPUS = [
    ("yaml-directive", "%YAML 1.1\n---\n" + model("a", T)),
    ("bom", "\ufeff" + model("a", T)),
    ("leading-empty-documents", "---\n---\n# only a comment\n---\n" + model("a", T)),
    ("target-after-another-model", model("b") + "---\n" + model("a", T)),
    ("same-name-other-namespace-first", model("a", "8Gi", "other") + "---\n" + model("a", T)),
    ("other-kind-same-name-first", "apiVersion: gpushare.dev/v1alpha1\nkind: GpuInventory\nmetadata:\n  name: a\n"
     "  namespace: llm\nspec:\n  memoryBudget: 8Gi\n---\n" + model("a", T)),
    ("crlf", model("a", T).replace("\n", "\r\n")),
    ("no-trailing-newline", model("a", T).rstrip("\n")),
    ("spaces-then-comment", model("a", T + "    # comment  ")),
    ("document-end-markers", model("a", T) + "...\n---\n" + model("b") + "...\n"),
    ("integer-bytes", model("a", str(7 * GiB))),
    ("quoted-keys", model("a", T).replace("memoryBudget:", '"memoryBudget":')),
    ("unicode-comment", "# モデル — ✓\n" + model("a", T + " # 予算")),
    ("deep-indent", model("a", T).replace("\n  ", "\n        ")),
    ("anchor-in-another-document", "x: &y 1\nz: *y\n---\n" + model("a", T)),
    ("flow-in-another-document", "{a: 1}\n---\n" + model("a", T)),
    ("namespace-omitted-is-default", model("a", T, namespace=None)),
]


@pytest.mark.parametrize("case,text", CORPUS, ids=[c[0] for c in CORPUS])
def test_odd_but_editable_forms_round_trip_byte_for_byte(case, text):
    namespace = "default" if case == "namespace-omitted-is-default" else "llm"
    edited = set_memory_budget(text, namespace, "a", 3 * GiB)
    token = T if T in text else str(7 * GiB)
    assert text.count(token) == 1 and edited == text.replace(token, "3Gi")


REFUSED = [  # (id, text, reason): the model is refused, nothing is written
    ("anchor-and-alias", model("a", "&b 8Gi", extra="  other: *b\n"), "BudgetFormNotEditable"),
    ("anchored-spec", model("a").replace("spec:\n", "spec: &s\n"), "BudgetFormNotEditable"),
    ("merge-key", HEAD + "metadata:\n  name: a\n  namespace: llm\nbase: &b\n  model: org/a\nspec:\n  <<: *b\n"
     "  memoryBudget: 8Gi\n", "BudgetFormNotEditable"),
    ("block-scalar", model("a", "|\n    8Gi"), "BudgetFormNotEditable"),
    ("folded-scalar-elsewhere", model("a", extra="  note: >\n    folded\n"), "BudgetFormNotEditable"),
    ("flow-spec", HEAD + "metadata: {name: a, namespace: llm}\nspec: {model: org/a, memoryBudget: 8Gi}\n",
     "BudgetFormNotEditable"),
    ("flow-sequence", model("a", extra="  servedNames: [x, y]\n"), "BudgetFormNotEditable"),
    ("tagged-budget", model("a", "!!str 8Gi"), "BudgetFormNotEditable"),
    ("broken-document-elsewhere", model("b") + "---\nkey: [unclosed\n---\n" + model("a"), "UnparsableModelFile"),
    ("broken-document-before-with-directive", "%YAML 1.1\n---\n: : :\n---\n" + model("a"), "UnparsableModelFile"),
    ("tab-before-comment", model("a", "8Gi  \t# tab"), "UnparsableModelFile"),
    ("model-missing", model("b"), "ModelDocumentNotFound"),
    ("wrong-api-version", model("a").replace("v1alpha1", "v9"), "ModelDocumentNotFound"),
    ("model-twice", model("a") + "---\n" + model("a"), "ModelDocumentAmbiguous"),
    ("no-budget", HEAD + "metadata:\n  name: a\n  namespace: llm\nspec:\n  model: org/a\n", "ModelDocumentNotFound"),
    ("alias-bomb", "a: &a [x, x]\nb: &b [*a, *a]\nc: &c [*b, *b]\n---\n" + model("a", "*c"), "UnparsableModelFile"),
]


@pytest.mark.parametrize("case,text,reason", REFUSED, ids=[c[0] for c in REFUSED])
def test_forms_that_cannot_be_edited_safely_are_refused_with_a_reason(case, text, reason):
    with pytest.raises(BudgetEditError) as caught:
        set_memory_budget(text, "llm", "a", GiB)
    assert caught.value.reason == reason and str(caught.value)


def test_the_edit_never_touches_another_models_budget():
    """The bug of the issue: a directive and a broken document made the editor pick the wrong model."""
    text = "%YAML 1.1\n---\n" + model("first", "8Gi") + "---\n" + model("second", "16Gi")
    edited = set_memory_budget(text, "llm", "second", 4 * GiB)
    assert "memoryBudget: 8Gi" in edited and "memoryBudget: 4Gi" in edited and "16Gi" not in edited


def test_crlf_line_endings_and_no_trailing_newline_are_kept():
    text = USER_FILE.split("---")[0].replace("\n", "\r\n").rstrip("\r\n")
    edited = set_memory_budget(text, "llm", "chat-small", 6 * GiB)
    assert edited == text.replace("memoryBudget:   8Gi ", "memoryBudget:   6Gi ")
    assert edited.count("\r\n") == text.count("\r\n")


@pytest.mark.parametrize("nbytes,text", [(5 * GiB, "5Gi"), (4915 * MiB, "4915Mi"), (1 << 40, "1Ti"), (1000, "1000")])
def test_quantities_are_exact(nbytes, text):
    assert format_quantity(nbytes) == text


def test_a_file_the_editor_refuses_holds_that_model_only_and_the_pass_goes_on(tmp_path):
    from dataclasses import replace

    from controller.rightsizing.apply import _editable
    from controller.inputs.rightsizing_records import Record
    from controller.rightsizing.step import Proposal, StepResult
    from controller.types import Source
    from factories import toy_model

    (tmp_path / "models").mkdir()
    (tmp_path / "models/good.yaml").write_text(model("good"))
    (tmp_path / "models/odd.yaml").write_text(model("odd", "&x 8Gi"))
    proposals, records = [], {}
    for name in ("good", "odd"):
        m = replace(toy_model(name, 8 * GiB), source=Source(f"models/{name}.yaml", 0))
        proposals.append(Proposal(m, 4 * GiB, f"gpushare/rightsize-llm-{name}", "message"))
        records[m.key] = Record("llm", name, "Recommend", 8 * GiB, 4 * GiB)
    result = _editable(lambda path: (tmp_path / path).read_text(), StepResult(records, tuple(proposals)))
    assert [p.model.name for p in result.proposals] == ["good"]
    (condition,) = result.records[("llm", "odd")].conditions
    assert (condition.type, condition.status, condition.reason) == ("ProposalWritten", "False",
                                                                    "BudgetFormNotEditable")
    assert not result.records[("llm", "good")].conditions
