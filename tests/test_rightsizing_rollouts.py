"""Which workers a pass restarts and which reconfigure in place (PLAN.md and the commit message say "N restart ·
M in place"), and PLAN.md's open right-sizing recommendations with the memory they free and their monthly cost."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from controller.cli.offline import pass_over
from controller.rendering.rollouts import Rollouts, worker_rollouts
from controller.inputs.rightsizing_records import Record
from tests.conftest import REPO_ROOT

FLEET = REPO_ROOT / "examples" / "fleet"
GiB = 1 << 30
CHAT = "models/llm/chat.yaml"


def write_pass(root: Path):
    """A pass over `root` (through the one reader), its generated tree written back as a commit would."""
    out = pass_over(root)
    for sub in ("rendered",):
        shutil.rmtree(root / sub, ignore_errors=True)
    for path, text in out.rendered.files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return out


@pytest.fixture
def repo(tmp_path) -> Path:
    shutil.copytree(FLEET, tmp_path / "repo")
    write_pass(tmp_path / "repo")
    return tmp_path / "repo"


def edit(root: Path, old: str, new: str) -> None:
    path = root / CHAT
    path.write_text(path.read_text().replace(old, new, 1))


def test_a_budget_change_reconfigures_its_worker_in_place_and_says_so(repo):
    before = {p: t for p, t in pass_over(repo).rendered.files.items()}
    edit(repo, "memoryBudget: 4Gi", "memoryBudget: 5Gi")  # chat-small: resident, its need is unchanged
    out = write_pass(repo)
    rollouts = worker_rollouts(before, out.rendered.files)
    assert rollouts == Rollouts(in_place=("worker-gpu-node-1-gpu0-default",))
    assert out.message.splitlines()[2] == "Workers: 0 restart · 1 in place (in place: worker-gpu-node-1-gpu0-default)."
    plan_md = out.rendered.files["rendered/PLAN.md"]
    assert "Workers: 0 restart · 1 in place (in place: worker-gpu-node-1-gpu0-default)." in plan_md
    again = write_pass(repo)  # nothing new: the line is carried, PLAN.md is byte-identical
    assert again.rendered.files["rendered/PLAN.md"] == plan_md


def test_a_changed_pod_template_is_a_restart(repo):
    before = pass_over(repo).rendered.files
    after = dict(before)
    path = "rendered/gpushare-system/deployment-worker-l4-node-1-gpu0-default.yaml"
    after[path] = before[path].replace("ghcr.io/gpushare/gpushare-worker:0.1.0", "ghcr.io/gpushare/gpushare-worker:0.2.0")
    gone = "rendered/gpushare-system/deployment-worker-gpu-node-1-gpu0-default.yaml"
    del after[gone]
    assert worker_rollouts(before, after) == Rollouts(restart=("worker-l4-node-1-gpu0-default",),
                                                      removed=("worker-gpu-node-1-gpu0-default",))
    assert worker_rollouts(before, after).summary == "1 restart · 0 in place · 1 removed"


def test_rollouts_from_the_rendered_objects_equal_rollouts_from_the_parsed_files(repo):
    before = pass_over(repo).rendered.files
    edit(repo, "memoryBudget: 4Gi", "memoryBudget: 5Gi")  # an in-place change
    after = dict(pass_over(repo).rendered.files)
    path = "rendered/gpushare-system/deployment-worker-l4-node-1-gpu0-default.yaml"
    after[path] = after[path].replace("gpushare-worker:0.1.0", "gpushare-worker:0.2.0")  # a restart
    objects = {p: yaml.safe_load(text) for p, text in after.items() if "/deployment-" in p and p != path}
    assert worker_rollouts(before, after, objects) == worker_rollouts(before, after) == Rollouts(
        restart=("worker-l4-node-1-gpu0-default",), in_place=("worker-gpu-node-1-gpu0-default",))


def test_a_pass_with_nothing_new_parses_no_deployment(repo, monkeypatch):
    def refuse(text):
        raise AssertionError("a Deployment the pass rendered was parsed back from its text")

    monkeypatch.setattr("controller.rendering.rollouts._parse", refuse)
    out = pass_over(repo)  # the previous tree is the one this pass renders again
    assert "workers not compared" not in out.rendered.files["rendered/PLAN.md"]  # the trees were compared
    assert out.rendered.rollouts == Rollouts()
    assert "Workers: " not in out.message


def test_plan_md_lists_open_recommendations_with_memory_and_monthly_cost(repo):
    (repo / "gpus.yaml").write_text((repo / "gpus.yaml").read_text() + "pricePerGpuHour: {NVIDIA-H200: 3.5}\n")
    record = Record("llm", "chat-small", "Recommend", 4 * GiB, 2 * GiB, "down", "BelowTarget",
                    "2027-01-15T06:00:00Z", {}, {"kind": "InPlace"}, "gpushare/rightsize-llm-chat-small")
    path = repo / record.path
    path.parent.mkdir(parents=True)
    path.write_text(record.dump())
    plan_md = pass_over(repo).rendered.files["rendered/PLAN.md"]
    section = plan_md.split("## Open right-sizing recommendations", 1)[1].split("\n## ", 1)[0]
    slot_bytes = 143771 * (1 << 20)
    cost = -2 * GiB / slot_bytes * 3.5 * 730
    assert f"1 open · frees 2.0Gi · monthly cost {cost:+.2f}" in section
    assert (f"| llm/chat-small | 4.0Gi → 2.0Gi | frees 2.0Gi | {cost:+.2f} | BelowTarget | InPlace | - | "
            "review `gpushare/rightsize-llm-chat-small` |") in section
    assert plan_md.index("## Open right-sizing") < plan_md.index("## Latest decision changes")


def test_plan_md_lists_a_kv_reservation_advice_beside_budgets_even_when_the_budget_stays(repo):
    kv = {"recommendedBytes": 3 * 64 << 20, "sequences": 3, "contextTokens": 2048, "reservedBytes": 64 << 20,
          "floorBytes": 64 << 20, "floor": "one full-context sequence (2048 tokens)", "change": "grow"}
    record = Record("llm", "chat-small", "Recommend", 4 * GiB, 4 * GiB, kv=kv)
    path = repo / record.path
    path.parent.mkdir(parents=True)
    path.write_text(record.dump())
    section = pass_over(repo).rendered.files["rendered/PLAN.md"].split("## Open right-sizing recommendations", 1)[1]
    assert "| llm/chat-small | 4.0Gi (kept) | - | - | - | - | 64.0Mi → 192.0Mi (3 × 2048 tokens) | advice |" in section


def test_status_shows_the_policy_the_effective_budget_and_the_open_recommendation():
    from dataclasses import replace

    from controller.observe.status import status_patch
    from controller.policy import Rightsizing
    from factories import toy_model

    recommendation = {"budgetBytes": 2 * GiB, "direction": "down", "reason": "BelowTarget"}
    model = replace(toy_model("chat", 2 * GiB), rightsizing=Rightsizing(policy="Auto"), user_budget_bytes=6 * GiB,
                    rightsizing_recommendation=recommendation)
    assert status_patch(model, [], None)["status"]["rightsizing"] == {
        "policy": "Auto", "specBudgetBytes": 6 * GiB, "effectiveBudgetBytes": 2 * GiB,
        "recommendation": recommendation}
    assert status_patch(toy_model("plain", GiB), [], None)["status"]["rightsizing"] is None
