"""Which repository paths the controller may write, checked before anything is written.

Owns the pure rules: an owned prefix is a relative directory (`rendered/`) or
file path; a generated path must be relative, normalized, free of `..`, `.` and
`.git` segments, and under an owned prefix, so the controller never writes
outside the work tree nor edits a user file (`models/`, `gpus.yaml`). What
upstream's tree holds on the way (a committed symlink, a kept file) is checked
by gitops.change. Called by gitops.change and gitops.writeback.
"""
from __future__ import annotations

from collections.abc import Iterable

from gitops.errors import InvalidWriteBack, UnsafePath

_FIX_PATH = "generate relative paths under an owned prefix, without '..', '.', '.git' or a leading '/'"


def _bad_segment(path: str) -> str | None:
    """Why `path` is not a clean relative POSIX path, or None."""
    if not path:
        return "it is empty"
    if path.startswith("/"):
        return "it is absolute"
    if "\\" in path or "\0" in path:
        return "it contains a backslash or NUL"
    for segment in path.split("/"):
        if segment in ("", ".", ".."):
            return f"it has a {segment or 'empty'!r} segment"
        if segment.lower() == ".git":
            return "it reaches into .git"
    return None


def normalize_owned(owned: Iterable[str]) -> tuple[str, ...]:
    """The owned prefixes, checked and sorted; a directory prefix ends with '/'."""
    result = []
    for prefix in owned:
        problem = _bad_segment(prefix.removesuffix("/"))
        if problem:
            raise InvalidWriteBack(f"owned prefix {prefix!r} is unusable: {problem}",
                                   "own relative directories such as 'rendered/' and 'decisions/'")
        result.append(prefix)
    if not result:
        raise InvalidWriteBack("no owned prefix given", "own at least one directory, e.g. 'rendered/'")
    return tuple(sorted(set(result)))


class Prefixes:
    """Paths and directory prefixes (ending with '/'), asked of many paths: `holds` costs a set lookup and one
    `startswith` over the directories, however many paths there are (a held prune keeps every generated path)."""

    __slots__ = ("exact", "directories")

    def __init__(self, prefixes: Iterable[str]) -> None:
        self.exact = frozenset(prefixes)
        self.directories = tuple(sorted(prefix for prefix in self.exact if prefix.endswith("/")))

    def holds(self, path: str) -> bool:
        """True when `path` is one of the prefixes or inside one that ends with '/'."""
        return path in self.exact or path.startswith(self.directories)


def check_generated(path: str, owned: tuple[str, ...] | Prefixes) -> str:
    """`path` if the controller may write it; else UnsafePath saying why."""
    problem = _bad_segment(path) if isinstance(path, str) else "it is not a string"
    if problem:
        raise UnsafePath(f"refused to write {path!r}: {problem}", _FIX_PATH)
    owned = owned if isinstance(owned, Prefixes) else Prefixes(owned)
    if not owned.holds(path):
        raise UnsafePath(f"refused to write {path!r}: it is not under an owned prefix {sorted(owned.exact)}",
                         "the controller never edits user files; generate it under an owned prefix")
    return path


def check_no_file_dir_clash(paths: Iterable[str]) -> None:
    """No generated path may also be a directory of another generated path."""
    wanted = set(paths)
    for path in wanted:
        parts = path.split("/")
        for depth in range(1, len(parts)):
            parent = "/".join(parts[:depth])
            if parent in wanted:
                raise UnsafePath(f"refused to write {path!r}: {parent!r} is generated as a file too",
                                 "generate each path either as a file or as a directory, not both")

