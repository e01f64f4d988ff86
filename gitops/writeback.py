"""Commit the generated tree back to git: render on top of upstream, commit if changed, push.

Owns `publish`, the one write path from the controller into git. Each attempt:
fetch and hard-reset to the tracked branch's remote head; call the pure
`render(Checkout) -> Change` on that tree (its root, and every owned path the
commit holds as git lists it: a sparse work tree holds some folders only); plan the edit that makes the owned
paths exactly the Change (gitops.change: add what differs from upstream's
`ls-tree` by blob id, remove owned files that are neither generated nor kept);
build the new tree in git's object store (new blobs and the tree edit through
`fast-import`), never writing generated files to the work tree,
which stays at upstream until the next pass's reset; if the tree equals the
previous one, stop with "no change"; else create one commit and push it as a
fast-forward. A push rejected because upstream moved (non-fast-forward, fetch
first, lost ref lock) is retried from the fetch with a short jittered backoff,
up to `max_attempts`: the Change is re-rendered on top of the new upstream,
never rebased, never forced. Any other failure raises a typed gitops error.
Given the previous pass's result (and no change to the render's inputs outside
git), a pass whose fetch finds no branch moved stops there: nothing new costs
one fetch. A Change that names what its render read (`Change.reads`: several
controllers, each owning its own paths of one branch) is landed again without
rendering on an upstream whose new commits touch none of those paths, after a
lost race and in the next pass alike: another cluster's commit costs a fetch, a
tree diff and a push, never a render.

Write-back targets:

- `direct`: the commit's parent is the tracked branch's head; it is pushed to the
  tracked branch.
- `branch:NAME`: a review branch for a pull request. Its tree is always "tracked
  branch head + generated tree", so the PR shows exactly the generated changes
  against the tracked branch. The commit's parents are the review branch's head
  (so the push is a fast-forward: no force, history kept) and, when the tracked
  branch has moved past it, the tracked head too (a merge commit that records
  the new base, so the PR merges without conflict). No change → no commit. The
  review branch belongs to the controller: edits pushed to it by hand are
  replaced by the next pass (they stay in its history). Files kept by `keep`
  keep the tracked branch's content.

Only paths under the owned prefixes are ever written or deleted (user files such
as `models/` and `gpus.yaml` are never touched); a generated path that is
absolute, has `..`, `.` or `.git` segments, passes through a symlink committed
upstream, would replace a kept or user file, or is not owned is refused before
any object is written. Called by the reconcile loop.
"""
from __future__ import annotations

import itertools
import logging
import random
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gitops.change import Change, check_change, plan_edit
from gitops.errors import InvalidWriteBack, PushRejected, PushRetriesExhausted
from gitops.paths import normalize_owned
from gitops.workcopy import WorkingCopy, check_branch_name, kind_of, owned_paths

log = logging.getLogger("gpushare.gitops")
NO_CHANGE = "no change"
LINK_HOPS = 40  # the symlinks Checkout.read follows on one path at most (Linux's path walk gives up after 40)
LINK_BYTES = 4096  # the longest symlink target it reads (PATH_MAX)


@dataclass(frozen=True)
class Target:
    """Where commits go: the tracked branch (`review is None`) or a review branch; with `pull_request`, the
    shell also opens or updates the branch's one pull request (gitops.forge)."""

    review: str | None = None
    pull_request: bool = False

    def __str__(self) -> str:
        return "direct" if self.review is None else f"{'pr' if self.pull_request else 'branch'}:{self.review}"


@dataclass(frozen=True)
class PublishResult:
    """`commit` is the pushed commit, or None when nothing changed.

    `attempts` counts attempts to land the change (0: skipped, nothing moved
    since `previous`). `heads` are the remote heads of the tracked and review
    branch once the generated tree is in place: pass this result as the next
    pass's `previous`. `change` and `rendered_on`: the last Change and a commit
    of the tracked branch whose content under its reads renders it.
    """

    commit: str | None
    attempts: int
    message: str
    branch: str
    upstream: str
    heads: Mapping[str, str | None]
    change: Change | None = field(default=None, compare=False, repr=False)
    rendered_on: str | None = field(default=None, compare=False)

    @property
    def changed(self) -> bool:
        return self.commit is not None


@dataclass(frozen=True)
class Checkout:
    """What a render is given: the work tree's `root` (the folders the copy's sparse checkout holds), the checked-out
    `commit`, and every file, symlink and submodule under the owned prefixes in it, from `git ls-tree` (`generated`,
    sorted): list the controller's files from it, never from the work tree. `read`, `kinds` and `children` answer
    from git's object store for any path of the commit, whether or not the work tree holds it (a sparse work tree
    holds some folders only)."""

    root: Path
    generated: tuple[str, ...]
    commit: str
    copy: WorkingCopy = field(repr=False, compare=False)
    entries: Mapping[str, tuple[str, str]] = field(repr=False, compare=False)  # listed under the owned prefixes
    _elsewhere: dict[str, tuple[str, str] | None] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def of(cls, copy: WorkingCopy, commit: str, entries: Mapping[str, tuple[str, str]],
           owned: tuple[str, ...]) -> Checkout:
        """The checkout of `copy` at `commit`, whose owned paths `entries` lists (WorkingCopy.entries over `owned`)."""
        return cls(copy.root, owned_paths(entries, owned), commit, copy, entries)

    @classmethod
    def at(cls, copy: WorkingCopy, commit: str, owned: tuple[str, ...]) -> Checkout:
        """The checkout of `copy` at `commit`, its paths under `owned` listed from git."""
        return cls.of(copy, commit, copy.entries(commit, owned), owned)

    def read(self, paths: Iterable[str], limit: int) -> dict[str, bytes]:
        """The content of each of `paths` that is a regular file of at most `limit` bytes in the commit; the others
        are left out, as a reader leaves out a file it cannot read. A symlink is followed while it stays inside the
        repository, as a reader of the checked-out directory follows it (controller.inputs.repofiles): one that
        points out of it, loops or takes more than LINK_HOPS links is left out."""
        return {path: found for path, found in self.contents(paths, limit).items() if isinstance(found, bytes)}

    def contents(self, paths: Iterable[str], limit: int) -> dict[str, bytes | int | str]:
        """`read` of each of `paths`, and for each it leaves out, its size where it is a file over `limit`, else why
        (as opening it in a work tree would fail): `outside` (a symlink out of the repository), `loop`,
        `not-a-folder` (a file on its way where a folder should be), `missing` (a symlink to nothing) or
        `not-a-file` (a folder or a submodule)."""
        walked, kinds = self._resolved(paths)
        targets = sorted({target for target, _ in walked.values() if target is not None})
        contents = self.copy.read_files(kinds, targets, limit)
        large = [target for target in targets if target not in contents and target in kinds
                 and kind_of(kinds[target][0]) == "file"]
        sizes = self.copy.blob_sizes(kinds[target][1] for target in large) if large else {}
        found: dict[str, bytes | int | str] = {}
        for path, (target, why) in walked.items():
            if target is None:
                found[path] = why
            elif target in contents:
                found[path] = contents[target]
            elif target in large:
                found[path] = sizes.get(kinds[target][1], limit + 1)
            else:
                found[path] = "not-a-file" if target in kinds or self._is_folder(target) else "missing"
        return found

    def blob_ids(self, paths: Iterable[str]) -> dict[str, str]:
        """The id of the blob each of `paths` reads as (`read`: a symlink followed inside the repository); the
        paths that read as no regular file are left out."""
        walked, kinds = self._resolved(paths)
        return {path: kinds[target][1] for path, (target, _) in walked.items()
                if target in kinds and kind_of(kinds[target][0]) == "file"}

    def remembered(self, name: str, key: str) -> frozenset[str]:
        """The blob ids kept under `name` with `key` in the work directory (WorkingCopy.remembered)."""
        return self.copy.remembered(name, key)

    def remember(self, name: str, key: str, ids: Iterable[str]) -> None:
        """Keep `ids` under `name` with `key` in the work directory (WorkingCopy.remember)."""
        self.copy.remember(name, key, ids)

    def _resolved(self, paths: Iterable[str]) -> tuple[dict[str, tuple[str | None, str]], dict[str, tuple[str, str]]]:
        """(path -> (where it leads, or None and why: `_walk`), and the commit's entry of each place it leads)."""
        paths = list(paths)
        entries = self._entries_of(paths)
        walked = {path: (path, "") if path in entries and kind_of(entries[path][0]) != "symlink" else self._walk(path)
                  for path in paths}
        return walked, self._entries_of(sorted({target for target, _ in walked.values() if target is not None}))

    def files(self, folder: str) -> dict[str, str]:
        """Every file, symlink and submodule under `folder` in the commit: path -> kind, as a reader lists a work
        tree (controller.inputs.repofiles.yaml_files): a symlink to a folder inside the repository is listed
        through, under its own path, each real folder once. A symlink that leaves the repository (`folder` itself
        among them) is listed as `unsafe`, whatever its name: git cannot tell whether it points to a folder, and
        its read says why it is not read (a work tree's reader reports those that point to a folder there)."""
        found: dict[str, str] = {}
        seen: set[str] = set()
        pending = [folder.rstrip("/")]
        while pending:
            shown = pending.pop()
            real, why = self._walk(shown)
            if real is None:
                found[shown] = "unsafe" if why == "outside" else "symlink"
                continue
            if real in seen:
                continue
            seen.add(real)
            for path, entry in self.copy.entries(self.commit, (real,)).items():
                if not path.startswith(real + "/"):
                    continue  # a folder on the way to it
                listed = shown + path[len(real):]
                self._elsewhere.setdefault(path, entry)
                if kind_of(entry[0]) != "symlink":
                    found[listed] = kind_of(entry[0])
                    continue
                target, why = self._walk(listed)
                if target is None and why == "outside":
                    found[listed] = "unsafe"
                elif target is not None and self.copy.children(self.commit, target) is not None:
                    pending.append(listed)
                else:
                    found[listed] = "symlink"
        return dict(sorted(found.items()))

    def _is_folder(self, path: str) -> bool:
        real = self._real(path)
        return real is not None and self.copy.children(self.commit, real) is not None

    def _real(self, path: str) -> str | None:
        """`path` with every symlink on its way resolved inside the commit, as `os.path.realpath` resolves it in a
        work tree; None where that leaves the repository, loops, or passes through a file."""
        return self._walk(path)[0]

    def _walk(self, path: str) -> tuple[str | None, str]:
        """(`_real` of `path`, and where that is None why: `outside`, `loop` or `not-a-folder`)."""
        done: list[str] = []
        rest, hops = path.split("/"), 0
        while rest:
            part = rest.pop(0)
            if part in ("", "."):
                continue
            if part == "..":
                if not done:
                    return None, "outside"  # above the repository's root
                done.pop()
                continue
            here = "/".join([*done, part])
            if here not in self.entries and here not in self._elsewhere:  # this part and the plain ones after it
                run = [part, *itertools.takewhile(lambda name: name not in ("", ".", ".."), rest)]
                self._entries_of(["/".join([*done, *run[:depth]]) for depth in range(1, len(run) + 1)])
            entry = self.entries.get(here) or self._elsewhere.get(here)
            if entry is not None and kind_of(entry[0]) == "symlink":
                hops += 1
                target = self.copy.read_blobs([entry[1]], LINK_BYTES).get(entry[1])
                if hops > LINK_HOPS:
                    return None, "loop"
                if target is None or target.startswith(b"/"):
                    return None, "outside"
                rest = target.decode("utf-8", errors="surrogateescape").split("/") + rest
                continue
            if entry is not None and rest:
                return None, "not-a-folder"  # a file or a submodule where a folder should be
            done.append(part)
        return "/".join(done) or None, "outside"

    def kinds(self, paths: Iterable[str]) -> dict[str, str]:
        """What each of `paths` is in the commit (`file`, `symlink`, `submodule`; a folder or an absent path is left
        out): one `ls-tree` for those outside the owned prefixes."""
        return {path: kind_of(mode) for path, (mode, _) in self._entries_of(paths).items()}

    def _entries_of(self, paths: Iterable[str]) -> dict[str, tuple[str, str]]:
        """The commit's entries at `paths`: from `entries` under the owned prefixes, each other one looked up in
        git once."""
        paths = list(paths)
        unknown = [path for path in paths if path not in self.entries and path not in self._elsewhere]
        if unknown:
            found = self.copy.entries_at(self.commit, unknown)
            self._elsewhere.update({path: found.get(path) for path in unknown})
        return {path: entry for path in paths
                if (entry := self.entries.get(path) or self._elsewhere.get(path)) is not None}

    def children(self, folder: str) -> dict[str, str] | None:
        """What the commit holds directly in `folder` (WorkingCopy.children); None when it is no folder."""
        return self.copy.children(self.commit, folder)


Render = Callable[[Checkout], Change]


def parse_target(value: str | Target) -> Target:
    """`direct`, `branch:NAME` or `pr:NAME` (the `--write-back` flag)."""
    if isinstance(value, Target):
        return value
    if value == "direct":
        return Target()
    if value.startswith("branch:"):
        return Target(check_branch_name(value.removeprefix("branch:")))
    if value.startswith("pr:"):
        return Target(check_branch_name(value.removeprefix("pr:")), pull_request=True)
    raise InvalidWriteBack(f"write-back target {value!r} is neither 'direct', 'branch:NAME' nor 'pr:NAME'",
                           "pass --write-back direct, --write-back branch:gpushare/plan for a review branch, or "
                           "--write-back pr:gpushare/plan to also open its pull request")


@dataclass(frozen=True)
class _Rendered:
    """A Change and an upstream commit that holds, under its reads, what it was rendered from."""

    upstream: str
    change: Change

    def holds_on(self, copy: WorkingCopy, upstream: str) -> bool:
        """Whether `upstream` holds the same content under the Change's reads (so rendering again gives it back)."""
        reads = self.change.reads
        return reads is not None and (upstream == self.upstream
                                      or not copy.changed_between(self.upstream, upstream, reads))


def _render_on(copy: WorkingCopy, upstream: str, base: str, render: Render, owned: tuple[str, ...],
               earlier: _Rendered | None = None) -> tuple[str | None, Change, int]:
    """Check out `upstream`, render, build the new tree: (its id, or None if equal to `base`'s; change; how many
    files it adds or changes). The `earlier` render's Change is taken instead when `upstream` holds what it read."""
    entries = copy.entries(upstream, owned)
    if earlier is not None and earlier.holds_on(copy, upstream):
        change = earlier.change
        log.info("upstream moved only outside what the render read: its change lands on %s unrendered", upstream[:12])
    else:
        copy.checkout(upstream)
        change = render(Checkout.of(copy, upstream, entries, owned))
    check_change(change, owned)
    edit = plan_edit(change, entries, owned, copy.object_format)
    tree = copy.write_tree(upstream, edit)
    return (None if tree == copy.tree_of(base) else tree), change, len(edit.add)


def _attempt(copy: WorkingCopy, render: Render, owned: tuple[str, ...], target: Target,
             heads: dict[str, str | None], attempt: int, earlier: _Rendered | None,
             before_push: Callable[[], None]) -> tuple[PublishResult | None, _Rendered]:
    """Render on the fetched `heads` (or take the `earlier` render's change), commit if changed, push: the result,
    None when a newer upstream won; and what was landed."""
    upstream = heads[copy.branch]
    branch = target.review or copy.branch
    base = heads.get(branch) or upstream
    tree, change, new_files = _render_on(copy, upstream, base, render, owned, earlier)
    rendered = _Rendered(upstream, change)
    if tree is None:
        return PublishResult(None, attempt, NO_CHANGE, branch, upstream, heads, change, upstream), rendered
    message = change.message.strip()
    if not message:
        raise InvalidWriteBack("the generated tree changed but the render gave no commit message",
                               "return a Change whose message says what changed and why")
    parents = [base]
    if base != upstream and not copy.is_ancestor(upstream, base):
        parents.append(upstream)
    commit = copy.commit_tree(tree, parents, message + "\n")
    before_push()
    outcome = copy.push(commit, branch, new_files)
    if outcome.status == "refused" and "checked out" in outcome.detail:
        raise PushRejected(f"the remote is a non-bare repository with {branch} checked out, and git refuses to "
                           f"update a checked-out branch ({outcome.detail})",
                           "push to a bare repository (git clone --bare), or let the remote accept it with "
                           "`git config receive.denyCurrentBranch updateInstead`, or write to another branch with "
                           "--write-back branch:NAME")
    if outcome.status == "refused":
        raise PushRejected(f"the remote refused the push to {branch}: {outcome.detail}",
                           "allow the controller's identity to push to this branch (branch protection, "
                           "hooks), or write to a review branch with --write-back branch:NAME")
    if outcome.status == "stale":
        _refuse_a_branch_in_the_way(copy, branch, outcome.detail)
        log.info("push to %s lost the race to a newer upstream (%s); trying again on top of it", branch,
                 outcome.detail)
        return None, rendered
    if outcome.status == "present":  # another controller built and pushed this very commit first
        log.info("%s is already on %s: another writer pushed the same commit", commit[:12], branch)
        return PublishResult(None, attempt, NO_CHANGE, branch, upstream, {**heads, branch: commit}, change,
                             _read_at(commit, target, upstream)), rendered
    log.info("pushed %s to %s (attempt %d)", commit[:12], branch, attempt)
    return PublishResult(commit, attempt, message, branch, upstream, {**heads, branch: commit}, change,
                         _read_at(commit, target, upstream)), rendered


def _refuse_a_branch_in_the_way(copy: WorkingCopy, branch: str, detail: str) -> None:
    """PushRejected when `branch` cannot be created because the remote holds a branch named like one of its
    directories (git keeps `a/b` and `a/b/c` apart: a single cluster's review branch beside a cluster's own): no
    retry would ever land it."""
    parts = branch.split("/")
    if "failed to update ref" not in detail or len(parts) < 2:
        return
    inside = [f"refs/heads/{'/'.join(parts[:depth])}" for depth in range(1, len(parts))]
    listed = copy.git.text("ls-remote", "--heads", "origin", *inside)
    found = [line.split("\t", 1)[1].removeprefix("refs/heads/") for line in listed.splitlines() if "\t" in line]
    if found:
        raise PushRejected(f"the remote holds the branch {found[0]!r}, so git cannot create {branch!r} beside it "
                           f"({detail})", f"delete the branch {found[0]!r} on the remote (a review branch of the "
                           "single-cluster layout, once merged or closed), or write to another branch")


def _read_at(commit: str, target: Target, upstream: str) -> str:
    """The tracked branch's commit whose content renders a pushed change: the pushed one itself when it is on the
    tracked branch (a pass renders its own last commit into the same tree: the rule that lets a pass with nothing
    new stop at the fetch), else the upstream it was rendered on (a review branch's commit is not on it)."""
    return commit if target.review is None else upstream


def publish(copy: WorkingCopy, render: Render, *, owned: tuple[str, ...],
            target: str | Target = "direct", previous: PublishResult | None = None,
            max_attempts: int = 5, backoff_s: float = 0.2,
            sleep: Callable[[float], None] = time.sleep,
            before_push: Callable[[], None] = lambda: None) -> PublishResult:
    """Render on top of upstream, commit if the owned tree changed, push; retry lost races.

    One pass (`copy.in_pass`: the work directory recovered first, cloned again if git finds it damaged).
    `previous`: the last pass's result, to be given only when the render's inputs
    outside git did not change since; if no branch moved either, nothing is
    checked out or rendered (a pass with nothing new costs one fetch); if only the
    tracked branch moved, outside the reads of its Change, that Change is landed
    on the new upstream without rendering. `before_push` runs right before each
    push, rendered or not (a leader renews its Lease there, and raises if it lost it).
    """
    owned = normalize_owned(owned)
    target = parse_target(target)
    if target.review == copy.branch:
        raise InvalidWriteBack(f"review branch {target.review!r} is the tracked branch",
                               "use --write-back direct, or name a different review branch")
    return copy.in_pass(lambda: _publish(copy, render, owned, target, previous, max_attempts, backoff_s, sleep,
                                         before_push))


def _publish(copy: WorkingCopy, render: Render, owned: tuple[str, ...], target: Target,
             previous: PublishResult | None, max_attempts: int, backoff_s: float,
             sleep: Callable[[float], None], before_push: Callable[[], None]) -> PublishResult:
    also = () if target.review is None else (target.review,)
    heads = copy.fetch(*also)
    if previous is not None and heads == dict(previous.heads):
        return PublishResult(None, 0, NO_CHANGE, target.review or copy.branch, heads[copy.branch], heads,
                             previous.change, previous.rendered_on)
    earlier = None
    if (previous is not None and previous.change is not None and previous.rendered_on is not None
            and all(heads.get(b) == previous.heads.get(b) for b in also)):
        earlier = _Rendered(previous.rendered_on, previous.change)
        upstream = heads[copy.branch]
        if target.review is None and earlier.holds_on(copy, upstream):
            # the tracked branch held the change where it was rendered, and nothing it read moved since (its own
            # paths among them): the change is in place as it stands
            log.info("%s moved only outside what the last render read: nothing to do", copy.branch)
            return PublishResult(None, 0, NO_CHANGE, copy.branch, upstream, heads, previous.change, upstream)
    for attempt in range(1, max_attempts + 1):
        if attempt > 1:
            sleep(backoff_s * 2 ** (attempt - 2) * random.uniform(0.5, 1.5))
            heads = copy.fetch(*also)
        result, earlier = _attempt(copy, render, owned, target, heads, attempt, earlier, before_push)
        if result is not None:
            return result
    raise PushRetriesExhausted(f"{max_attempts} pushes to {target.review or copy.branch} each lost the race "
                               "to a newer upstream",
                               "another writer pushes constantly: check that only one controller "
                               "writes this branch; the next pass tries again")
