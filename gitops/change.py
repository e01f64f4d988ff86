"""The desired generated tree (`Change`) and the edit that turns upstream's tree into it.

Owns what a render returns and the pure rules for landing it in git: every
generated and kept path is checked (owned, inside the tree) before anything is
written; owned files neither generated nor kept are removed; a generated file
whose blob upstream already holds at that path is left as it is (no new
object, same tree entry); nothing is written through a symlink nor over a
kept or user file. `plan_edit` turns (Change, upstream's entries) into a
`TreeEdit`: the index entries to remove and add and the new blobs, which
gitops.workcopy writes into the object store. No disk, no git: called by
gitops.writeback.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gitops.errors import UnsafePath
from gitops.git import blob_id
from gitops.paths import Prefixes, check_generated, check_no_file_dir_clash

SYMLINK = "120000"
REGULAR_FILE = ("100644", "100755")
# path -> (mode, object id), as `git ls-tree -r` lists a commit's files, symlinks and submodules.
Entries = Mapping[str, tuple[str, str]]


@dataclass(frozen=True)
class Change:
    """The desired content of the owned paths, and why.

    `files`: repository path -> bytes, every generated file. `keep`: owned paths
    (or directory prefixes ending in '/') left exactly as upstream has them even
    though not generated, e.g. the last good output of a model whose input is
    broken. Every other owned file upstream holds is deleted. `message`: the
    commit message, used only when something changed. `reads`: git pathspecs of
    everything the render read (None: not known); on an upstream whose commits
    since the one rendered change nothing there, the same Change is landed again
    without rendering (several controllers that each own their paths of one branch).
    """

    files: Mapping[str, bytes]
    message: str
    keep: frozenset[str] = frozenset()
    reads: tuple[str, ...] | None = None


@dataclass(frozen=True)
class TreeEdit:
    """Upstream's tree -> the generated tree: paths to remove, entries to add, blobs to write first."""

    remove: tuple[str, ...] = ()
    add: Mapping[str, tuple[str, str]] = field(default_factory=dict)  # path -> (mode, blob id)
    blobs: Mapping[str, bytes] = field(default_factory=dict)  # blob id -> content

    @property
    def empty(self) -> bool:
        return not self.remove and not self.add


def check_change(change: Change, owned: tuple[str, ...]) -> None:
    """Every generated and kept path is safe and owned; nothing is written before this passes."""
    prefixes = Prefixes(owned)
    for path in change.files:
        check_generated(path, prefixes)
    for path in change.keep:
        check_generated(path.removesuffix("/"), prefixes)
    check_no_file_dir_clash(change.files)


def _parents(path: str) -> list[str]:
    """The directories `path` lies in, outermost first: 'a/b/c' -> ['a', 'a/b']."""
    parts = path.split("/")
    return ["/".join(parts[:depth]) for depth in range(1, len(parts))]


def _check_nothing_on_the_way(path: str, surviving: Entries) -> None:
    """No directory `path` lies in is, upstream, a file or symlink that stays (kept or not owned)."""
    for parent in _parents(path):
        entry = surviving.get(parent)
        if entry is None:
            continue
        if entry[0] == SYMLINK:
            raise UnsafePath(f"refused to write {path!r}: {parent} is a symlink in the repository "
                             "and could point outside the work tree",
                             f"replace the symlink {parent} with a directory in git")
        raise UnsafePath(f"refused to write {path!r}: {parent} is a kept or user file in the way",
                         f"stop keeping {parent}, or generate another path")


def plan_edit(change: Change, upstream: Entries, owned: tuple[str, ...],
              object_format: str = "sha1") -> TreeEdit:
    """The edit that makes upstream's owned paths exactly `change` (checked with `check_change` first).

    `upstream` holds the entries of upstream's commit under the owned prefixes
    and the directories they lie in (enough to see a symlink or a file on the
    way). Raises UnsafePath when a generated path would go through a symlink,
    replace a kept or user file, or replace a directory holding one.
    """
    ours, kept = Prefixes(owned), Prefixes(change.keep)
    remove = tuple(path for path in upstream if ours.holds(path)
                   and path not in change.files and not kept.holds(path))
    removed = set(remove)
    surviving = {path: entry for path, entry in upstream.items() if path not in removed}
    surviving_dirs = {parent for path in surviving for parent in _parents(path)}
    add: dict[str, tuple[str, str]] = {}
    blobs: dict[str, bytes] = {}
    checked_dirs: set[str] = set()
    for path in sorted(change.files):
        directory = path.rpartition("/")[0]
        if directory not in checked_dirs:
            _check_nothing_on_the_way(path, surviving)
            checked_dirs.add(directory)
        if path in surviving_dirs:
            raise UnsafePath(f"refused to write {path!r}: a directory with kept files is in the way",
                             "stop keeping the files under it, or generate another path")
        data = change.files[path]
        blob = blob_id(data, object_format)
        mode, current = upstream.get(path, (None, None))
        if mode in REGULAR_FILE and current == blob:
            continue
        add[path] = (mode if mode in REGULAR_FILE else "100644", blob)
        blobs[blob] = data
    return TreeEdit(remove, add, blobs)
