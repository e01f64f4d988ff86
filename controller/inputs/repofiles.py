"""Reading files of a checked-out GitOps repository without ever leaving it.

Owns the only way the controller lists and reads repository inputs (models/, profiles/,
compositions/, gpus.yaml, decisions/, rendered/PLAN.md): a path is read only when its
real path, every symlink resolved, lies inside the repository's real path, and only
when it is a regular file no larger than the input limit. A symlink that points out
of the tree (to a token, a ServiceAccount secret, /dev/zero, a FIFO) is refused with
`RepoFileError`, whose message names the path and never the target's content.
Called by controller.inputs.reader (every input and controller-written file) and the shells (the
files under the generated prefixes, for the prune guard).
"""
from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from controller.inputs.utf8 import NotUtf8, decode_utf8

YAML_SUFFIXES = (".yaml", ".yml")
DEFAULT_MAX_FILE_BYTES = 4 << 20


class RepoFileError(Exception):
    """One repository file that cannot be read; `reason`, `message` and `fix` as InputError wants them."""

    def __init__(self, reason: str, message: str, fix: str):
        super().__init__(message)
        self.reason, self.message, self.fix = reason, message, fix


def max_file_bytes(environ=os.environ) -> int:
    """The largest input file read (GPUSHARE_MAX_INPUT_BYTES, default 4 MiB)."""
    text = environ.get("GPUSHARE_MAX_INPUT_BYTES", "").strip()
    return int(text) if text.isdigit() and int(text) > 0 else DEFAULT_MAX_FILE_BYTES


STATE_FACTOR = 16  # the controller's own files (PLAN.md, the owners file) grow with the fleet, a user's file does not


def max_state_bytes(environ=os.environ) -> int:
    """The largest file the controller wrote that it reads back: STATE_FACTOR inputs (64 MiB by default), so
    a fleet whose PLAN.md or owners file outgrows one input file is still read."""
    return STATE_FACTOR * max_file_bytes(environ)


def _inside(root_real: str, path: str) -> bool:
    return _within(root_real, os.path.realpath(path))


def _within(root_real: str, real: str) -> bool:
    """Whether the resolved path `real` is the resolved root `root_real` or lies under it, and not in its .git
    folder: git's own files (the remote's URL, with any credential in it; the hooks) are no input of any commit."""
    inside = root_real.rstrip(os.sep) + os.sep
    return real == root_real or (real.startswith(inside) and not
                                 (real + os.sep).startswith(inside + ".git" + os.sep))


def yaml_files(root: Path, sub: str) -> list[str]:
    """Repository-relative POSIX paths of the *.yaml/*.yml entries under `root/sub`, sorted.

    Directories are descended only when their real path is inside the repository (a directory
    symlink out of it is listed as itself, so reading it reports the problem); each real directory
    once. Files are listed whatever they point to: `read_text` decides."""
    root_real = os.path.realpath(root)
    base = Path(root) / sub
    if not os.path.lexists(base):
        return []
    if not _inside(root_real, base):
        return [sub]
    found: list[str] = []
    seen: set[str] = set()
    pending = [base]
    while pending:
        directory = pending.pop()
        real = os.path.realpath(directory)
        if real in seen or not os.path.isdir(directory):
            continue
        seen.add(real)
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            path = Path(entry.path)
            if entry.is_dir(follow_symlinks=False):
                pending.append(path)
            elif entry.is_symlink() and os.path.isdir(path):
                if _inside(root_real, path):
                    pending.append(path)
                else:
                    found.append(path.relative_to(root).as_posix())
            elif path.suffix in YAML_SUFFIXES:
                found.append(path.relative_to(root).as_posix())
    return sorted(found)


def is_file(root: Path, rel: str) -> bool:
    """Whether `rel` names something (a file, or a symlink, even a dangling one) the pass should read."""
    return os.path.lexists(Path(root) / rel)


def read_text(root: Path, rel: str, limit: int | None = None) -> str:
    """The UTF-8 text of `root/rel`, or RepoFileError: outside the repository, not a regular file,
    larger than `limit` bytes (default `max_file_bytes()`), unreadable, or not UTF-8."""
    return _read_real(os.path.realpath(root), rel, os.path.realpath(Path(root) / rel), limit)


def read_texts(root: Path, rels: Iterable[str], limit: int | None = None) -> dict[str, str | RepoFileError]:
    """`read_text` of many files (rel -> its text, or the RepoFileError it would raise), as safe and faster:
    the repository's and each directory's real path are resolved once for the batch, and a file's own only
    when it is a symlink (thousands of decision records sit in a few directories)."""
    root_real = os.path.realpath(root)
    directories: dict[str, str] = {}
    texts: dict[str, str | RepoFileError] = {}
    for rel in rels:
        parent, _, name = rel.rpartition("/")
        if name in ("", ".", ".."):
            real = os.path.realpath(Path(root) / rel)
        else:
            directory = directories.get(parent)
            if directory is None:
                directory = directories[parent] = os.path.realpath(os.path.join(root, parent))
            real = os.path.join(directory, name)
            if os.path.islink(real):
                real = os.path.realpath(real)
        try:
            texts[rel] = _read_real(root_real, rel, real, limit)
        except RepoFileError as exc:
            texts[rel] = exc
    return texts


def _read_real(root_real: str, rel: str, real: str, limit: int | None) -> str:
    """The text of `rel`, whose resolved path is `real` (opened without following a link it became since)."""
    limit = max_file_bytes() if limit is None else limit
    if not _within(root_real, real):
        raise unsafe_path(rel)
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise unopenable(rel, exc.errno) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise not_a_file(rel)
        if info.st_size > limit:
            raise too_large(rel, limit, info.st_size)
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise too_large(rel, limit)
    return decoded(rel, data)


def decoded(rel: str, data: bytes) -> str:
    """The UTF-8 text of file `rel`'s `data`, or RepoFileError."""
    try:
        return decode_utf8(data)
    except NotUtf8 as exc:
        raise RepoFileError("UnreadableFile", f"{rel} is {exc}", "save it as UTF-8") from None


def unsafe_path(rel: str) -> RepoFileError:
    return RepoFileError("UnsafePath", f"{rel} is a symlink (or lies under one) that points outside the "
                         "repository or into its .git folder; it is not read",
                         "replace the symlink with the file itself, committed in the repository")


def unopenable(rel: str, error: int) -> RepoFileError:
    """`rel` cannot be opened: the operating system's `error` (an errno)."""
    return RepoFileError("UnreadableFile", f"{rel} cannot be opened ({os.strerror(error)})",
                         "check that it exists and is readable")


def not_a_file(rel: str) -> RepoFileError:
    return RepoFileError("NotAFile", f"{rel} is not a regular file", "commit a plain YAML file there")


def too_large(rel: str, limit: int, size: int | None = None) -> RepoFileError:
    return RepoFileError("FileTooLarge", f"{rel} has {size} bytes, more than the limit of {limit}" if size is not None
                         else f"{rel} has more than {limit} bytes",
                         "split it into several files, or raise GPUSHARE_MAX_INPUT_BYTES")


def read_optional(root: Path, rel: str, limit: int | None = None) -> str | None:
    """`read_text`, or None when the file is absent or cannot be read safely (controller-written files)."""
    if not is_file(root, rel):
        return None
    try:
        return read_text(root, rel, limit)
    except RepoFileError:
        return None


def files_under(root: Path, sub: str) -> list[str]:
    """Every file (and symlink, not followed) under `root/sub`, repository-relative, sorted: what git holds there."""
    base = Path(root) / sub
    if base.is_symlink() or not base.is_dir():
        return [sub] if os.path.lexists(base) else []
    found = []
    for directory, dirs, files in os.walk(base, followlinks=False):
        rel = Path(directory).relative_to(root).as_posix()  # once per directory: a pass lists tens of thousands
        found += [f"{rel}/{name}" for name in files]
        found += [f"{rel}/{name}" for name in dirs if os.path.islink(os.path.join(directory, name))]
    return sorted(found)


def owned_files(root: Path, prefixes: Iterable[str]) -> list[str]:
    """The files under the controller's prefixes (`rendered/`, `decisions/`...) as the tree holds them."""
    return [path for prefix in prefixes for path in files_under(root, prefix.rstrip("/"))]
