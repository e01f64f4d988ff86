"""The desired generated tree (`Change`) and making the work tree match it.

Owns what a render returns and how it lands on disk: every generated and kept
path is checked (owned, inside the tree) before anything is written; owned
files neither generated nor kept are deleted; a generated file whose blob the
checked-out commit already holds is not touched; nothing is written through a
symlink. Returns the paths it wrote or deleted, which are exactly what gets
staged. Called by gitops.writeback.
"""
from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gitops.errors import UnsafePath
from gitops.git import blob_id
from gitops.paths import check_generated, check_no_file_dir_clash, check_no_symlink_on_the_way, is_under

_REGULAR_FILE = ("100644", "100755")


@dataclass(frozen=True)
class Change:
    """The desired content of the owned paths, and why.

    `files`: repository path -> bytes, every generated file. `keep`: owned paths
    (or directory prefixes ending in '/') left exactly as upstream has them even
    though not generated, e.g. the last good output of a model whose input is
    broken. Every other owned file upstream holds is deleted. `message`: the
    commit message, used only when something changed.
    """

    files: Mapping[str, bytes]
    message: str
    keep: frozenset[str] = frozenset()


def check_change(change: Change, owned: tuple[str, ...]) -> None:
    """Every generated and kept path is safe and owned; nothing is written before this passes."""
    for path in change.files:
        check_generated(path, owned)
    for path in change.keep:
        check_generated(path.removesuffix("/"), owned)
    check_no_file_dir_clash(change.files)


def _prune_empty_parents(root: Path, path: Path) -> None:
    parent = path.parent
    while parent != root and not any(parent.iterdir()):
        parent.rmdir()
        parent = parent.parent


def _write(root: Path, path: str, data: bytes, safe_dirs: set[Path]) -> None:
    """Write one generated file as a regular file, never through a symlink."""
    target = root / path
    if target.parent not in safe_dirs:
        check_no_symlink_on_the_way(root, path)
        target.parent.mkdir(parents=True, exist_ok=True)
        safe_dirs.add(target.parent)
    try:
        mode = os.lstat(target).st_mode
    except FileNotFoundError:
        mode = 0
    if stat.S_ISLNK(mode):
        target.unlink()
    elif stat.S_ISDIR(mode):
        raise UnsafePath(f"refused to write {path!r}: a directory with kept files is in the way",
                         "stop keeping the files under it, or generate another path")
    target.write_bytes(data)


def apply_change(root: Path, change: Change, index: Mapping[str, tuple[str, str]],
                 object_format: str = "sha1") -> list[str]:
    """Make the owned files under `root` what `change` says; the paths written or deleted.

    `index` holds the owned entries (path -> (mode, blob id)) of the commit just
    checked out, so a generated file whose blob is already there is not touched.
    """
    touched = []
    for path in index:
        if path not in change.files and not is_under(path, change.keep):
            check_no_symlink_on_the_way(root, path)
            (root / path).unlink(missing_ok=True)
            _prune_empty_parents(root, root / path)
            touched.append(path)
    safe_dirs: set[Path] = set()
    for path in sorted(change.files):
        data = change.files[path]
        entry = index.get(path)
        if entry is not None and entry[0] in _REGULAR_FILE and entry[1] == blob_id(data, object_format):
            continue
        _write(root, path, data, safe_dirs)
        touched.append(path)
    return touched
