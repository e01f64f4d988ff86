"""`--write-back pr:BRANCH`: the review branch is pushed and its one pull (merge) request is opened, then updated,
never duplicated, through GitHub's, GitLab's and Gitea's HTTP APIs. The forges are doubles on 127.0.0.1 that keep
requests and record each call exactly (method, path and query, auth header, JSON body); the git remote is a real
`git daemon`."""
from __future__ import annotations

import json
import shutil
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from controller.cli.commands import main
from gitops.forge import ForgeError, forge_for, repository_of
from tests.conftest import REPO_ROOT
from tests.gitserver import git, git_server  # noqa: F401  (the fixture)

TOKEN = "forge-token-5ecret"
REPO, BRANCH = "platform/fleet.git", "gpushare/plan"
AUTH = {"github": ("Authorization", f"Bearer {TOKEN}"), "gitlab": ("PRIVATE-TOKEN", TOKEN),
        "gitea": ("Authorization", f"token {TOKEN}")}


class ForgeDouble(BaseHTTPRequestHandler):
    """One forge's pull request API over one repository (platform/fleet), in memory."""

    kind = "github"
    pulls: list[dict] = []
    calls: list[tuple[str, str, str | None, dict | None]] = []

    def _answer(self, status: int, body) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _record(self) -> dict | None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        ForgeDouble.calls.append((self.command, self.path, self.headers.get(AUTH[self.kind][0]), body))
        return body

    def _view(self, pull: dict) -> dict:
        if self.kind == "gitlab":
            return {"iid": pull["number"], "web_url": f"http://forge/mr/{pull['number']}", **pull}
        return {"number": pull["number"], "html_url": f"http://forge/pull/{pull['number']}",
                "head": {"ref": pull["head"]}, "base": {"ref": pull["base"]}, **{k: pull[k] for k in ("title", "body")}}

    def do_GET(self):  # noqa: N802
        self._record()
        query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(self.path).query))
        open_pulls = [p for p in ForgeDouble.pulls if p["open"]]
        if self.kind == "github":
            open_pulls = [p for p in open_pulls if f"platform:{p['head']}" == query["head"] and p["base"] == query["base"]]
        elif self.kind == "gitlab":
            open_pulls = [p for p in open_pulls if p["head"] == query["source_branch"]
                          and p["base"] == query["target_branch"]]
        self._answer(200, [self._view(p) for p in open_pulls])

    def do_POST(self):  # noqa: N802
        body = self._record()
        head = body.get("head") or body.get("source_branch")
        base = body.get("base") or body.get("target_branch")
        pull = {"number": len(ForgeDouble.pulls) + 1, "head": head, "base": base, "title": body["title"],
                "body": body.get("body") or body.get("description"), "open": True}
        ForgeDouble.pulls.append(pull)
        self._answer(201, self._view(pull))

    def _update(self):
        body = self._record()
        number = int(self.path.rsplit("/", 1)[1])
        pull = ForgeDouble.pulls[number - 1]
        pull.update(title=body["title"], body=body.get("body") or body.get("description"))
        self._answer(200, self._view(pull))

    do_PATCH = do_PUT = _update  # noqa: N815

    def log_message(self, *args):
        pass


@pytest.fixture(params=["github", "gitlab", "gitea"])
def forge(request):
    ForgeDouble.kind, ForgeDouble.pulls, ForgeDouble.calls = request.param, [], []
    server = ThreadingHTTPServer(("127.0.0.1", 0), ForgeDouble)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield request.param, f"http://127.0.0.1:{server.server_port}/api"
    server.shutdown()
    server.server_close()


def fleet_files() -> dict[str, bytes]:
    root = REPO_ROOT / "examples" / "fleet"
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*.yaml")}


def expected_calls(kind: str, *, existing: int | None, title: str, body: str) -> list[tuple]:
    """The exact requests one pass makes: find the open request, then update it or create one."""
    auth = AUTH[kind][1]
    if kind == "github":
        find = ("GET", f"/api/repos/platform/fleet/pulls?head=platform%3Agpushare%2Fplan&base=main&state=open",
                auth, None)
        write = (("PATCH", f"/api/repos/platform/fleet/pulls/{existing}", auth, {"title": title, "body": body})
                 if existing else ("POST", "/api/repos/platform/fleet/pulls", auth,
                                   {"title": title, "head": BRANCH, "base": "main", "body": body}))
    elif kind == "gitlab":
        find = ("GET", "/api/projects/platform%2Ffleet/merge_requests?source_branch=gpushare%2Fplan"
                       "&target_branch=main&state=opened", auth, None)
        write = (("PUT", f"/api/projects/platform%2Ffleet/merge_requests/{existing}", auth,
                  {"title": title, "description": body}) if existing else
                 ("POST", "/api/projects/platform%2Ffleet/merge_requests", auth,
                  {"source_branch": BRANCH, "target_branch": "main", "title": title, "description": body}))
    else:
        find = ("GET", "/api/repos/platform/fleet/pulls?state=open&limit=50&page=1", auth, None)
        write = (("PATCH", f"/api/repos/platform/fleet/pulls/{existing}", auth, {"title": title, "body": body})
                 if existing else ("POST", "/api/repos/platform/fleet/pulls", auth,
                                   {"title": title, "head": BRANCH, "base": "main", "body": body}))
    return [find, write]


def review_head(server) -> tuple[str, str, str]:
    """(subject, PLAN.md, sha) of the review branch's head on the remote."""
    bare = server.path(REPO)
    sha = git("rev-parse", BRANCH, cwd=bare)
    return git("log", "-1", "--format=%s", sha, cwd=bare), git("show", f"{sha}:rendered/PLAN.md", cwd=bare), sha


def test_one_pull_request_per_review_branch_opened_then_updated(forge, git_server, tmp_path, capsys):  # noqa: F811
    kind, api = forge
    url = git_server.create_repo(REPO, fleet_files())
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    argv = ["reconcile", "--offline", "--once", "--repo", url, "--write-back", f"pr:{BRANCH}", "--forge", kind,
            "--forge-api-url", api, "--git-token-file", str(token), "--workdir", str(tmp_path / "checkout")]

    assert main(argv) == 0
    subject, plan, sha = review_head(git_server)
    assert "Latest decision changes" in plan
    (call_find, call_write) = ForgeDouble.calls
    body = call_write[3].get("body") or call_write[3].get("description")
    assert [call_find, call_write] == expected_calls(kind, existing=None, title=subject, body=body)
    assert body.startswith(plan.splitlines()[2]) and "- llm/chat-small: new, resident" in body and sha[:12] in body
    first = capsys.readouterr()
    assert f"opened {kind} pull request #1 ({BRANCH} into main)" in first.out

    model = "models/llm/chat.yaml"
    text = (REPO_ROOT / "examples" / "fleet" / model).read_text().replace("memoryBudget: 4Gi", "memoryBudget: 1Gi", 1)
    git_server.push_files(REPO, {model: text.encode()}, "chat-small: 1Gi")
    ForgeDouble.calls = []
    assert main(argv) == 0
    subject, plan, sha = review_head(git_server)
    body = ForgeDouble.calls[1][3].get("body") or ForgeDouble.calls[1][3].get("description")
    assert ForgeDouble.calls == expected_calls(kind, existing=1, title=subject, body=body)
    assert "llm/chat-small" in body and sha[:12] in body
    assert len(ForgeDouble.pulls) == 1 and ForgeDouble.pulls[0]["title"] == subject  # updated, not duplicated
    second = capsys.readouterr()
    assert f"updated {kind} pull request #1" in second.out
    assert TOKEN not in first.out + first.err + second.out + second.err


def test_the_no_change_line_names_the_review_branch_and_its_own_commit(git_server, tmp_path, capsys):  # noqa: F811
    url = git_server.create_repo(REPO, fleet_files())
    argv = ["reconcile", "--offline", "--once", "--repo", url, "--write-back", f"branch:{BRANCH}",
            "--workdir", str(tmp_path / "checkout")]
    assert main(argv) == 0 and main(argv) == 0
    review = git("rev-parse", BRANCH, cwd=git_server.path(REPO))
    tracked = git("rev-parse", "main", cwd=git_server.path(REPO))
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == f"no change ({BRANCH} at {review[:12]}; main at {tracked[:12]})"


@pytest.mark.parametrize("url, host, repository", [
    pytest.param("https://github.com/platform/fleet.git", "github.com", "platform/fleet", id="https"),
    pytest.param("git@gitlab.example.com:group/sub/fleet.git", "gitlab.example.com", "group/sub/fleet", id="scp-like"),
    pytest.param("ssh://git@gitea.example.com:2222/platform/fleet", "gitea.example.com", "platform/fleet", id="ssh"),
])
def test_the_repository_is_read_from_any_clone_url(url, host, repository):
    assert repository_of(url) == (host, repository)


@pytest.mark.parametrize("url, kind, reason", [
    pytest.param("https://git.example.com/platform/fleet.git", None, "ForgeUnknown", id="unknown-host-needs-forge"),
    pytest.param("/srv/git/fleet", "gitea", "ForgeUnknown", id="local-path-has-no-forge"),
])
def test_unusable_forge_settings_are_refused_before_any_pass(url, kind, reason, tmp_path):
    with pytest.raises(ForgeError) as refused:
        forge_for(url, kind, None, tmp_path / "token")
    assert refused.value.reason == reason


def test_inferred_forges_and_their_default_apis(tmp_path):
    github = forge_for("https://github.com/o/r.git", None, None, tmp_path / "t")
    gitlab = forge_for("https://gitlab.example.com/g/r.git", None, None, tmp_path / "t")
    assert (github.kind, github.api, gitlab.kind, gitlab.api) == (
        "github", "https://api.github.com", "gitlab", "https://gitlab.example.com/api/v4")



@pytest.fixture(scope="module")
def hostile():
    from tests.remotedouble import HostileRemote
    with HostileRemote() as remote:
        yield remote


HOSTILE_FORGE = [  # (id, base path on the hostile remote, the forge's reason)
    ("garbage", "/garbage", "ForgeAnswerNotAsDocumented"),
    ("login-page", "/html", "ForgeAnswerNotAsDocumented"),
    ("json-not-a-list", "/json", "ForgeAnswerNotAsDocumented"),
    ("slow-body", "/slow-body", "ForgeTimeout"),
    ("too-large", "/big", "ForgeAnswerTooLarge"),
    ("redirect-to-another-host", "/redirect", "ForgeRedirectRefused"),
    ("echoes-headers-401", "/status/401", "ForgeAuthFailed"),
    ("echoes-headers-404", "/status/404", "ForgeRepositoryNotFound"),
    ("echoes-headers-422", "/status/422", "ForgeRequestFailed"),
    ("echoes-headers-429", "/status/429", "ForgeRateLimited"),
    ("echoes-headers-500", "/status/500", "ForgeRequestFailed"),
    ("echoes-headers-503", "/status/503", "ForgeRequestFailed"),
    ("unreachable", None, "ForgeUnreachable"),
]


@pytest.mark.parametrize("kind", ["github", "gitlab", "gitea"])
@pytest.mark.parametrize("case,base,reason", HOSTILE_FORGE, ids=[c[0] for c in HOSTILE_FORGE])
def test_a_hostile_forge_is_a_typed_error_that_never_shows_the_token(kind, case, base, reason, hostile, tmp_path,
                                                                    monkeypatch):
    import traceback

    import gitops.forge
    monkeypatch.setattr(gitops.forge, "TIMEOUT_S", 0.5)
    monkeypatch.setattr(gitops.forge, "MAX_ANSWER_BYTES", 64 << 10)
    (tmp_path / "token").write_text(TOKEN + "\n")
    api = "http://127.0.0.1:1" if base is None else hostile.url + base
    with_userinfo = api.replace("http://", f"http://user:{TOKEN}x@")
    forge = forge_for(f"https://forge.example.com/{REPO}", kind, with_userinfo, tmp_path / "token")
    with pytest.raises(ForgeError) as failed:
        forge.ensure(BRANCH, "main", "title", "body")
    exc = failed.value
    assert exc.reason == reason
    shown = "".join(traceback.format_exception(exc)) + repr(exc) + repr(forge)
    assert TOKEN not in shown
