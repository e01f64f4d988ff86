"""Pull requests: open or update the one pull (merge) request of the review branch on GitHub, GitLab or Gitea.

Owns the forges' HTTP APIs for `--write-back pr:BRANCH`: find the open request from the review
branch into the tracked branch, update its title and body when it exists, create it when not, so a
branch never has two. The token is read from a file (the mounted Secret), sent only in the
Authorization (or PRIVATE-TOKEN) header, and never logged or put into an error. Requests:

| forge | find | create | update |
|---|---|---|---|
| GitHub | `GET /repos/O/R/pulls?head=O:BRANCH&base=BASE&state=open` | `POST /repos/O/R/pulls` | `PATCH /repos/O/R/pulls/N` |
| GitLab | `GET /projects/O%2FR/merge_requests?source_branch=BRANCH&target_branch=BASE&state=opened` | `POST /projects/O%2FR/merge_requests` | `PUT /projects/O%2FR/merge_requests/IID` |
| Gitea | `GET /repos/O/R/pulls?state=open&limit=50&page=P` (filtered by head and base) | `POST /repos/O/R/pulls` | `PATCH /repos/O/R/pulls/N` |

Called by the reconcile shell after gitops.publish pushed the review branch, and by the right-sizing
loop after it pushed a Recommend proposal's branch (`update_open` for a proposal it carries: a request the
reviewer closed is not reopened).
"""
from __future__ import annotations

import json
import logging
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gitops.errors import GitError

log = logging.getLogger("gpushare.forge")
Kind = Literal["github", "gitlab", "gitea"]
KINDS: tuple[Kind, ...] = ("github", "gitlab", "gitea")
TIMEOUT_S = 30.0
GITEA_PAGE = 50
GITEA_MAX_PAGES = 20


class ForgeError(GitError):
    """The forge refused or failed a pull request call; `reason` is PascalCase, the message never holds the token."""

    def __init__(self, reason: str, message: str, fix: str) -> None:
        super().__init__(message, fix)
        self.reason = reason


@dataclass(frozen=True)
class PullRequest:
    number: int
    url: str
    created: bool  # False: an open one was updated


@dataclass(frozen=True)
class Forge:
    """One repository on one forge: its kind, API base URL (e.g. https://api.github.com), path `owner/name`."""

    kind: Kind
    api: str
    repository: str
    token_file: Path

    def ensure(self, head: str, base: str, title: str, body: str) -> PullRequest:
        """The open request from `head` into `base`, updated to `title` and `body`, or a new one."""
        found = self._find(head, base)
        if found is not None:
            number, url = found
            self._call(*self._update(number, title, body))
            log.info("updated %s request %s (%s into %s)", self.kind, number, head, base)
            return PullRequest(number, url, created=False)
        answer = self._call(*self._create(head, base, title, body))
        number, url = self._identify(answer)
        log.info("opened %s request %s (%s into %s)", self.kind, number, head, base)
        return PullRequest(number, url, created=True)

    def update_open(self, head: str, base: str, title: str, body: str) -> PullRequest | None:
        """The open request from `head` into `base` updated to `title` and `body`; None (nothing opened) when
        there is none: a request someone closed stays closed."""
        found = self._find(head, base)
        if found is None:
            return None
        number, url = found
        self._call(*self._update(number, title, body))
        log.info("updated %s request %s (%s into %s)", self.kind, number, head, base)
        return PullRequest(number, url, created=False)

    # ------------------------------------------------------------ per forge

    def _owner_name(self) -> tuple[str, str]:
        owner, _, name = self.repository.rpartition("/")
        return owner, name

    def _project(self) -> str:
        return urllib.parse.quote(self.repository, safe="")

    def _find(self, head: str, base: str) -> tuple[int, str] | None:
        if self.kind == "github":
            owner, name = self._owner_name()
            query = urllib.parse.urlencode({"head": f"{owner}:{head}", "base": base, "state": "open"})
            found = self._call("GET", f"/repos/{self.repository}/pulls?{query}")
            return self._identify(found[0]) if found else None
        if self.kind == "gitlab":
            query = urllib.parse.urlencode({"source_branch": head, "target_branch": base, "state": "opened"})
            found = self._call("GET", f"/projects/{self._project()}/merge_requests?{query}")
            return self._identify(found[0]) if found else None
        for page in range(1, GITEA_MAX_PAGES + 1):
            query = urllib.parse.urlencode({"state": "open", "limit": GITEA_PAGE, "page": page})
            found = self._call("GET", f"/repos/{self.repository}/pulls?{query}")
            for pull in found:
                if (pull.get("head") or {}).get("ref") == head and (pull.get("base") or {}).get("ref") == base:
                    return self._identify(pull)
            if len(found) < GITEA_PAGE:
                return None
        return None

    def _create(self, head: str, base: str, title: str, body: str) -> tuple[str, str, dict]:
        if self.kind == "gitlab":
            return "POST", f"/projects/{self._project()}/merge_requests", {
                "source_branch": head, "target_branch": base, "title": title, "description": body}
        return "POST", f"/repos/{self.repository}/pulls", {"title": title, "head": head, "base": base, "body": body}

    def _update(self, number: int, title: str, body: str) -> tuple[str, str, dict]:
        if self.kind == "gitlab":
            return "PUT", f"/projects/{self._project()}/merge_requests/{number}", {"title": title,
                                                                                   "description": body}
        return "PATCH", f"/repos/{self.repository}/pulls/{number}", {"title": title, "body": body}

    def _identify(self, pull: dict) -> tuple[int, str]:
        number = pull["iid"] if self.kind == "gitlab" else pull["number"]
        return int(number), str(pull.get("web_url") or pull.get("html_url") or pull.get("url") or "")

    def _headers(self) -> dict[str, str]:
        token = self.token_file.read_text(encoding="utf-8").strip()
        if self.kind == "github":
            return {"Authorization": f"Bearer {token}", "Accept": "application/vnd.github+json",
                    "X-GitHub-Api-Version": "2022-11-28"}
        if self.kind == "gitlab":
            return {"PRIVATE-TOKEN": token}
        return {"Authorization": f"token {token}"}

    def _call(self, method: str, path: str, body: dict | None = None):
        data = None if body is None else json.dumps(body).encode()
        try:
            headers = {**self._headers(), "Content-Type": "application/json", "User-Agent": "gpushare"}
        except OSError as exc:
            raise ForgeError("ForgeTokenUnreadable", f"cannot read the forge token file {self.token_file}: "
                             f"{exc.strerror}", "mount the git credentials Secret with a `token` key") from None
        request = urllib.request.Request(self.api.rstrip("/") + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:
                text = answer.read()
        except urllib.error.HTTPError as exc:
            raise _refusal(self, method, path, exc.code, exc.read()[:300].decode(errors="replace")) from None
        except (urllib.error.URLError, OSError) as exc:
            raise ForgeError("ForgeUnreachable", f"{self.kind} API {self.api} did not answer {method} {path}: "
                             f"{getattr(exc, 'reason', exc)}", "check --forge-api-url and the controller's "
                             "egress to the forge") from None
        return json.loads(text) if text.strip() else {}


def _refusal(forge: Forge, method: str, path: str, status: int, detail: str) -> ForgeError:
    what = f"{forge.kind} answered {status} to {method} {path.split('?')[0]}: {detail.strip()}"
    if status in (401, 403):
        return ForgeError("ForgeAuthFailed", what, "give the token in the git credentials Secret the scope to "
                          "open pull requests (GitHub: pull_requests write; GitLab: api; Gitea: write:repository)")
    if status == 404:
        return ForgeError("ForgeRepositoryNotFound", what, "check the repository URL and --forge-api-url, and "
                          "that the token can see the repository")
    if status == 422 and "No commits between" in detail:
        return ForgeError("NothingToReview", what, "nothing differs from the tracked branch; the next change "
                          "opens the request")
    return ForgeError("ForgeRequestFailed", what, "see the forge's message; the next pass tries again")


def repository_of(repo_url: str) -> tuple[str, str]:
    """(host, OWNER/NAME) of a clone URL: https://, ssh://, git:// or scp-like git@host:owner/name.git."""
    parsed = urllib.parse.urlparse(repo_url)
    if parsed.scheme and parsed.hostname:
        host, path = parsed.hostname, parsed.path
    elif ":" in repo_url and "@" in repo_url.split(":", 1)[0]:  # git@github.com:org/repo.git
        host, path = repo_url.split(":", 1)[0].rsplit("@", 1)[1], repo_url.split(":", 1)[1]
    else:
        raise ForgeError("ForgeUnknown", f"{repo_url!r} is a local path, so no forge serves it",
                         "use the repository's URL on GitHub, GitLab or Gitea with --write-back pr:BRANCH, or "
                         "--write-back branch:BRANCH for a review branch without a pull request")
    return host, path.strip("/").removesuffix(".git")


def forge_for(repo_url: str, kind: str | None, api: str | None, token_file: Path | None) -> Forge:
    """The forge of `repo_url`; kind and API URL inferred for github.com and hosts named gitlab.*, else given
    with --forge and --forge-api-url."""
    host, repository = repository_of(repo_url)
    kind = kind or ("github" if host == "github.com" else "gitlab" if host.startswith("gitlab.") else None)
    if kind not in KINDS:
        raise ForgeError("ForgeUnknown", f"cannot tell which forge serves {host}", "pass --forge github, gitlab "
                         "or gitea (and --forge-api-url for a self-hosted API)")
    default_api = {"github": "https://api.github.com" if host == "github.com" else f"https://{host}/api/v3",
                   "gitlab": f"https://{host}/api/v4", "gitea": f"https://{host}/api/v1"}[kind]
    if token_file is None:
        raise ForgeError("ForgeTokenMissing", "--write-back pr: needs a token to open pull requests",
                         "pass --git-token-file (the mounted git credentials Secret's `token`)")
    return Forge(kind, api or default_api, repository, token_file)
