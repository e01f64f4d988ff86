"""`gpushare plan` and `gpushare explain` read the repository through one reader and plan alike:
the same mode, slot and reason for every model, also when some model files are broken now (those are
planned from their last good spec, kept beside their decisions)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from controller.cli.commands import main

ROOT = Path(__file__).resolve().parent.parent
FLEET = ROOT / "examples" / "fleet"
GOLDEN_DECISIONS = ROOT / "tests" / "golden" / "fleet" / "decisions"


def fleet_with_broken_files(tmp_path: Path) -> Path:
    """examples/fleet plus its last decisions, with one model file garbled and one with a bad field."""
    repo = tmp_path / "repo"
    shutil.copytree(FLEET, repo)
    shutil.copytree(GOLDEN_DECISIONS, repo / "decisions")
    (repo / "models" / "llm" / "assistant-8b.yaml").write_text("apiVersion: [unclosed\n")
    chat = repo / "models" / "llm" / "chat.yaml"
    text = chat.read_text()
    assert "memoryBudget: 4Gi" in text
    chat.write_text(text.replace("memoryBudget: 4Gi", "memoryBudget: four gigabytes", 1))
    return repo


def plan_json(repo: Path, capsys) -> list[dict]:
    main(["plan", str(repo), "-o", "json"])
    return json.loads(capsys.readouterr().out)["decisions"]


@pytest.mark.parametrize("case", ["examples-fleet", "fleet-with-broken-files"])
def test_explain_tells_the_plan_of_every_model(case, tmp_path, capsys):
    repo = FLEET if case == "examples-fleet" else fleet_with_broken_files(tmp_path)
    decisions = plan_json(repo, capsys)
    assert decisions, case
    for d in decisions:
        assert main(["explain", d["name"], "-n", d["namespace"], "--repo", str(repo)]) == 0, d["name"]
        text = capsys.readouterr().out
        assert f"Mode: {d['mode']} ({d['reasonCode']})" in text, (case, d["name"])
        assert d["reason"] in text, (case, d["name"])
        if d["gpu"]["slot"]:
            assert f"slot {d['gpu']['slot']} " in text, (case, d["name"])


def test_the_broken_fixture_really_revives_models_from_their_last_good_spec(tmp_path, capsys):
    repo = fleet_with_broken_files(tmp_path)
    assert main(["validate", str(repo)]) == 1
    report = capsys.readouterr().out
    assert "assistant-8b.yaml" in report and "chat.yaml" in report
    names = {d["name"] for d in plan_json(repo, capsys)}
    assert {"assistant-8b", "chat-small"} <= names  # still planned, from decisions/
