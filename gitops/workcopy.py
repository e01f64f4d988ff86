"""The controller's own checkout of the GitOps repository.

Owns one disposable working copy per (remote, tracked branch): created with
`git init` + `origin` the first time, fetched afterwards; `sync` fetches and hard
resets to the remote branch (the controller never rebases or merges generated
files: it re-renders them on top of whatever upstream holds). Remotes may be a
local path, `file://`, `git://`, `https://` (token file) or ssh (key file).
The work tree may hold only part of the tree (git's sparse checkout in cone mode,
the folders given when the copy is opened: the controller checks out what a pass
reads, not the tens of thousands of manifests it only writes), and then git's index
is a sparse index: a folder left out is one entry, not one per file, so resetting,
cleaning and checking the work tree cost what it holds, not what the repository
holds (every other cluster's tree). What a commit holds is listed and read from git
(`entries`, `entries_at`, `children`, `read_files`), never from the work tree.
A new work directory opened with `partial` (a cluster's controller of several) is a partial clone
(`--filter=blob:none`): it downloads every commit and tree but only the blobs it reads (the checkout fetches
those of its sparse work tree in one batch, `prefetch` those a pass reads from git), not the tens of thousands
of other clusters' manifests; a remote that refuses filters (a plain git daemon, `uploadpack.allowFilter` off)
sends everything on the first fetch, and the copy goes on as a full one.
New trees are built in the object store alone (`entries`, `write_blobs`,
`write_tree`: `ls-tree`, `fast-import`), so committing tens of
thousands of generated files writes none of them to the work tree. Also the
ancestry check cluster mode uses to tell whether the revision Argo CD synced
contains a decision commit.

The directory is the controller's own (gitops.workdir holds it for the process). Before
each pass (`in_pass`: publish and `sync` run in it) the copy recovers it: what a killed
git process left (stale locks, temporary packs) is removed and logged when no git
process runs there, and then the repository's objects are checked (`git fsck
--connectivity-only`); a directory that cannot be trusted (not a repository any more,
another remote, objects missing, an index or object git cannot read, at opening or
during the pass) is emptied and cloned again, logged; so is a partial clone whose remote will
not send the objects it lacks (PartialCloneRefused: a protocol v0 server), as a whole one. Called by
gitops.writeback and the reconcile loop.
"""
from __future__ import annotations

import logging
import os
import re
import weakref
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from gitops.change import TreeEdit
from gitops.credentials import Credentials, install_askpass, redact
from gitops.errors import (BranchNotFound, GitError, InvalidWriteBack, PartialCloneRefused, RevisionNotFound,
                           WorkdirBusy, WorkdirDamaged, WorkdirInUse)
from gitops.git import DEFAULT_IDENTITY, Git, Identity, PushOutcome, classify, parse_push, running_in
from gitops.paths import Prefixes
from gitops.workdir import MARK, Workdir

log = logging.getLogger("gpushare.gitops")
T = TypeVar("T")
BUSY_GRACE_S = 5.0  # how long a pass waits for another git process in the work directory to end

_SCHEMES = ("https", "http", "ssh", "git", "file")
_TRANSPORT_HELPER = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*::")  # <transport>::<address>
_SHA = re.compile(r"[0-9a-f]{7,64}")
_MISSING_REF = re.compile(r"couldn't find remote ref refs/heads/(\S+)")
BLOB_FILTER = "blob:none"  # a new work directory's partial clone: commits and trees, blobs when read
_FILTER_REFUSED = "filtering not recognized by server"  # git's warning when the remote ignores the filter
TREE_EDIT_REF = "refs/gpushare/tree-edit"  # write_tree's scratch commit (fast-import writes trees through a commit)
MANY_NEW_FILES = 1000  # a push of more new files skips the delta search (WorkingCopy.push)
_BYTES_PER_IMPORTER = 8 << 20  # a share of new content worth its own fast-import process; a usual pass has one


_UNESCAPED = re.compile(rb'[\x20\x21\x23-\x5b\x5d-\x7e]*\Z')  # printable ASCII but '"' and '\\': kept as they are


def _fast_import_path(path: str) -> bytes:
    """`path` as fast-import reads it: C-style quoted, so any byte (a space, a quote, a newline) stays itself."""
    raw = path.encode("utf-8", errors="surrogateescape")
    if _UNESCAPED.match(raw):  # nearly every path: as it is, with no loop over its bytes
        return b'"' + raw + b'"'
    quoted = bytearray(b'"')
    for byte in raw:
        if byte in (0x22, 0x5C):  # '"' and '\\'
            quoted += b"\\" + bytes([byte])
        elif byte < 0x20 or byte >= 0x7F:
            quoted += b"\\%03o" % byte
        else:
            quoted.append(byte)
    return bytes(quoted + b'"')


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


FULL_TREE = ("/*",)  # the (non-cone) sparse-checkout pattern of the whole tree
_GLOB = re.compile(r"[*?\[\]\\!#\n]")  # what a cone-mode folder may not hold: git would read it as a pattern
_KINDS = {"040000": "folder", "100644": "file", "100755": "file", "120000": "symlink", "160000": "submodule"}


def kind_of(mode: str) -> str:
    """What a git tree entry of `mode` is: `folder`, `file` (a regular file), `symlink` or `submodule`."""
    return _KINDS.get(mode, "other")


def cone_patterns(folders: Iterable[str]) -> tuple[str, ...]:
    """git's cone-mode sparse-checkout patterns that check out the files at the top of the tree and every file under
    each of `folders` (repository-relative, `/`-separated), as `git sparse-checkout set --cone` writes them: each
    folder on the way to one is included for its own files only (`/a/` then `!/a/*/`). InvalidWriteBack for a folder
    git would read as a pattern (a glob character, `!`, `#`, a newline) or one that is no relative path."""
    wanted = set()
    for folder in folders:
        parts = folder.strip("/").split("/")
        if not folder.strip("/") or _GLOB.search(folder) or any(part in ("", ".", "..") for part in parts):
            raise InvalidWriteBack(f"the sparse-checkout folder {folder!r} is no plain repository folder",
                                   "name folders by repository-relative paths without glob characters")
        wanted.add("/".join(parts))
    whole = {f for f in wanted if not any(f.startswith(other + "/") for other in wanted)}  # a folder inside another
    parents = {"/".join(f.split("/")[:depth]) for f in whole for depth in range(1, f.count("/") + 1)} - whole
    lines = ["/*", "!/*/"]
    for folder in sorted(parents | whole):
        lines.append(f"/{folder}/")
        if folder in parents:
            lines.append(f"!/{folder}/*/")
    return tuple(lines)


def owned_paths(entries: Mapping[str, tuple[str, str]], prefixes: tuple[str, ...]) -> tuple[str, ...]:
    """The paths of `entries` (as `WorkingCopy.entries` lists them) that lie under `prefixes`, sorted."""
    ours = Prefixes(prefixes)
    return tuple(sorted(path for path in entries if ours.holds(path)))


class WorkingCopy:
    """A checkout of `branch` of `url_or_path` in `workdir`, owned by the controller.

    `cone`: the folders the work tree holds (git's cone-mode sparse checkout with a sparse index: the files at the
    top of the tree and every file under each folder, nothing else); the whole tree when None. Set each time the
    copy is opened (an existing work directory, full or not, takes the new folders at its next `checkout`).
    `partial`: a new work directory is a partial clone (an existing one stays what it is)."""

    def __init__(self, url_or_path: str, branch: str, workdir: Path | str, *,
                 identity: Identity = DEFAULT_IDENTITY, credentials: Credentials | None = None,
                 timeout_s: float = 120.0, cone: Iterable[str] | None = None, partial: bool = False) -> None:
        self.url = remote_url(url_or_path)
        self.branch = check_branch_name(branch)
        self.root = Path(workdir).resolve()
        self.cone = None if cone is None else tuple(cone)
        self.sparse = FULL_TREE if cone is None else cone_patterns(self.cone)
        self._checked_out: str | None = None  # the commit this copy last checked out, its sparse patterns applied
        self._partial_clone = partial
        self._present: set[str] = set()  # blob ids this copy fetched or wrote: in its object store, never fetched again
        self._notes: dict[str, tuple[str, frozenset[str]]] = {}  # name -> (key, ids): what its notes hold
        if credentials is not None:
            credentials.check()
        self._open(identity, credentials, timeout_s)

    def _open(self, identity: Identity, credentials: Credentials | None, timeout_s: float) -> None:
        self._identity, self._credentials, self._timeout_s = identity, credentials, timeout_s
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise WorkdirInUse(f"{self.root} is not a directory", "point the work directory at a directory") from None
        self._workdir = Workdir(self.root)
        weakref.finalize(self, self._workdir.release)
        self.git = Git(self.root, identity=identity, timeout_s=timeout_s)
        if not (self.root / ".git").is_dir():
            if any(self.root.iterdir()):
                raise WorkdirInUse(f"{self.root} is not empty and is not a git checkout",
                                   "point the work directory at an empty or absent directory")
            self._create()
            return
        self._clear_leftovers()
        untrusted = self._untrusted()
        if untrusted is not None:
            if not self._workdir.marked():
                raise WorkdirInUse(f"{self.root} {untrusted}, and it is not marked as a gpushare work directory "
                                   f"(.git/{MARK})", "point the work directory at an empty or absent "
                                   "directory, or delete this one if it is a controller's: the next pass clones")
            self.reclone(untrusted)
            return
        self._configure()

    def _create(self) -> None:
        self._present.clear()
        self._notes.clear()
        Git(self.root, identity=self._identity).run("init", "-q", "-b", self.branch)
        self._configure()
        if self._partial_clone:  # git's promisor remote, fetched with the filter until the remote is seen to refuse it
            self.git.run("config", "remote.origin.promisor", "true")
            self.git.run("config", "remote.origin.partialclonefilter", BLOB_FILTER)
            self.partial = True

    def _configure(self) -> None:
        git_dir = self.root / ".git"
        credentials = self._credentials
        askpass = install_askpass(git_dir) if credentials and credentials.token_file else None
        self.git = Git(self.root, identity=self._identity, credentials=credentials, askpass=askpass,
                       timeout_s=self._timeout_s)
        self.git.run("config", "remote.origin.url", self.url)
        self._set_sparse(git_dir)
        self.partial = self.git.run("config", "--local", "--get", "remote.origin.promisor",
                                    ok_codes=(0, 1)).stdout.strip() == b"true"
        self.object_format = self.git.text("rev-parse", "--show-object-format")
        self._workdir.mark(self.url, self.branch)

    def _untrusted(self) -> str | None:
        """Why the existing directory cannot be trusted, or None."""
        try:  # --local: only the repository's own config, and an error where there is no repository (git looks
            # in the work directory alone: gitops.git sets the ceiling)
            url = self.git.run("config", "--local", "--get", "remote.origin.url",
                               ok_codes=(0, 1)).stdout.decode().strip()
        except GitError as error:
            return f"is no readable git repository ({error.message})"
        if url != self.url:
            return f"tracks {redact(url) or 'no remote'}, not {redact(self.url)}"
        return None

    def reclone(self, why: str) -> None:
        """Empty the work directory and start it again from the remote (the next fetch brings everything)."""
        log.warning("cloning the work directory %s again: it %s", self.root, why)
        self._checked_out = None  # nothing is checked out in the new one
        self._workdir.empty()
        self._create()

    def in_pass(self, action: Callable[[], T]) -> T:
        """Run one pass's `action` on a recovered directory (stale locks removed, objects checked); when git
        finds the repository damaged during it, clone again and run it once more."""
        self.recover()
        try:
            return action()
        except WorkdirDamaged as damaged:
            self.reclone(f"cannot be read by git ({damaged.message})")
            return action()
        except PartialCloneRefused as refused:
            if not self.partial:
                raise
            self._partial_clone = False  # this copy, and each clone it starts again, holds every object
            self.reclone(f"is a partial clone, and the remote will not send the objects it lacks ({refused.message})")
            return action()

    def recover(self) -> None:
        """What a killed git process left is removed (when no git process runs here) and, when there was
        something, the repository's objects are checked; an untrusted directory is cloned again."""
        if self._clear_leftovers():
            try:
                self.git.run("fsck", "--connectivity-only", "--no-dangling", "--no-progress")
            except GitError as error:
                self.reclone(f"failed git's check after a killed git process ({error.message})")
                return
        untrusted = self._untrusted()
        if untrusted is not None:
            self.reclone(untrusted)

    def _clear_leftovers(self) -> bool:
        """Remove the stale locks and temporary packs of killed git processes; whether there were any."""
        if running_in(self.root):
            return False  # this process's own git runs here: its locks are live
        leftovers = self._workdir.leftovers()
        if not leftovers:
            return False
        others = self._workdir.others_after(BUSY_GRACE_S)
        if others:
            pid, command = others[0]
            raise WorkdirBusy(f"a git process that is not this controller's runs in the work directory {self.root} "
                              f"(pid {pid}: {command}) and holds {leftovers[0].relative_to(self.root)}",
                              "let it finish or end it; the work directory is the controller's own: run nothing "
                              "else in it (the next pass retries)")
        self._workdir.remove(leftovers)
        return True

    def _set_sparse(self, git_dir: Path) -> None:
        """Git's sparse checkout of `self.cone`, applied by the next `checkout`: cone mode and a sparse index, so the
        index holds one entry per folder left out (a full index held one per path of the whole repository: resetting
        and cleaning a cluster's work tree cost 0.1 s more at 47,000 paths, ten clusters' trees). The whole tree: the
        one non-cone pattern `/*` and a full index (what `git sparse-checkout disable` leaves)."""
        cone = self.cone is not None
        self.git.run("config", "core.sparseCheckout", "true")
        self.git.run("config", "core.sparseCheckoutCone", "true" if cone else "false")
        self.git.run("config", "index.sparse", "true" if cone else "false")
        (git_dir / "info").mkdir(exist_ok=True)
        (git_dir / "info" / "sparse-checkout").write_text("".join(f"{p}\n" for p in self.sparse))

    def fetch(self, *also: str) -> dict[str, str | None]:
        """Fetch the tracked branch and the branches in `also`: each remote head, None when absent.

        A missing tracked branch raises BranchNotFound; a missing extra branch is None.
        """
        branches = list(dict.fromkeys((self.branch, *also)))
        while True:
            specs = [f"+refs/heads/{b}:refs/remotes/origin/{b}" for b in branches]
            try:
                # no submodule recursion: the controller checks none out, and looking for them reads the sparse
                # index: most of a pass with nothing new at 10,000 models (bench/reconcile_scale.py)
                fetched = self.git.run("fetch", "-q", "--no-tags", "--no-recurse-submodules", "--no-write-fetch-head",
                                       "origin", *specs)
                if self.partial and _FILTER_REFUSED in fetched.stderr:
                    self._unfiltered()
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

    def _unfiltered(self) -> None:
        """The remote refused the blob filter and sent every object: the copy is a full one from now on."""
        log.info("the remote %s does not allow filtered fetches (uploadpack.allowFilter): the work directory %s "
                 "holds every object of the repository", redact(self.url), self.root)
        for key in ("remote.origin.promisor", "remote.origin.partialclonefilter"):
            self.git.run("config", "--unset", key, ok_codes=(0, 5))
        self.partial = False

    def prefetch(self, ids: Iterable[str]) -> None:
        """Bring the blobs `ids` that a partial copy lacks in one fetch (git asks for one object at a time where a
        missing one is read, a round trip each: thousands for a cluster's decision records); a full copy, or one that
        holds them all, fetches nothing (git skips the remote when every object asked for is here). Blobs this copy
        fetched or wrote before are not asked for again: a re-render on the same upstream starts no git process here."""
        wanted = [object_id for object_id in dict.fromkeys(ids) if object_id not in self._present]
        if not self.partial or not wanted:
            return
        self.git.run("fetch", "-q", "--no-tags", "--no-recurse-submodules", "--no-write-fetch-head",
                     f"--filter={BLOB_FILTER}", "--stdin", "origin", config={"fetch.negotiationAlgorithm": "noop"},
                     stdin=("\n".join(wanted) + "\n").encode())
        self._present.update(wanted)

    def remembered(self, name: str, key: str) -> frozenset[str]:
        """The object ids a caller kept in this work directory's note `name` under `key` (gitops.workdir: none
        where it kept none, or under another key); read from the directory once per process."""
        held = self._notes.get(name)
        if held is None or held[0] != key:
            held = self._notes[name] = (key, self._workdir.recall(name, key))
        return held[1]

    def remember(self, name: str, key: str, ids: Iterable[str]) -> None:
        """Keep `ids` in the note `name` under `key` (what a caller judged those objects to be, for its later
        passes and a restarted process); written only when it changed."""
        ids = frozenset(ids)
        if self._notes.get(name) != (key, ids):
            self._workdir.keep(name, key, ids)
            self._notes[name] = (key, ids)

    def checkout(self, commit: str) -> None:
        """Make the work tree exactly `commit`'s files that the sparse patterns name (local changes and untracked
        files are discarded; a file the patterns leave out is removed from the work tree).

        Files are written by one git process per CPU (git's parallel checkout, for 100 files or more):
        checking out tens of thousands of generated files is bound by creating them, and one process
        took 2.6 to 4 times as long on a 2-core machine. A work tree this copy already checked out at `commit`,
        with nothing modified, untracked or ignored since, is left as it is: a render on the same upstream needs no
        reset."""
        if commit == self._checked_out and self._head() == commit and not self.git.run(
                "status", "--porcelain", "--untracked-files=all", "--ignored").stdout:
            return
        self._checked_out = None
        self.git.run("reset", "-q", "--hard", commit, config={"checkout.workers": str(len(os.sched_getaffinity(0)))})
        self.git.run("clean", "-q", "-ffdx")
        self._checked_out = commit

    def _head(self) -> str | None:
        found = self.git.run("rev-parse", "--verify", "--quiet", "HEAD", ok_codes=(0, 1))
        return found.stdout.decode().strip() or None if found.code == 0 else None

    def sync(self, *also: str) -> dict[str, str | None]:
        """A pass's start (`in_pass`): fetch, then check out the remote tracked branch; the remote heads."""
        def fetch_and_check_out() -> dict[str, str | None]:
            heads = self.fetch(*also)
            self.checkout(heads[self.branch])
            return heads

        return self.in_pass(fetch_and_check_out)

    def entries(self, commit: str, prefixes: tuple[str, ...]) -> dict[str, tuple[str, str]]:
        """`commit`'s files, symlinks and submodules under `prefixes` and on their way: path -> (mode, id).

        Each prefix is listed whole (`ls-tree -r`), and each directory on its way as itself (a file or symlink
        there sits where a directory on an owned prefix's way should be), never the rest of the tree: one
        cluster's listing of rendered/<cluster>/ costs that cluster's files, however many others share the
        repository.
        """
        scopes = sorted({prefix.rstrip("/") for prefix in prefixes})
        if not scopes:
            return {}
        entries = self._listed(commit, scopes, recursive=True)
        on_the_way = sorted({"/".join(scope.split("/")[:depth]) for scope in scopes
                             for depth in range(1, scope.count("/") + 1)} - set(scopes))
        entries.update(self.entries_at(commit, on_the_way))
        return entries

    def entries_at(self, commit: str, paths: Iterable[str]) -> dict[str, tuple[str, str]]:
        """The entries of `commit` at exactly `paths` (files, symlinks and submodules; a folder or an absent path is
        left out): path -> (mode, id), one `ls-tree` for any number of paths."""
        wanted = sorted(set(paths))
        if not wanted:
            return {}
        return {path: entry for path, entry in self._listed(commit, wanted, recursive=False).items() if path in wanted}

    def children(self, commit: str, folder: str) -> dict[str, str] | None:
        """What `commit` holds directly in `folder`: name -> `folder`, `file`, `symlink` or `submodule`; None when
        `folder` is no folder of it (absent, a file or a symlink)."""
        listed = self._listed(commit, [folder.rstrip("/") + "/"], recursive=False, trees=True)
        found = {path.rsplit("/", 1)[-1]: kind_of(mode) for path, (mode, _) in listed.items()}
        return found or None

    def _listed(self, commit: str, paths: list[str], *, recursive: bool,
                trees: bool = False) -> dict[str, tuple[str, str]]:
        """`git ls-tree` of `paths` at `commit` (recursively: every file under them), trees left out unless `trees`."""
        out = self.git.run("ls-tree", *(("-r",) if recursive else ()), "-z", commit, "--", *paths).stdout
        entries = {}
        for record in out.decode("utf-8", errors="surrogateescape").split("\0"):
            if record:
                meta, path = record.split("\t", 1)
                mode, kind, object_id = meta.split(" ")
                if trees or kind != "tree":
                    entries[path] = (mode, object_id)
        return entries

    def read_files(self, entries: Mapping[str, tuple[str, str]], paths: Iterable[str], limit: int) -> dict[str, bytes]:
        """The content of each of `paths` that `entries` (`entries()` of a commit) lists as a regular file of at most
        `limit` bytes, read from git's object store whether or not the work tree holds it (`cat-file --batch`, two
        processes for any number of files: sizes first, then the contents within the limit); the others are left
        out, as a reader leaves out a file it cannot read."""
        wanted = {path: entries[path][1] for path in paths
                  if path in entries and kind_of(entries[path][0]) == "file"}
        contents = self.read_blobs(wanted.values(), limit)
        return {path: contents[object_id] for path, object_id in wanted.items() if object_id in contents}

    def read_blobs(self, ids: Iterable[str], limit: int) -> dict[str, bytes]:
        """The content of each blob of `ids` of at most `limit` bytes (the others left out), fetched first where a
        partial copy lacks it."""
        ids = list(dict.fromkeys(ids))
        if not ids:
            return {}
        self.prefetch(ids)
        sizes = self.blob_sizes(ids)
        small = [object_id for object_id in ids if sizes.get(object_id, limit + 1) <= limit]
        contents: dict[str, bytes] = {}
        if small:
            out = self.git.run("cat-file", "--batch", stdin=("\n".join(small) + "\n").encode()).stdout
            at = 0
            for object_id in small:
                header_end = out.index(b"\n", at)
                size = int(out[at:header_end].split(b" ")[2])
                contents[object_id] = out[header_end + 1:header_end + 1 + size]
                at = header_end + 1 + size + 1
        return contents

    def blob_sizes(self, ids: Iterable[str]) -> dict[str, int]:
        """The size of each blob of `ids` this copy holds (`cat-file --batch-check`), the others left out."""
        ids = list(dict.fromkeys(ids))
        if not ids:
            return {}
        sizes = {}
        checked = self.git.run("cat-file", "--batch-check", stdin=("\n".join(ids) + "\n").encode()).stdout
        for line in checked.decode("ascii", errors="replace").splitlines():
            fields = line.split(" ")
            if len(fields) == 3 and fields[1] == "blob" and fields[2].isdigit():
                sizes[fields[0]] = int(fields[2])
        return sizes

    def write_blobs(self, blobs: Mapping[str, bytes]) -> None:
        """Store `blobs` with `git fast-import`: one pack per process, no loose object per file.

        zlib level 1 and no delta search (a first pass writes tens of MB, where
        git's defaults cost seconds); a large batch is split over one fast-import
        per CPU, a small one (the usual pass) takes one process.
        """
        contents = list(blobs.values())
        size = sum(map(len, contents))
        workers = max(1, min(len(os.sched_getaffinity(0)), size // _BYTES_PER_IMPORTER, len(contents)))

        def fast_import(share: list[bytes]) -> None:
            stream = b"".join(b"blob\ndata %d\n%s\n" % (len(data), data) for data in share)
            self.git.run("fast-import", "--quiet", "--done", "--depth=0", config={"core.compression": "1"},
                         stdin=stream + b"done\n")

        shares: list[list[bytes]] = [[] for _ in range(workers)]
        sizes = [0] * workers
        for data in sorted(contents, key=len, reverse=True):  # the largest first, each to the lightest share
            lightest = sizes.index(min(sizes))
            shares[lightest].append(data)
            sizes[lightest] += len(data)
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(fast_import, shares))
        self._present.update(blobs)

    def write_tree(self, commit: str, edit: TreeEdit) -> str:
        """The id of `commit`'s tree with `edit` applied, built in git's object store alone.

        The new blobs go in first (`write_blobs`) and are checked to be there (`cat-file
        --batch-check`); then one `git fast-import` commits the edit on top of `commit` to a
        scratch ref (TREE_EDIT_REF) and the tree is that commit's. fast-import reads and writes
        only the trees on the edited paths: the cost follows the edit, not the repository (a
        scratch index of the whole tree cost 0.1 s at 47,000 paths, ten clusters' trees), and
        no other entry's blob is read (in a partial copy they are the remote's). The work tree
        and its index are not touched: they stay at the checked-out commit until the next
        `checkout`.
        """
        if edit.empty:
            return self.tree_of(commit)
        if edit.blobs:
            self.write_blobs(edit.blobs)
        self._check_present({blob for _, blob in edit.add.values()})
        lines = [b"commit " + TREE_EDIT_REF.encode(), b"committer gpushare <gpushare@localhost> 0 +0000", b"data 0",
                 b"from " + commit.encode()]
        lines += [b"D " + _fast_import_path(path) for path in edit.remove]
        lines += [f"M {mode} {blob} ".encode() + _fast_import_path(path) for path, (mode, blob) in edit.add.items()]
        self.git.run("fast-import", "--quiet", "--force", "--done", config={"core.compression": "1"},
                     stdin=b"\n".join(lines) + b"\n\ndone\n")
        return self.tree_of(TREE_EDIT_REF)

    def _check_present(self, ids: set[str]) -> None:
        """Each of `ids` is a blob in the object store, else InvalidWriteBack."""
        if not ids:
            return
        listed = self.git.run("cat-file", "--batch-check", stdin=("\n".join(sorted(ids)) + "\n").encode()).stdout
        missing = [line.split(" ")[0] for line in listed.decode("ascii", errors="replace").splitlines()
                   if line.split(" ")[1:2] != ["blob"]]
        if missing:
            raise InvalidWriteBack(f"the new tree names {len(missing)} blob(s) that are not in the object store "
                                   f"(first: {missing[0]})", "this is a bug of the controller: report it with the log")

    def changed_between(self, old: str, new: str, pathspecs: tuple[str, ...]) -> bool:
        """Whether any path `pathspecs` name differs between commits `old` and `new` (git's tree diff, which skips
        equal subtrees by their ids: milliseconds however large the tree). The pathspecs are the caller's own, with
        their magic (`:(exclude)`): this one call reads them so, where every other git call takes paths literally."""
        return self.git.run("diff-tree", "--quiet", "-r", "--no-renames", old, new, "--", *pathspecs,
                            ok_codes=(0, 1), env={"GIT_LITERAL_PATHSPECS": "0"}).code == 1

    def tree_of(self, commit: str) -> str:
        return self.git.text("rev-parse", f"{commit}^{{tree}}")

    def is_ancestor(self, ancestor: str, descendant: str) -> bool:
        return self.git.run("merge-base", "--is-ancestor", ancestor, descendant, ok_codes=(0, 1)).code == 0

    def commit_tree(self, tree: str, parents: list[str], message: str) -> str:
        args = ["commit-tree", tree]
        for parent in parents:
            args += ["-p", parent]
        return self.git.run(*args, "-F", "-", stdin=message.encode("utf-8")).stdout.decode().strip()

    def push(self, commit: str, branch: str, new_files: int = 0) -> PushOutcome:
        """Push `commit` to `branch` as a fast-forward (never forced). A commit of more than MANY_NEW_FILES new files
        (a first render: tens of thousands of small manifests) is sent without git's delta search, which costs
        seconds of the controller's CPU for them; the pack is then larger (no deltas between its files)."""
        ref = f"refs/heads/{branch}"
        config = {"pack.window": "0"} if new_files > MANY_NEW_FILES else None
        result = self.git.run("push", "--porcelain", "origin", f"{commit}:{ref}", ok_codes=(0, 1), config=config)
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
