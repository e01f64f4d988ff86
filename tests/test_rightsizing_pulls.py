"""With `--write-back pr:BRANCH`, each right-sizing Recommend branch gets its own pull (merge) request on GitHub,
GitLab or Gitea: opened for a new proposal with the evidence as its body, updated (never duplicated) while it is
open, and never reopened once the reviewer closed it while the loop only carries the same proposal. The records
go to their own review branch (with its request) instead of the tracked branch. The forges are
the HTTP doubles of tests/test_forge.py, Prometheus a double over HTTP, the git remote a real `git daemon`."""
from __future__ import annotations

import pytest

from controller.cli.commands import main
from controller.inputs.rightsizing_records import RECORDS_BRANCH
from tests.gitserver import git, git_server  # noqa: F401  (fixture)
from tests.promdouble import PrometheusDouble
from tests.test_forge import REPO, TOKEN, ForgeDouble, forge  # noqa: F401  (fixture)
from tests.test_rightsizing_pass import _fleet

pytestmark = pytest.mark.integration

GiB = 1 << 30
PROPOSAL = "gpushare/rightsize-llm-chat-small"
USAGE = {"llm/chat-small": {"deviceBytes": GiB, "kvUsedBytes": GiB // 20, "kvReservedBytes": GiB // 4},
         "llm/summarizer": {"deviceBytes": GiB + GiB // 2, "kvUsedBytes": GiB // 20, "kvReservedBytes": GiB // 4}}


def _proposal_pulls() -> list[dict]:
    return [p for p in ForgeDouble.pulls if p["head"] == PROPOSAL]


def _head_message(server) -> tuple[str, str]:
    bare = server.path(REPO)
    return (git("log", "-1", "--format=%s", PROPOSAL, cwd=bare), git("log", "-1", "--format=%b", PROPOSAL, cwd=bare))


def test_a_recommendation_gets_one_pull_request_updated_while_open_and_left_closed(forge, git_server, tmp_path,
                                                                                   caplog):  # noqa: F811
    kind, api = forge
    url = git_server.create_repo(REPO, _fleet(tmp_path))
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    with PrometheusDouble(USAGE, 60) as prom:
        argv = ["reconcile", "--offline", "--once", "--repo", url, "--write-back", "pr:gpushare/plan", "--forge", kind,
                "--forge-api-url", api, "--git-token-file", str(token), "--workdir", str(tmp_path / "checkout"),
                "--prometheus", prom.url, "--rightsize-window", "3h", "--rightsize-step", "60s"]

        assert main(argv) == 0  # a new proposal: its request is opened with the commit's subject and evidence
        (pull,) = _proposal_pulls()
        subject, body = _head_message(git_server)
        assert (pull["base"], pull["title"], pull["body"], pull["open"]) == ("main", subject, body.strip(), True)
        assert subject.startswith("llm/chat-small: memoryBudget 4.0Gi → ") and "Window: " in body
        assert "Device bytes: p99 " in body and "Merge this branch to apply the budget" in body

        # review mode: the records go to their own review branch with its request, not to the tracked branch
        assert not any(p.startswith("decisions/rightsizing/") for p in git_server.files(REPO))
        records = git_server.files(REPO, branch=RECORDS_BRANCH)
        assert "decisions/rightsizing/llm/chat-small.yaml" in records
        (records_pull,) = [p for p in ForgeDouble.pulls if p["head"] == RECORDS_BRANCH]
        assert records_pull["open"] and records_pull["title"].startswith("gpushare right-sizing")

        git_server.push_files(REPO, {"NOTES.md": b"a team note\n"}, "unrelated change")
        assert main(argv) == 0  # carried to the moved tracked branch: the open request is updated, not duplicated
        (pull,) = _proposal_pulls()
        assert pull["open"] and pull["title"] == _head_message(git_server)[0]
        writes = [c for c in ForgeDouble.calls if c[0] in ("POST", "PATCH", "PUT")]
        assert sum(1 for c in writes if c[0] == "POST" and PROPOSAL in str(c[3])) == 1

        pull["open"] = False  # the reviewer closes it (rejects the recommendation)
        git_server.push_files(REPO, {"NOTES.md": b"moved on\n"}, "another unrelated change")
        before = len(ForgeDouble.pulls)
        assert main(argv) == 0  # the same proposal, carried again: a closed request stays closed
        assert len(_proposal_pulls()) == 1 and not _proposal_pulls()[0]["open"]
        assert len(ForgeDouble.pulls) == before
    assert TOKEN not in caplog.text
