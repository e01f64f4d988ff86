"""Pull requests: open or update the one pull (merge) request of the review branch on GitHub, GitLab or Gitea.

Owns the forges' HTTP APIs for `--write-back pr:BRANCH`: find the open request from the review
branch into the tracked branch, update its title and body when it exists, create it when not, so a
branch never has two. Every call goes through gitops.outbound (total deadline, size limit, no
credentialed redirect to another host); the token is read from a file (the mounted Secret) into a
`Secret`, sent only in the Authorization (or PRIVATE-TOKEN) header, and never logged or put into an
error; userinfo in `--forge-api-url` is dropped (the token authenticates). An answer that is not the
API's documented JSON is a ForgeAnswerNotAsDocumented error. Requests:

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
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gitops.errors import GitError
from gitops.outbound import OutboundError, Secret, address, answer_json, request

log = logging.getLogger("gpushare.forge")
Kind = Literal["github", "gitlab", "gitea"]
KINDS: tuple[Kind, ...] = ("github", "gitlab", "gitea")
TIMEOUT_S = 30.0  # the whole call: connect, headers and body
MAX_ANSWER_BYTES = 8 << 20
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
            found = self._list("GET", f"/repos/{self.repository}/pulls?{query}")
            return self._identify(found[0]) if found else None
        if self.kind == "gitlab":
            query = urllib.parse.urlencode({"source_branch": head, "target_branch": base, "state": "opened"})
            found = self._list("GET", f"/projects/{self._project()}/merge_requests?{query}")
            return self._identify(found[0]) if found else None
        for page in range(1, GITEA_MAX_PAGES + 1):
            query = urllib.parse.urlencode({"state": "open", "limit": GITEA_PAGE, "page": page})
            found = self._list("GET", f"/repos/{self.repository}/pulls?{query}")
            for pull in found:
                if _ref(pull, "head") == head and _ref(pull, "base") == base:
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

    def _identify(self, pull) -> tuple[int, str]:
        number = pull.get("iid" if self.kind == "gitlab" else "number") if isinstance(pull, dict) else None
        if isinstance(number, bool) or not isinstance(number, int) or number <= 0:
            raise self._undocumented(f"a pull request without a positive `{'iid' if self.kind == 'gitlab' else 'number'}`")
        url = pull.get("web_url") or pull.get("html_url") or pull.get("url") or ""
        return number, url if isinstance(url, str) else ""

    def _headers(self) -> dict[str, str | Secret]:
        try:
            token = self.token_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ForgeError("ForgeTokenUnreadable", f"cannot read the forge token file {self.token_file}: "
                             f"{getattr(exc, 'strerror', None) or 'not UTF-8 text'}",
                             "mount the git credentials Secret with a `token` key") from None
        if self.kind == "github":
            return {"Authorization": Secret(f"Bearer {token}"), "Accept": "application/vnd.github+json",
                    "X-GitHub-Api-Version": "2022-11-28"}
        if self.kind == "gitlab":
            return {"PRIVATE-TOKEN": Secret(token)}
        return {"Authorization": Secret(f"token {token}")}

    def _list(self, method: str, path: str) -> list:
        found = self._call(method, path)
        if not isinstance(found, list):
            raise self._undocumented(f"{type(found).__name__} where the API documents a list of pull requests")
        return found

    def _undocumented(self, found: str) -> ForgeError:
        return ForgeError("ForgeAnswerNotAsDocumented", f"the {self.kind} API at {self.api} sent {found}",
                          "check --forge and --forge-api-url: they must name this forge's API")

    def _call(self, method: str, path: str, body: dict | None = None):
        data = None if body is None else json.dumps(body).encode()
        headers = {**self._headers(), "Content-Type": "application/json"}
        what = f"the {self.kind} API"
        try:
            answer = request(method, self.api.rstrip("/") + path, what=what, headers=headers, body=data,
                             deadline_s=TIMEOUT_S, max_bytes=MAX_ANSWER_BYTES)
            return answer_json(answer, what) if answer.body.strip() else {}
        except OutboundError as exc:
            raise _refusal(exc) from None


_REASONS = {"RemoteUnreachable": "ForgeUnreachable", "RemoteTimeout": "ForgeTimeout",
            "AnswerTooLarge": "ForgeAnswerTooLarge", "AnswerNotAsDocumented": "ForgeAnswerNotAsDocumented",
            "RedirectRefused": "ForgeRedirectRefused", "RemoteRedirectLoop": "ForgeRedirectRefused",
            "InvalidRemoteUrl": "InvalidForgeApiUrl", "RemoteRateLimited": "ForgeRateLimited"}


def _refusal(exc: OutboundError) -> ForgeError:
    """The forge's own reason for a failed call: the status classes it documents, the outbound classes renamed."""
    status, what, detail = exc.status, exc.message, exc.detail
    if status is None or status == 429 or status >= 500:
        reason = _REASONS.get(exc.reason, "ForgeRequestFailed")
        fix = "check --forge-api-url and the controller's egress to the forge" if reason in (
            "ForgeUnreachable", "InvalidForgeApiUrl", "ForgeRedirectRefused") else exc.fix
        return ForgeError(reason, what, fix)
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
    try:
        clean = address(api or default_api, "--forge-api-url").url  # userinfo dropped: the token authenticates
    except OutboundError as exc:
        raise ForgeError("InvalidForgeApiUrl", exc.message, exc.fix) from None
    return Forge(kind, clean, repository, token_file)


def _ref(pull, side: str):
    """A Gitea pull's head or base branch name, or None when the answer has no such field."""
    found = pull.get(side) if isinstance(pull, dict) else None
    return found.get("ref") if isinstance(found, dict) else None
