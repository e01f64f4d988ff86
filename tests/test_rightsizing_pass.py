"""The right-sizing pass against a real git remote (git daemon): Recommend commits the edit of the user's
file to a review branch (every other byte kept), Auto records an effective budget the next plan uses, usage
that cannot be read changes nothing and says so; and `gpushare rightsize --repo --usage` replays a file."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from controller.cli.commands import main
from controller.inputs.reader import load_repo
from controller.rightsizing.prometheus import UsageUnavailable
from controller.rightsizing.apply import rightsize_once
from controller.inputs.rightsizing_records import RECORDS_BRANCH
from controller.rightsizing.usage import Sample, dump_lines
from gitops import WorkingCopy
from tests.gitserver import git_server  # noqa: F401  (fixture)

REPO_ROOT = Path(__file__).resolve().parent.parent
FLEET = REPO_ROOT / "examples" / "fleet"
GiB = 1 << 30
NOW = 1_800_000_000.0
HOUR = 3600.0

CHAT = FLEET / "models" / "llm" / "chat.yaml"
RIGHTSIZING = {"policy": "Recommend", "downsizeAfter": "1h", "cooldown": "1h"}


def _fleet(tmp_path: Path) -> dict[str, bytes]:
    files = {p.relative_to(FLEET).as_posix(): p.read_bytes() for p in FLEET.rglob("*") if p.is_file()}
    chat = files["models/llm/chat.yaml"].decode()
    # chat-small: Recommend; summarizer: Auto with a floor. Added as text so the user's comments stay.
    chat = chat.replace("  gpu:\n    product: NVIDIA-H200\n",
                        "  gpu:\n    product: NVIDIA-H200  # pinned\n  rightsizing:\n    policy: Recommend\n"
                        "    downsizeAfter: 1h\n    cooldown: 1h\n", 1)
    chat = chat.replace("  gpu:\n    product: NVIDIA-L4\n",
                        "  gpu:\n    product: NVIDIA-L4\n  rightsizing: {policy: Auto, downsizeAfter: 1h, "
                        "minBudget: 2Gi}\n", 1)
    files["models/llm/chat.yaml"] = chat.encode()
    files["gpus.yaml"] = files["gpus.yaml"] + b"pricePerGpuHour: {NVIDIA-H200: 3.5, NVIDIA-L4: 0.8}\n"
    return files


def _usage(device_bytes: dict[str, int], hours: float = 3, step: float = 60.0):
    def read(start: float, end: float, fleet=None) -> list[Sample]:
        out, t = [], NOW - hours * HOUR
        while t <= NOW:
            if start <= t <= end:
                out += [Sample(time=t, model=ref, device_bytes=b, kv_used_bytes=b // 20, kv_reserved_bytes=b // 4)
                        for ref, b in device_bytes.items()]
            t += step
        return out
    return read


USAGE = {"llm/chat-small": GiB, "llm/summarizer": GiB + GiB // 2}


@pytest.mark.integration
def test_recommend_commits_the_users_file_edit_to_a_review_branch_and_auto_records_the_effective_budget(
        git_server, tmp_path):  # noqa: F811
    url = git_server.create_repo("fleet", _fleet(tmp_path))
    assert main(["reconcile", "--offline", "--repo", url, "--once", "--workdir", str(tmp_path / "r")]) == 0
    tracked = git_server.files("fleet")
    copy = WorkingCopy(url, "main", tmp_path / "w")
    result = rightsize_once(copy, _usage(USAGE), NOW, 3 * HOUR)

    review = git_server.files("fleet", branch="gpushare/rightsize-llm-chat-small")
    before, after = tracked["models/llm/chat.yaml"].decode(), review["models/llm/chat.yaml"].decode()
    proposed = result.step.records[("llm", "chat-small")].budget_bytes
    assert proposed == -(-GiB * 115 // 100 // (1 << 20)) * (1 << 20)  # the peak plus headroom, whole MiB
    new_token = f"memoryBudget: {proposed >> 20}Mi" if proposed % GiB else f"memoryBudget: {proposed >> 30}Gi"
    assert after == before.replace("memoryBudget: 4Gi", new_token, 1)  # byte for byte, comments and all
    assert {p: b for p, b in review.items() if p != "models/llm/chat.yaml"} == {
        p: b for p, b in tracked.items() if p != "models/llm/chat.yaml"}
    message = git_server_log(git_server, "gpushare/rightsize-llm-chat-small")
    assert message.startswith("llm/chat-small: memoryBudget 4.0Gi → ")
    assert "p99" in message and "peak 1.0Gi" in message and "Frees" in message and "Monthly cost effect: -" in message

    records = git_server.files("fleet")
    auto = yaml.safe_load(records["decisions/rightsizing/llm/summarizer.yaml"])
    assert auto["policy"] == "Auto" and auto["specBudgetBytes"] == 6 * GiB
    assert auto["budgetBytes"] == 2 * GiB  # its usage wants about 1.5Gi: minBudget holds it at 2Gi
    assert auto["evidence"]["samples"] > 60 and auto["fit"]["kind"] == "InPlace"
    assert records["models/llm/chat.yaml"] == tracked["models/llm/chat.yaml"]  # Auto never edits a user file

    checkout = tmp_path / "check"
    WorkingCopy(url, "main", checkout).sync()
    models = {m.name: m for m in load_repo(checkout).models}  # what every pass plans from
    assert models["summarizer"].budget_bytes == auto["budgetBytes"]
    assert models["summarizer"].spec_budget_bytes == 6 * GiB
    assert models["chat-small"].budget_bytes == 4 * GiB  # Recommend waits for the merge

    # the next reconcile pass plans summarizer with its effective budget (status shows it) and keeps the records
    assert main(["reconcile", "--offline", "--repo", url, "--once", "--workdir", str(tmp_path / "r")]) == 0
    after_pass = git_server.files("fleet")
    assigned = yaml.safe_load(after_pass["decisions/llm/summarizer.yaml"])["status"]["assigned"]
    assert assigned["budgetBytes"] == 2 * GiB
    assert after_pass["decisions/rightsizing/llm/summarizer.yaml"] == records["decisions/rightsizing/llm/summarizer.yaml"]

    rightsize_once(copy, _usage(USAGE), NOW + 60, 3 * HOUR)  # the review branch takes in the new tracked head
    again = rightsize_once(copy, _usage(USAGE), NOW + 120, 3 * HOUR)
    assert [p.commit for p in again.proposals] == [None] and again.records.commit is None
    assert git_server.files("fleet", branch="gpushare/rightsize-llm-chat-small")["models/llm/chat.yaml"] == \
        review["models/llm/chat.yaml"]


def git_server_log(server, branch: str) -> str:
    from tests.gitserver import git

    return git("log", "-1", "--format=%B", branch, cwd=server.path("fleet"))


@pytest.mark.integration
def test_unreadable_usage_changes_nothing_and_the_records_say_usage_missing(git_server, tmp_path):  # noqa: F811
    url = git_server.create_repo("fleet", _fleet(tmp_path))

    def down(start, end, fleet=None):
        raise UsageUnavailable("Prometheus at http://127.0.0.1:1 is unreachable: connection refused")

    result = rightsize_once(WorkingCopy(url, "main", tmp_path / "w"), down, NOW, 3 * HOUR)
    assert result.proposals == () and result.usage_error
    assert "gpushare/rightsize-llm-chat-small" not in git_branches(git_server)
    record = yaml.safe_load(git_server.files("fleet")["decisions/rightsizing/llm/chat-small.yaml"])
    assert record["budgetBytes"] == record["specBudgetBytes"] == 4 * GiB
    assert record["conditions"] == [{"type": "UsageAvailable", "status": "False", "reason": "UsageMissing",
                                     "message": "usage could not be read; no change made"}]
    checkout = tmp_path / "check"
    WorkingCopy(url, "main", checkout).sync()
    chat = next(m for m in load_repo(checkout).models if m.name == "chat-small")
    assert chat.rightsizing_conditions == tuple(record["conditions"])  # what its status shows


def git_branches(server) -> str:
    from tests.gitserver import git

    return git("branch", "--list", cwd=server.path("fleet"))


def test_replay_prints_each_decision_with_its_timestamp(tmp_path, capsys):
    repo = tmp_path / "repo"
    for path, data in _fleet(tmp_path).items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_bytes(data)
    usage = tmp_path / "usage.jsonl"
    samples = _usage(USAGE)(0, NOW)
    samples.append(Sample(time=NOW + 60, model="llm/chat-small", device_bytes=GiB, ooms=1))
    usage.write_text("".join(dump_lines(samples)))
    assert main(["rightsize", "--repo", str(repo), "--usage", str(usage)]) == 0
    out = capsys.readouterr().out
    lines = [line.strip() for line in out.splitlines()]
    chat = lines.index(next(x for x in lines if x.startswith("llm/chat-small: policy Recommend, budget 4.0Gi")))
    assert lines[chat + 1].startswith("2027-01-15T06:00:00Z") and " down " in lines[chat + 1] and "BelowTarget" in lines[chat + 1]
    assert lines[chat + 2].startswith("2027-01-15T08:01:00Z") and " up " in lines[chat + 2] and "OutOfMemory" in lines[chat + 2]
    assert any(x.startswith("llm/summarizer: policy Auto") for x in lines)
    assert "llm/assistant-8b" not in out  # policy Off


@pytest.mark.integration
def test_the_pass_command_with_prometheus_down_commits_only_the_hold_and_exits_1(git_server, tmp_path, capsys,
                                                                                 monkeypatch):  # noqa: F811
    import tempfile
    url = git_server.create_repo("fleet", _fleet(tmp_path))
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    code = main(["rightsize", "--repo", url, "--prometheus", "http://127.0.0.1:9", "--window", "1h"])
    out, err = capsys.readouterr()
    assert not list(scratch.iterdir())  # the temporary checkout is gone
    assert code == 1 and "usage unavailable, no budget changed" in err and "unreachable" in err
    assert "usage unavailable, no budget changed (2 models hold)" in out
    assert set(git_server.files("fleet")) >= {"decisions/rightsizing/llm/chat-small.yaml",
                                              "decisions/rightsizing/llm/summarizer.yaml"}


@pytest.mark.integration
def test_the_pass_command_under_review_commits_the_records_to_their_review_branch(git_server, tmp_path,
                                                                                  capsys):  # noqa: F811
    url = git_server.create_repo("fleet", _fleet(tmp_path))
    code = main(["rightsize", "--repo", url, "--prometheus", "http://127.0.0.1:9", "--window", "1h", "--review",
                 "--workdir", str(tmp_path / "w")])
    assert code == 1 and f"{RECORDS_BRANCH}: " in capsys.readouterr().out  # 1: usage was unavailable
    assert not any(p.startswith("decisions/rightsizing/") for p in git_server.files("fleet"))
    assert "decisions/rightsizing/llm/chat-small.yaml" in git_server.files("fleet", branch=RECORDS_BRANCH)


def test_the_pass_command_needs_both_git_and_prometheus(capsys):
    assert main(["rightsize", "--repo", "/nowhere"]) == 2
    assert "either --usage FILE (replay) or --prometheus URL" in capsys.readouterr().err


def test_a_merged_proposal_closes_and_its_breaches_do_not_act_twice():
    from dataclasses import replace as dc_replace

    from controller.policy import Rightsizing
    from controller.inputs.rightsizing_records import Record
    from controller.rightsizing.step import step
    from factories import toy_model

    policy = Rightsizing(policy="Recommend", upsize_after_s=60, downsize_after_s=3600)
    samples = [Sample(time=NOW - 600 + 15 * i, model="llm/chat", device_bytes=3 * GiB, ooms=int(i == 0))
               for i in range(40)]
    user = dc_replace(toy_model("chat", 4 * GiB), rightsizing=policy)
    first = step([user], [], [], {}, {"llm/chat": samples}, NOW)
    proposed = first.records[("llm", "chat")]
    assert proposed.open and proposed.direction == "up" and len(first.proposals) == 1
    merged = dc_replace(user, budget_bytes=proposed.budget_bytes)  # the user merged the review branch
    second = step([merged], [], [], {proposed.key: proposed}, {"llm/chat": samples}, NOW + 15)
    record = second.records[("llm", "chat")]
    assert not record.open and record.at == proposed.at and second.proposals == ()


@pytest.mark.integration
def test_recommend_in_a_cluster_edits_the_models_file_read_from_git(git_server, tmp_path):  # noqa: F811
    """A cluster's controller checks out no models/ (it holds every cluster's models): the proposal edits the
    file as git holds it, byte for byte as in the single-cluster layout."""
    from controller.cli.common import controller_copy
    from controller.inputs.layout import Layout

    files = _fleet(tmp_path)
    files["clusters/eu-1/gpus.yaml"] = files.pop("gpus.yaml")
    url = git_server.create_repo("fleet", files)
    assert main(["reconcile", "--offline", "--repo", url, "--once", "--workdir", str(tmp_path / "r"),
                 "--cluster", "eu-1"]) == 0
    tracked = git_server.files("fleet")
    copy = controller_copy(url, "main", tmp_path / "w", layout=Layout("eu-1"))
    result = rightsize_once(copy, _usage(USAGE), NOW, 3 * HOUR, cluster="eu-1")
    assert not (copy.root / "models").exists(), "models/ is read from git"
    (branch,) = [p.branch for p in result.proposals]
    review = git_server.files("fleet", branch=branch)
    proposed = result.step.records[("llm", "chat-small")].budget_bytes
    new_token = f"memoryBudget: {proposed >> 20}Mi" if proposed % GiB else f"memoryBudget: {proposed >> 30}Gi"
    assert review["models/llm/chat.yaml"].decode() == tracked["models/llm/chat.yaml"].decode().replace(
        "memoryBudget: 4Gi", new_token, 1)
