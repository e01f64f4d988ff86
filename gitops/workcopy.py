"""The controller's own checkout of the GitOps repository.

Owns one disposable working copy per (remote, tracked branch): created with
`git init` + `origin` the first time, fetched afterwards; `sync` fetches and hard
resets to the remote branch (the controller never rebases or merges generated
files: it re-renders them on top of whatever upstream holds). Remotes may be a
local path, `file://`, `git://`, `https://` (token file) or ssh (key file).
Also the ancestry check cluster mode uses to tell whether the revision Argo CD
synced contains a decision commit. Called by gitops.writeback and the reconcile
loop.
"""
from __future__ import annotations

import re
from pathlib import Path

from gitops.credentials import Credentials, install_askpass, redact
from gitops.errors import BranchNotFound, InvalidWriteBack, RevisionNotFound, WorkdirInUse
from gitops.git import DEFAULT_IDENTITY, Git, Identity, PushOutcome, classify, parse_push

_SCHEMES = ("https", "http", "ssh", "git", "file")
_TRANSPORT_HELPER = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*::")  # <transport>::<address>
_SHA = re.compile(r"[0-9a-f]{7,64}")
_MISSING_REF = re.compile(r"couldn't find remote ref refs/heads/(\S+)")


def check_branch_name(name: str) -> str:
    """`name` if it is a plain branch name git accepts (conservative subset of check-ref-format)."""
    ok = (re.fullmatch(r"[A-Za-z0-9._/-]+", name or "") is not None
          and not name.startswith(("-", "/", "."))
          and not name.endswith(("/", ".", ".lock"))
          and ".." not in name and "//" not in name and "/." not in name and ".lock/" not in name)
    if not ok:
        raise InvalidWriteBack(f"{name!r} is not a usable branch name",
                               "use letters, digits, '.', '_', '-' and '/' separated segments, e.g. gpushare/plan")
    return name


def remote_url(url_or_path: str) -> str:
    """The remote as git should see it; local paths become absolute.

    Refused: credentials in the URL, and transports other than https, http,
    ssh, git, file and local paths (e.g. `ext::`, which runs a command).
    """
    if _TRANSPORT_HELPER.match(url_or_path) or (
            "://" in url_or_path and url_or_path.split("://", 1)[0].lower() not in _SCHEMES):
        raise InvalidWriteBack(f"the repository URL {redact(url_or_path)} uses an unsupported transport",
                               "use an https://, ssh://, git@host:path, git:// or file:// URL, or a local path")
    if "://" in url_or_path:
        scheme, rest = url_or_path.split("://", 1)
        userinfo = rest.split("/", 1)[0].rpartition("@")[0]
        if userinfo and (scheme.lower() in ("http", "https") or ":" in userinfo):
            raise InvalidWriteBack(f"the repository URL {redact(url_or_path)} carries credentials",
                                   "remove them from the URL and pass the token file (credentials) instead")
        return url_or_path
    if ":" in url_or_path.split("/", 1)[0]:
        return url_or_path  # scp-like ssh: [user@]host:path
    return str(Path(url_or_path).resolve())


class WorkingCopy:
    """A checkout of `branch` of `url_or_path` in `workdir`, owned by the controller."""

    def __init__(self, url_or_path: str, branch: str, workdir: Path | str, *,
                 identity: Identity = DEFAULT_IDENTITY, credentials: Credentials | None = None,
                 timeout_s: float = 120.0) -> None:
        self.url = remote_url(url_or_path)
        self.branch = check_branch_name(branch)
        self.root = Path(workdir).resolve()
        if credentials is not None:
            credentials.check()
        self._open(identity, credentials, timeout_s)

    def _open(self, identity: Identity, credentials: Credentials | None, timeout_s: float) -> None:
        git_dir = self.root / ".git"
        if not git_dir.is_dir():
            if self.root.exists() and any(self.root.iterdir()):
                raise WorkdirInUse(f"{self.root} is not empty and is not a git checkout",
                                   "point the work directory at an empty or absent directory")
            self.root.mkdir(parents=True, exist_ok=True)
            Git(self.root, identity=identity).run("init", "-q", "-b", self.branch)
        askpass = install_askpass(git_dir) if credentials and credentials.token_file else None
        self.git = Git(self.root, identity=identity, credentials=credentials, askpass=askpass,
                       timeout_s=timeout_s)
        self.git.run("config", "remote.origin.url", self.url)
        self.object_format = self.git.text("rev-parse", "--show-object-format")

    def fetch(self, *also: str) -> dict[str, str | None]:
        """Fetch the tracked branch and the branches in `also`: each remote head, None when absent.

        A missing tracked branch raises BranchNotFound; a missing extra branch is None.
        """
        branches = list(dict.fromkeys((self.branch, *also)))
        while True:
            specs = [f"+refs/heads/{b}:refs/remotes/origin/{b}" for b in branches]
            try:
                self.git.run("fetch", "-q", "--no-tags", "--no-write-fetch-head", "origin", *specs)
                break
            except BranchNotFound as error:
                missing = _MISSING_REF.search(error.message)
                if missing is None or missing.group(1) == self.branch or missing.group(1) not in branches:
                    raise
                branches.remove(missing.group(1))
                self.git.run("update-ref", "-d", f"refs/remotes/origin/{missing.group(1)}")
        ids = self.git.text("rev-parse", *(f"refs/remotes/origin/{b}" for b in branches)).split()
        heads = dict(zip(branches, ids, strict=True))
        return {b: heads.get(b) for b in (self.branch, *also)}

    def checkout(self, commit: str) -> None:
        """Make the work tree exactly `commit` (local changes and untracked files are discarded)."""
        self.git.run("reset", "-q", "--hard", commit)
        self.git.run("clean", "-q", "-ffdx")

    def sync(self, *also: str) -> dict[str, str | None]:
        """fetch, then check out the remote tracked branch; the remote heads."""
        heads = self.fetch(*also)
        self.checkout(heads[self.branch])
        return heads

    def index(self, prefixes: tuple[str, ...]) -> dict[str, tuple[str, str]]:
        """Index entries under `prefixes`: path -> (mode, blob id). Right after `checkout`, also the files on disk."""
        out = self.git.run("ls-files", "--stage", "-z", "--", *prefixes).stdout
        entries = {}
        for record in out.decode("utf-8", errors="surrogateescape").split("\0"):
            if record:
                meta, path = record.split("\t", 1)
                mode, blob, _stage = meta.split(" ")
                entries[path] = (mode, blob)
        return entries

    def stage(self, paths: list[str]) -> str:
        """Stage exactly `paths` (written or deleted; ignore rules do not apply); the tree id.

        core.bigFileThreshold=1 streams the new blobs into one pack instead of
        creating a loose object file for each, which dominates a large first pass.
        """
        if paths:
            self.git.run("update-index", "--add", "--remove", "--replace", "-z", "--stdin",
                         config={"core.bigFileThreshold": "1"},
                         stdin="\0".join(paths).encode("utf-8", errors="surrogateescape") + b"\0")
        return self.git.text("write-tree")

    def tree_of(self, commit: str) -> str:
        return self.git.text("rev-parse", f"{commit}^{{tree}}")

    def is_ancestor(self, ancestor: str, descendant: str) -> bool:
        return self.git.run("merge-base", "--is-ancestor", ancestor, descendant, ok_codes=(0, 1)).code == 0

    def commit_tree(self, tree: str, parents: list[str], message: str) -> str:
        args = ["commit-tree", tree]
        for parent in parents:
            args += ["-p", parent]
        return self.git.run(*args, "-F", "-", stdin=message.encode("utf-8")).stdout.decode().strip()

    def push(self, commit: str, branch: str) -> PushOutcome:
        """Push `commit` to `branch` as a fast-forward (never forced)."""
        ref = f"refs/heads/{branch}"
        result = self.git.run("push", "--porcelain", "origin", f"{commit}:{ref}", ok_codes=(0, 1))
        outcome = parse_push(result.stdout.decode("utf-8", errors="replace"), ref)
        if outcome is None:
            raise classify("push", result.stderr)
        return outcome

    def _has_commit(self, revision: str) -> bool:
        return self.git.run("rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}",
                            ok_codes=(0, 1)).code == 0

    def head_contains(self, commit: str, revision: str) -> bool:
        """Is `commit` an ancestor of (or equal to) `revision`? Fetches once if either is unknown here."""
        for value in (commit, revision):
            if not _SHA.fullmatch(value or ""):
                raise RevisionNotFound(f"{value!r} is not a commit id", "pass a hexadecimal commit id")
        if not (self._has_commit(commit) and self._has_commit(revision)):
            self.fetch()
            unknown = [v for v in (commit, revision) if not self._has_commit(v)]
            if unknown:
                raise RevisionNotFound(f"commit {unknown[0]} is not on {self.branch} of {redact(self.url)}",
                                       "check that Argo CD tracks the same repository and branch")
        return self.is_ancestor(commit, revision)
