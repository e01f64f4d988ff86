"""One reconcile pass over a GitOps directory: nothing lost on broken input, stable output, clear messages."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml

from controller.inputs.reader import read_repo
from controller.passes.reconcile import PassOutput, run_pass
from tests.conftest import REPO_ROOT

FLEET = REPO_ROOT / "examples" / "fleet"


def reconcile_into(root: Path) -> PassOutput:
    """A pass over `root`, its generated tree written back into `root` (as a commit would)."""
    out = run_pass(read_repo(root))
    for sub in ("rendered", "decisions"):
        shutil.rmtree(root / sub, ignore_errors=True)
    for path, text in out.rendered.files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return out


def generated(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): p.read_text() for sub in ("rendered", "decisions")
            for p in sorted((root / sub).rglob("*")) if p.is_file()}


@pytest.fixture
def repo(tmp_path) -> Path:
    shutil.copytree(FLEET, tmp_path / "repo")
    return tmp_path / "repo"


def test_broken_file_keeps_its_models_last_good_output_while_good_ones_update(repo):
    reconcile_into(repo)
    before = generated(repo)
    (repo / "models/llm/chat.yaml").write_text("apiVersion: gpushare.dev/v1alpha1\nkind: [unclosed\n")
    assistant = repo / "models/llm/assistant-8b.yaml"
    assistant.write_text(assistant.read_text().replace("memoryBudget: 24Gi", "memoryBudget: 8Gi"))

    out = reconcile_into(repo)
    after = generated(repo)

    assert out.revived == ("llm/chat-small", "llm/summarizer")
    assert [e.file for e in out.errors] == ["models/llm/chat.yaml"]
    for kept in ("decisions/llm/chat-small.yaml", "decisions/llm/summarizer.yaml"):
        # the same placement; its predictions may differ, since they count its co-tenants' decode steps
        placement = ("mode", "gpu", "residentLayers", "budgetBytes", "needBytes", "footprintBytes")
        was, now = (yaml.safe_load(x[kept])["status"]["assigned"] for x in (before, after))
        assert {k: now[k] for k in placement} == {k: was[k] for k in placement}
    assert "chat-small" in after["rendered/gpushare-system/configmap-worker-gpu-node-1-gpu0-default.yaml"]
    assigned = yaml.safe_load(after["decisions/llm/assistant-8b.yaml"])["status"]["assigned"]
    assert assigned["mode"] == "elastic" and assigned["budgetBytes"] == 8 * 2**30
    assert "served from its last good spec (its document is broken): llm/chat-small" in out.message


def test_document_naming_itself_but_invalid_is_revived_alone(repo):
    reconcile_into(repo)
    chat = repo / "models/llm/chat.yaml"
    chat.write_text(chat.read_text().replace("memoryBudget: 4Gi", "memoryBudget: 4 gigs", 1))
    out = reconcile_into(repo)
    assert out.revived == ("llm/chat-small",)
    assert [(e.object, e.reason) for e in out.errors] == [("llm/chat-small", "InvalidQuantity")]


def test_deleted_model_is_removed_from_the_generated_tree(repo):
    reconcile_into(repo)
    (repo / "models/llm/assistant-8b.yaml").unlink()
    out = reconcile_into(repo)
    assert out.revived == ()
    assert "decisions/llm/assistant-8b.yaml" not in generated(repo)
    subject, _, body = out.message.partition("\n\n")
    assert subject == "llm/assistant-8b: resident on gpu-node-1/gpu0 → removed; 3 more models affected"
    # its neighbours on the H200 decode faster without it: each shown before → after in the body
    assert re.search(r"^llm/chat-small: TTFT [0-9.]+ → [0-9.]+ ms \(all busy\); TPOT 44\.5 → [0-9.]+ ms \(all busy\)$",
                     body, re.M)


def test_second_pass_with_nothing_new_generates_identical_bytes(repo):
    reconcile_into(repo)
    first = generated(repo)
    reconcile_into(repo)
    assert generated(repo) == first


def test_renamed_and_reordered_files_change_nothing(repo, tmp_path):
    reconcile_into(repo)
    first = generated(repo)
    docs = [d for f in sorted((repo / "models").rglob("*.yaml")) for d in yaml.safe_load_all(f.read_text())]
    shutil.rmtree(repo / "models")
    (repo / "models").mkdir()
    for i, doc in enumerate(reversed(docs)):
        (repo / "models" / f"z{i}.yaml").write_text(yaml.safe_dump(doc))
    reconcile_into(repo)
    regenerated = generated(repo)
    strip = lambda files: {p: "\n".join(l for l in t.splitlines() if "gpushare.dev/source" not in l)  # noqa: E731
                           for p, t in files.items()}
    assert strip(regenerated) == strip(first)


def test_admission_that_moves_another_model_says_why(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(FLEET, repo)
    shutil.rmtree(repo / "models")
    (repo / "models").mkdir()
    coders = list(yaml.safe_load_all((FLEET / "models/llm/coders.yaml").read_text()))
    (repo / "models/a.yaml").write_text(yaml.safe_dump(coders[0]))
    big = list(yaml.safe_load_all((FLEET / "models/research/big.yaml").read_text()))[0]
    big["spec"]["memoryBudget"] = "100Gi"  # its slice grows into all the room the 32B leaves: the GPU is full
    (repo / "models/b.yaml").write_text(yaml.safe_dump(big))
    reconcile_into(repo)
    (repo / "models/c.yaml").write_text(yaml.safe_dump(coders[1]))
    out = reconcile_into(repo)
    assert out.message.splitlines()[0].startswith(
        "llm/coder-32b: resident on gpu-node-1/gpu0 → swap on gpu-node-1/gpu0 (llm/reviewer-32b admitted); TTFT ")


def test_spec_mode_is_reported_and_the_others_still_render(repo):
    chat = repo / "models/llm/assistant-8b.yaml"
    chat.write_text(chat.read_text().replace("  memoryBudget: 24Gi", "  memoryBudget: 24Gi\n  mode: resident"))
    out = reconcile_into(repo)
    assert [(e.object, e.reason) for e in out.errors] == [("llm/assistant-8b", "ModeNotAllowed")]
    assert "decisions/llm/chat-small.yaml" in generated(repo)
    assert "decisions/llm/assistant-8b.yaml" not in generated(repo)  # never had a good spec to fall back on


def test_same_name_in_two_namespaces_on_the_only_gpu_of_its_product_is_refused_by_the_plan(repo):
    """The planner knows the renderer's rule (a worker serves a name once): with one H200, the later twin is
    refused in the plan with ServedNameTaken and the fix, and compose has nothing left to refuse."""
    chat = repo / "models/llm/chat.yaml"
    twin = chat.read_text().split("---")[0].replace("namespace: llm", "namespace: zeta")
    (repo / "models/twin.yaml").write_text(twin)
    out = reconcile_into(repo)
    assert out.rendered.errors == ()
    decision = next(d for d in out.plan.decisions if (d.namespace, d.name) == ("zeta", "chat-small"))
    assert (decision.mode, decision.reason_code) == ("refused", "ServedNameTaken")
    assert "change metadata.name or spec.servedNames of one of them" in decision.reason
    config = yaml.safe_load(yaml.safe_load(generated(repo)[
        "rendered/gpushare-system/configmap-worker-gpu-node-1-gpu0-default.yaml"])["data"]["worker.yaml"])
    assert [m["namespace"] for m in config["models"] if m["name"] == "chat-small"] == ["llm"]


def test_a_moved_models_own_budget_change_is_named_first(repo):
    reconcile_into(repo)
    chat = repo / "models/llm/chat.yaml"
    chat.write_text(chat.read_text().replace("memoryBudget: 4Gi", "memoryBudget: 1Gi", 1))
    out = reconcile_into(repo)
    assert "(llm/chat-small budget changed)" in out.message.splitlines()[0]
    assert out.message.startswith("llm/chat-small: resident on gpu-node-1/gpu0 → elastic")


def test_plan_marks_models_served_from_their_last_good_spec(repo, capsys):
    from controller.cli.commands import main

    reconcile_into(repo)
    (repo / "models/llm/chat.yaml").write_text("kind: [unclosed\n")
    assert main(["plan", str(repo)]) == 1  # input errors: exit 1, the rest still planned
    out = capsys.readouterr().out
    assert "llm/chat-small (last good spec)" in out and "InvalidYAML" in out
