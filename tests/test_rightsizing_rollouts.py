"""Which workers a pass restarts and which reconfigure in place (PLAN.md and the commit message say "N restart ·
M in place"), and PLAN.md's open right-sizing recommendations with the memory they free and their monthly cost."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from controller.cli.offline import pass_over
from controller.rendering.planmd import review_summary
from controller.rendering.rollouts import LOAD_BYTES_PER_S, Rollouts, worker_rollouts
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
    rollouts = worker_rollouts(before, after)
    assert (rollouts.restart, rollouts.removed) == (("worker-l4-node-1-gpu0-default",), ("worker-gpu-node-1-gpu0-default",))
    assert rollouts.summary == "1 restart · 0 in place · 1 removed"
    assert [(worker, [d.model for d in down]) for worker, down in rollouts.down] == [
        ("worker-l4-node-1-gpu0-default", ["llm/summarizer"])]


def _weights_by_model_id(product: str) -> dict[str, int]:
    """Each profiled model id's weight bytes, straight from the fleet's profiles."""
    docs = [yaml.safe_load(p.read_text()) for p in (FLEET / "profiles" / product).glob("*.yaml")]
    return {d["model"]: d["weights"]["totalBytes"] for d in docs}


def test_a_restart_names_every_model_it_takes_down_and_for_about_how_long(repo):
    """An image change on the H200 takes each of its models down until the new pod has loaded it: smallest
    first, so each waits for the weights before its own, at LOAD_BYTES_PER_S; PLAN.md's workers line (and so
    the commit message and the pull request body) names each one."""
    before = pass_over(repo).rendered.files
    after = dict(before)
    path = "rendered/gpushare-system/deployment-worker-gpu-node-1-gpu0-default.yaml"
    after[path] = before[path].replace("gpushare-worker:0.1.0", "gpushare-worker:0.2.0")
    [(worker, down)] = worker_rollouts(before, after).down
    config = yaml.safe_load(yaml.safe_load(before["rendered/gpushare-system/configmap-worker-gpu-node-1-gpu0-default"
                                                  ".yaml"])["data"]["worker.yaml"])
    weights = _weights_by_model_id("NVIDIA-H200")
    entries = sorted(config["models"], key=lambda m: (weights[m["model"]], f"{m['namespace']}/{m['name']}"))
    expected, elapsed = [], 0.0
    for entry in entries:
        elapsed += weights[entry["model"]] / LOAD_BYTES_PER_S
        expected.append((f"{entry['namespace']}/{entry['name']}", elapsed))
    assert worker == "worker-gpu-node-1-gpu0-default" and len(expected) >= 5
    assert [(d.model, round(d.seconds, 6)) for d in down] == [(m, round(s, 6)) for m, s in expected]
    line = worker_rollouts(before, after).line
    assert f"Down while {worker} restarts" in line
    assert all(f"{d.model} ~" in line for d in down)
    assert review_summary(f"# gpushare plan\n\n**Plan:** x\n\n{line}\n\n## Latest decision changes\n\n- a\n",
                          "0" * 40, "main").count("Down while") == 1


def test_rollouts_from_the_rendered_objects_equal_rollouts_from_the_parsed_files(repo):
    before = pass_over(repo).rendered.files
    edit(repo, "memoryBudget: 4Gi", "memoryBudget: 5Gi")  # an in-place change
    after = dict(pass_over(repo).rendered.files)
    path = "rendered/gpushare-system/deployment-worker-l4-node-1-gpu0-default.yaml"
    after[path] = after[path].replace("gpushare-worker:0.1.0", "gpushare-worker:0.2.0")  # a restart
    objects = {p: yaml.safe_load(text) for p, text in after.items() if "/deployment-" in p and p != path}
    rollouts = worker_rollouts(before, after, objects)
    assert rollouts == worker_rollouts(before, after)
    assert (rollouts.restart, rollouts.in_place) == (("worker-l4-node-1-gpu0-default",),
                                                     ("worker-gpu-node-1-gpu0-default",))


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
