"""The controller's work directory is its own: it holds it, and clears what a killed git process leaves in it.

Owns:

- the lock: a controller process takes an exclusive `flock` on the work directory itself while it uses it
  (gitops.workcopy opens it with the copy; the process's end lets go, a SIGKILL or OOM kill included: the
  kernel drops the lock with the process). A second process that asks waits up to `wait_s`, then gets
  WorkdirBusy. Copies of one directory in one process share the lock. The lock lasts the process, not one
  pass: the copy is read between passes too (the revision Argo CD synced, right-sizing records), and two
  controllers on one directory are a mistake to report at once, not turns to take;
- the mark `.git/gpushare-workdir` (the remote and branch): written when the controller creates or adopts
  the directory; only a marked directory is ever emptied (`empty`) to be cloned again;
- its notes, `.git/gpushare-notes/<name>` (`recall`, `keep`): a set of object ids a caller remembers about
  this directory's objects under a key of its own (what it judged them to be: an object's content never
  changes under its id); a cache only, so a note that is absent, kept under another key, over NOTE_BYTES or
  garbled reads as none, and the directory cloned again starts without notes;
- the leftovers of a git process killed mid-command: every `*.lock` file under `.git` (index.lock, HEAD.lock,
  ORIG_HEAD.lock, config.lock, packed-refs.lock, shallow.lock, refs/**/NAME.lock, the tree edit's scratch ref
  included) and temporary packs (objects/pack/tmp_*), and with them temporary loose objects (objects/??/tmp_obj_*).
  git writes a file by writing its lock (or a temporary) and renaming it, so the files themselves are whole:
  a leftover is only in the way;
- who else runs git in the directory (`others`): from /proc, a git process whose working directory lies in
  it or that holds one of its files open. A lock is stale only when nobody runs git there: none of this
  controller's (gitops.git counts its running commands) and none of anyone else's.

Called by gitops.workcopy.
"""
from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import shutil
import threading
import time
from pathlib import Path

from gitops.errors import WorkdirBusy, WorkdirInUse

log = logging.getLogger("gpushare.gitops")
MARK = "gpushare-workdir"
NOTES = "gpushare-notes"  # .git/NOTES/<name>: a key line, then one object id a line
NOTE_BYTES = 16 << 20  # a larger note is not read (some 400,000 ids)
_NOTE_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
_NOTE_KEY = re.compile(r"[0-9a-f]{16,128}")
_OBJECT_ID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
LOCK_WAIT_S = 30.0  # how long a second process waits for the work directory before WorkdirBusy
_TEMPORARY = ("tmp_pack_", "tmp_idx_", "tmp_rev_", "tmp_mtimes_", "tmp_obj_", "tmp_bitmap_")
_held: dict[tuple[int, int], list[int]] = {}  # (device, inode) -> [fd, copies holding it], for this process
_held_lock = threading.Lock()


class Workdir:
    """`root`, held by this process (see the module docstring)."""

    def __init__(self, root: Path, *, wait_s: float | None = None):
        self.root = root
        self.git_dir = root / ".git"
        self._key = _hold(root, LOCK_WAIT_S if wait_s is None else wait_s)
        self._released = False

    def release(self) -> None:
        """Let go of this copy's share of the lock (the last share unlocks the directory)."""
        if self._released:
            return
        self._released = True
        with _held_lock:
            held = _held[self._key]
            held[1] -= 1
            if held[1] == 0:
                os.close(held[0])  # closing the descriptor drops the flock
                del _held[self._key]

    # ------------------------------------------------------------------ the mark

    def mark(self, url: str, branch: str) -> None:
        text = f"{url}\n{branch}\n"
        path = self.git_dir / MARK
        if not path.is_file() or path.read_text(errors="replace") != text:
            path.write_text(text)

    def marked(self) -> bool:
        return (self.git_dir / MARK).is_file()

    # ------------------------------------------------------------------ notes

    def recall(self, name: str, key: str) -> frozenset[str]:
        """The object ids kept under `name` with `key` (`keep`); none where the note is absent, was kept under
        another key, or cannot be trusted (over NOTE_BYTES, or a line that is no object id)."""
        try:
            with open(self._note(name, key), "rb") as handle:
                data = handle.read(NOTE_BYTES + 1)
        except OSError:
            return frozenset()
        lines = data.decode("ascii", errors="replace").split("\n")
        if len(data) > NOTE_BYTES or lines[0] != key or lines[-1] != "" or not all(
                _OBJECT_ID.fullmatch(line) for line in lines[1:-1]):
            return frozenset()
        return frozenset(lines[1:-1])

    def keep(self, name: str, key: str, ids: frozenset[str]) -> None:
        """Keep `ids` under `name` with `key`, in place of what the note held (written whole, then renamed); a note
        that cannot be written (a full disk) is logged and left as it was: a pass never fails for a cache."""
        path = self._note(name, key)
        scratch = path.with_name(f".{name}.tmp")
        try:
            path.parent.mkdir(exist_ok=True)
            scratch.write_text(key + "\n" + "".join(f"{object_id}\n" for object_id in sorted(ids)),
                               encoding="ascii")
            os.replace(scratch, path)
        except OSError as error:
            log.warning("could not write the note %s in the work directory %s (%s): the next process reads the "
                        "files it spares again", name, self.root, error.strerror or error)

    def _note(self, name: str, key: str) -> Path:
        if _NOTE_NAME.fullmatch(name) is None or _NOTE_KEY.fullmatch(key) is None:
            raise ValueError(f"a work directory's note needs a lowercase name and a hex key, not {name!r}, {key!r}")
        return self.git_dir / NOTES / name

    # ------------------------------------------------------------------ leftovers

    def leftovers(self) -> list[Path]:
        """The lock files and temporary packs under .git, sorted; when there are any (a git was killed), the
        temporary loose objects too. Those alone (a killed `commit-tree`: a few bytes, in the way of nothing)
        are left to git: finding them means listing every loose object, which a pass should not pay for."""
        found: list[Path] = []
        objects = self.git_dir / "objects"
        for directory, subdirectories, files in os.walk(self.git_dir):
            here = Path(directory)
            if here == objects:
                subdirectories[:] = [d for d in subdirectories if d in ("pack", "info")]
            found += [here / name for name in files if name.endswith(".lock")
                      or (objects in (here, here.parent) and name.startswith(_TEMPORARY))]
        if found and objects.is_dir():
            for fan_out in os.scandir(objects):
                if len(fan_out.name) == 2 and fan_out.is_dir():
                    found += [Path(e.path) for e in os.scandir(fan_out.path) if e.name.startswith(_TEMPORARY)]
        return sorted(found)

    def others(self) -> list[tuple[int, str]]:
        """(pid, command line) of each git process using the directory (asked only when none of this process's
        runs there: gitops.git counts them). Empty where /proc is not readable."""
        users = []
        inside = str(self.root) + os.sep
        try:
            entries = list(os.scandir("/proc"))
        except OSError:
            return []
        for entry in entries:
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                if not Path(entry.path, "comm").read_text().startswith("git"):
                    continue
                places = [os.readlink(f"{entry.path}/cwd")]
                places += [os.readlink(fd.path) for fd in os.scandir(f"{entry.path}/fd")]
            except OSError:  # gone, or not ours to read
                continue
            if any(place == str(self.root) or place.startswith(inside) for place in places):
                command = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").strip()
                users.append((int(entry.name), command.decode("utf-8", errors="replace")[:200]))
        return users

    def others_after(self, grace_s: float) -> list[tuple[int, str]]:
        """`others`, waiting up to `grace_s` for them to end."""
        deadline = time.monotonic() + grace_s
        while True:
            users = self.others()
            if not users or time.monotonic() >= deadline:
                return users
            time.sleep(0.2)

    def remove(self, paths: list[Path]) -> None:
        for path in paths:
            try:
                path.unlink()
            except FileNotFoundError:
                continue
            log.warning("removed %s from the work directory %s: a git process that was killed (a controller or "
                        "git killed mid-command, an OOM kill) left it, and no git process runs there now",
                        path.relative_to(self.root), self.root)

    def empty(self) -> None:
        """Remove everything in the directory (not the directory itself: this process holds it), to clone anew."""
        for entry in os.scandir(self.root):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)


def _hold(root: Path, wait_s: float) -> tuple[int, int]:
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    except NotADirectoryError:
        raise WorkdirInUse(f"{root} is not a directory", "point the work directory at a directory") from None
    key = (os.fstat(fd).st_dev, os.fstat(fd).st_ino)
    deadline = time.monotonic() + wait_s
    with _held_lock:  # one thread of this process at a time asks for a directory
        if key in _held:  # another copy of this process holds it already
            os.close(fd)
            _held[key][1] += 1
            return key
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN) or time.monotonic() >= deadline:
                    os.close(fd)
                    if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                        raise
                    raise WorkdirBusy(f"another process holds the work directory {root} (waited {wait_s:g} s "
                                      "for it)", "give each controller (and each manual `gpushare reconcile`) its "
                                      f"own --workdir; `fuser -v {root}` names the process that holds it") from None
                time.sleep(0.1)
        _held[key] = [fd, 1]
    return key
