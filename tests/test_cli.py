"""The `gpushare` command line, as a user and a PR check run it."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from controller.cli.commands import main
from tests.conftest import REPO_ROOT
from tests.gitserver import git_server  # noqa: F401  (fixture)

FLEET = REPO_ROOT / "examples" / "fleet"
BROKEN = REPO_ROOT / "tests" / "fixtures" / "broken"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_json_shows_all_three_modes_a_refusal_and_the_documented_fields(capsys):
    code, out, _ = run(capsys, "plan", str(FLEET), "-o", "json")
    doc = json.loads(out)
    assert code == 0
    assert {d["mode"] for d in doc["decisions"]} == {"resident", "swap", "elastic", "refused"}
    assert [p["name"] for p in doc["pending"]] == ["mistral-7b"]
    assert doc["errors"] == []
    required = {"name", "namespace", "model", "gpu", "mode", "residentLayers", "totalLayers", "needBytes",
                "budgetBytes", "predicted", "sloMet", "reason"}
    assert all(required <= set(d) for d in doc["decisions"])
    elastic = next(d for d in doc["decisions"] if d["mode"] == "elastic")
    assert elastic["residentLayers"] < elastic["totalLayers"] and elastic["gpu"]["slot"] == "gpu-node-1/gpu0"


def test_plan_yaml_carries_the_same_document_as_json(capsys):
    _, as_json, _ = run(capsys, "plan", str(FLEET), "-o", "json")
    _, as_yaml, _ = run(capsys, "plan", str(FLEET), "-o", "yaml")
    assert yaml.safe_load(as_yaml) == json.loads(as_json)


def test_plan_table_has_one_section_per_slot(capsys):
    _, out, _ = run(capsys, "plan", str(FLEET))
    assert "gpu-node-1/gpu0 (NVIDIA-H200)" in out and "l4-node-1/gpu0 (NVIDIA-L4)" in out
    assert "NAME" in out and "research/analyst-70b" in out
    # the shipped profiles are estimates: every prediction and verdict says so, never a bare "met"
    chat = next(line for line in out.splitlines() if "llm/chat-small" in line)
    assert chat.rstrip().endswith("met (est.)") and "ms (est.)" in chat


def test_validate_reports_every_broken_file_and_exits_1(capsys):
    code, out, _ = run(capsys, "validate", str(BROKEN))
    assert code == 1
    reported = {line.split(" ", 1)[0] for line in out.splitlines()[:-1]}
    good = {"gpus.yaml", "profiles/NVIDIA-H200/good.yaml"}
    assert reported == {p.relative_to(BROKEN).as_posix() for p in BROKEN.rglob("*.yaml")} - good
    assert "Fix:" in out


def test_validate_accepts_the_example_fleet(capsys):
    code, out, _ = run(capsys, "validate", str(FLEET))
    assert code == 0
    assert out.strip().endswith("0 error(s)")


def test_explain_gives_the_arithmetic_and_the_budget_that_would_change_it(capsys):
    code, out, _ = run(capsys, "explain", "analyst-70b", "--repo", str(FLEET))
    assert code == 0
    assert "Mode: elastic (ExceedsBudget)" in out
    assert "need = weights + KV cache + activation peak + runtime overhead" in out
    assert "keeps one more of the 63 streamed layers resident" in out
    assert "Not resident:" in out and "Not swap:" in out


def test_explain_unknown_model_exits_1_with_the_known_names(capsys):
    code, _, err = run(capsys, "explain", "nope", "--repo", str(FLEET))
    assert code == 1 and "ModelNotFound" in err and "llm/chat-small" in err


def test_plan_on_a_missing_directory_is_a_usage_error(capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        main(["plan", str(tmp_path / "missing")])
    assert exc.value.code == 2


@pytest.mark.integration
def test_reconcile_offline_against_a_git_daemon_commits_once_then_nothing(capsys, git_server, tmp_path):  # noqa: F811
    files = {p.relative_to(FLEET).as_posix(): p.read_bytes() for p in FLEET.rglob("*") if p.is_file()}
    url = git_server.create_repo("fleet", files)
    code, out, _ = run(capsys, "reconcile", "--offline", "--repo", url, "--once", "--workdir", str(tmp_path / "w"))
    assert code == 0 and "committed" in out
    assert "decisions/llm/chat-small.yaml" in git_server.files("fleet")
    code, out, _ = run(capsys, "reconcile", "--offline", "--repo", url, "--workdir", str(tmp_path / "w"))
    assert code == 0 and "no change" in out


@pytest.mark.integration
def test_reconcile_to_a_review_branch_leaves_the_tracked_branch_alone(capsys, git_server, tmp_path):  # noqa: F811
    files = {p.relative_to(FLEET).as_posix(): p.read_bytes() for p in FLEET.rglob("*") if p.is_file()}
    url = git_server.create_repo("fleet", files)
    head = git_server.head("fleet")
    code, out, _ = run(capsys, "reconcile", "--offline", "--repo", url,
                       "--write-back", "branch:gpushare/plan", "--workdir", str(tmp_path / "w"))
    assert code == 0 and "to gpushare/plan" in out
    assert git_server.head("fleet") == head
    assert "rendered/PLAN.md" in git_server.files("fleet", branch="gpushare/plan")


def test_reconcile_with_an_unreachable_remote_fails_with_the_fix(capsys, tmp_path):
    code, _, err = run(capsys, "reconcile", "--offline", "--repo", "git://127.0.0.1:9/none.git",
                       "--workdir", str(tmp_path / "w"))
    assert code == 1 and "GitUnreachable" in err and "fix:" in err


def test_bad_write_back_value_is_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        main(["reconcile", "--offline", "--repo", "x", "--write-back", "sideways"])
    assert "neither 'direct', 'branch:NAME' nor 'pr:NAME'" in capsys.readouterr().err


def test_the_console_script_runs_the_demo():
    proc = subprocess.run([str(Path(sys.executable).parent / "gpushare"), "demo"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "committed" in proc.stdout and "commits nothing" in proc.stdout and "no change" in proc.stdout


def test_validate_pointed_at_the_wrong_directory_fails(capsys, tmp_path):
    assert main(["validate", str(tmp_path)]) == 1
    assert "[NothingToValidate]" in capsys.readouterr().out
