"""`gpushare plan` runs the pass `gpushare validate` runs, render included: over examples/fleet and broken copies
of it, both report the same errors (reason and model or file) with the same exit code, `plan -o json` lists the
render-time ones, and a model that is not rendered is never shown as placed."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from controller.cli.commands import main
from controller.cli.offline import pass_over
from tests.conftest import REPO_ROOT

FLEET = REPO_ROOT / "examples" / "fleet"
CHAT = "models/llm/chat.yaml"


def _twin_in_other_namespace(root: Path) -> None:
    """llm/chat-small's twin in namespace zeta: its served name would clash on the only H200's worker, so the
    plan refuses it (ServedNameTaken, a planning rule: no render error is left)."""
    twin = (root / CHAT).read_text().split("---")[0].replace("namespace: llm", "namespace: zeta")
    (root / "models/twin.yaml").write_text(twin)


def _edit(rel: str, old: str, new: str):
    def apply(root: Path) -> None:
        path = root / rel
        assert old in path.read_text(), f"{rel} no longer holds {old!r}: the case tests nothing"
        path.write_text(path.read_text().replace(old, new, 1))
    return apply


def _write(rel: str, text: str):
    def apply(root: Path) -> None:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return apply


CASES = {
    "fleet-as-shipped": (lambda root: None, set()),
    "served-name-taken-across-namespaces": (_twin_in_other_namespace, set()),
    "model-yaml-unparsable": (_write("models/llm/broken.yaml", "kind: [unclosed\n"), {("InvalidYAML", None)}),
    "bad-budget-quantity": (_edit(CHAT, "memoryBudget: 4Gi", "memoryBudget: lots"),
                            {("InvalidQuantity", "llm/chat-small")}),
    "unknown-composition": (_edit(CHAT, "  memoryBudget: 4Gi", "  memoryBudget: 4Gi\n  compositionRef:\n"
                                  "    name: nowhere"), {("UnknownComposition", "llm/chat-small")}),
    "model-defined-twice": (lambda root: shutil.copy(root / CHAT, root / "models/llm/again.yaml"),
                            {("DuplicateName", "llm/chat-small"), ("DuplicateName", "llm/summarizer")}),
}


def _reasons_in_validate(out: str) -> set[str]:
    return set(re.findall(r": \[([A-Za-z]+)\] ", out))


@pytest.mark.parametrize("case", sorted(CASES))
def test_plan_and_validate_report_the_same_errors_with_the_same_exit_code(case, tmp_path, capsys):
    root = tmp_path / "fleet"
    shutil.copytree(FLEET, root)
    breaks, expected = CASES[case]
    breaks(root)

    validate_code = main(["validate", str(root)])
    validated = capsys.readouterr().out
    plan_code = main(["plan", str(root), "-o", "json"])
    planned = json.loads(capsys.readouterr().out)

    found = {(e["reason"], e["object"]) for e in planned["errors"]}
    assert {reason for reason, _ in found} == _reasons_in_validate(validated)
    assert f"; {len(planned['errors'])} error(s)" in validated
    assert {(reason, ref) for reason, ref in found if ref is None or "/" in ref} >= expected
    assert {reason for reason, _ in found} == {reason for reason, _ in expected}
    assert validate_code == plan_code == (1 if expected else 0)


def test_a_model_the_renderer_could_not_serve_is_never_shown_as_placed(tmp_path, capsys):
    """The twin the only H200's worker could not serve (issue 23: the planner knows the rule) is listed as
    refused with the rule, in the JSON and under the table's refused models, never on a slot."""
    root = tmp_path / "fleet"
    shutil.copytree(FLEET, root)
    _twin_in_other_namespace(root)
    assert main(["plan", str(root), "-o", "json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    (twin,) = [d for d in planned["decisions"] if f"{d['namespace']}/{d['name']}" == "zeta/chat-small"]
    assert (twin["mode"], twin["reasonCode"]) == ("refused", "ServedNameTaken")
    assert main(["plan", str(root)]) == 0
    table = capsys.readouterr().out
    assert "zeta/chat-small" in table.split("refused:")[1]  # listed with the refused models only
    assert "zeta/chat-small" not in table.split("refused:")[0]


def test_a_model_the_renderer_could_not_serve_is_counted_refused_in_the_commit_and_plan_md(tmp_path):
    root = tmp_path / "fleet"
    shutil.copytree(FLEET, root)
    alone = pass_over(root, processes=1)
    _twin_in_other_namespace(root)
    out = pass_over(root, processes=1)
    assert out.rendered.errors == ()
    assert "zeta/chat-small: new, refused" in out.message
    summary = lambda o: next(l for l in o.rendered.files["rendered/PLAN.md"].splitlines() if l.startswith("**Plan:**"))  # noqa: E731,E741
    assert summary(alone).replace("1 refused", "2 refused").replace("7 models", "8 models") == summary(out)


def test_a_served_name_no_gpu_can_take_is_a_plan_refusal_in_plan_and_validate_alike(tmp_path, capsys):
    """issue 23: the planner knows the renderer's served-name rule; plan shows the twin refused with the rule
    and its fix, and neither plan nor validate has a render error left."""
    root = tmp_path / "fleet"
    shutil.copytree(FLEET, root)
    _twin_in_other_namespace(root)
    assert main(["validate", str(root)]) == 0
    capsys.readouterr()
    assert main(["plan", str(root), "-o", "json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    (twin,) = [d for d in planned["decisions"] if (d["namespace"], d["name"]) == ("zeta", "chat-small")]
    assert (twin["mode"], twin["reasonCode"]) == ("refused", "ServedNameTaken")
