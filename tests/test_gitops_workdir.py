"""The work directory is the controller's own (gitops.workdir, workcopy), against a real remote over git daemon:

a directory git cannot trust (a corrupt index, an object missing or empty, not a repository any more, another
remote) is cloned again and the pass renders, logged; one that is not marked as the controller's is never
removed; stale locks are removed only when no git process runs there (none of this process's, none of
another's, which is named instead); a second process on the same directory waits, then WorkdirBusy, while
copies in one process share it; and the right-sizing shell's `sync` recovers like a pass."""
from __future__ import annotations

import fcntl
import functools
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import gitops
import gitops.workcopy
import gitops.workdir
from gitops import Change, Checkout, WorkingCopy
from gitops.errors import WorkdirBusy, WorkdirInUse
from gitserver import GitServer, git, serving

pytestmark = pytest.mark.integration
REPO, OTHER = "fleet.git", "other.git"
SEED = {"models/a.yaml": b"model: a\n"}
publish = functools.partial(gitops.publish, owned=("rendered/",))


def render(checkout: Checkout) -> Change:
    files = {f"rendered/{m.stem}.yaml": m.read_bytes() for m in sorted((checkout.root / "models").glob("*.yaml"))}
    return Change(files, f"render {len(files)} models")


@pytest.fixture
def remote(tmp_path: Path):
    with serving(tmp_path / "remote") as server:
        server.create_repo(REPO, SEED)
        server.create_repo(OTHER, {"x": b"x\n"})
        yield server


def _rendered_once_more(remote: GitServer, work: Path) -> None:
    """A user's change, then a pass on `work`: it must render it."""
    remote.push_files(REPO, {"models/b.yaml": b"model: b\n"}, "a user adds a model")
    result = publish(WorkingCopy(remote.url(REPO), "main", work), render)
    assert result.changed and remote.files(REPO)["rendered/b.yaml"] == b"model: b\n"
    assert remote.is_ancestor(REPO, remote.head(REPO) + "~1", remote.head(REPO))


def _loose_object(work: Path, commit: str) -> Path:
    return work / ".git" / "objects" / commit[:2] / commit[2:]


# case -> (what breaks the directory, whether the controller clones again: git's own fetch brings objects back
# that the remote still has, so a directory that only lost its packs renders without a clone)
DAMAGE = {
    "a-corrupt-index": (lambda work, commit: (work / ".git" / "index").write_bytes(b"DIRC garbage"), True),
    "an-empty-object": (lambda work, commit: _loose_object(work, commit).write_bytes(b""), True),
    "not-a-repository-any-more": (lambda work, commit: (work / ".git" / "HEAD").unlink(), True),
    "another-remote": (lambda work, commit: git("config", "remote.origin.url", "git://127.0.0.1:9/other.git",
                                                cwd=work), True),
    "its-packs-lost": (lambda work, commit: shutil.rmtree(work / ".git" / "objects" / "pack"), False),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_a_directory_git_cannot_trust_is_cloned_again_and_the_pass_renders(remote, tmp_path, caplog, case):
    work = tmp_path / "w"
    commit = publish(WorkingCopy(remote.url(REPO), "main", work), render).commit  # the controller's own commit
    for path in (work / ".git" / "objects").rglob("*"):  # loose objects are read-only, as git writes them
        path.chmod(0o755 if path.is_dir() else 0o644)
    damage, cloned = DAMAGE[case]
    damage(work, commit)
    with caplog.at_level(logging.WARNING, logger="gpushare.gitops"):
        _rendered_once_more(remote, work)
    assert ("cloning the work directory" in caplog.text) is cloned, (case, caplog.text)


def test_a_directory_not_marked_as_the_controllers_is_never_removed(remote, tmp_path):
    work = tmp_path / "mine"
    git("clone", "-q", str(remote.path(OTHER)), str(work))  # a person's own clone, of another repository
    (work / "notes.txt").write_text("uncommitted work")
    with pytest.raises(WorkdirInUse) as refused:
        WorkingCopy(remote.url(REPO), "main", work)
    assert "not marked as a gpushare work directory" in refused.value.message
    assert (work / "notes.txt").read_text() == "uncommitted work" and (work / "x").is_file()


def test_an_older_controllers_directory_of_the_same_remote_is_adopted_not_cloned(remote, tmp_path, caplog):
    work = tmp_path / "w"
    publish(WorkingCopy(remote.url(REPO), "main", work), render)
    (work / ".git" / gitops.workdir.MARK).unlink()  # as an older version left it
    with caplog.at_level(logging.WARNING, logger="gpushare.gitops"):
        _rendered_once_more(remote, work)
    assert "cloning" not in caplog.text and (work / ".git" / gitops.workdir.MARK).is_file()


def test_a_stale_lock_is_kept_while_a_git_process_of_another_runs_there_and_it_is_named(remote, tmp_path,
                                                                                        monkeypatch):
    monkeypatch.setattr(gitops.workcopy, "BUSY_GRACE_S", 0.3)
    work = tmp_path / "w"
    wc = WorkingCopy(remote.url(REPO), "main", work)
    publish(wc, render)
    (work / ".git" / "index.lock").write_bytes(b"")
    other = subprocess.Popen(["git", "hash-object", "--stdin"], cwd=work, stdin=subprocess.PIPE,
                             stdout=subprocess.DEVNULL)
    try:
        _wait_until_seen(work, other.pid)
        with pytest.raises(WorkdirBusy) as busy:
            publish(wc, render)
        assert f"pid {other.pid}: git hash-object --stdin" in busy.value.message
        assert "index.lock" in busy.value.message and (work / ".git" / "index.lock").exists()
    finally:
        other.communicate(b"")
    assert publish(wc, render).attempts == 1  # it ended: the next pass removes the lock and goes on


def _wait_until_seen(work: Path, pid: int) -> None:
    deadline = time.monotonic() + 10
    while not os.path.exists(f"/proc/{pid}/cwd") or os.readlink(f"/proc/{pid}/cwd") != str(work):
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_a_lock_is_not_removed_while_this_process_runs_git_there(remote, tmp_path, monkeypatch):
    work = tmp_path / "w"
    wc = WorkingCopy(remote.url(REPO), "main", work)
    (work / ".git" / "index.lock").write_bytes(b"")
    monkeypatch.setattr(gitops.workcopy, "running_in", lambda directory: 1)  # a git of ours is writing it
    wc.recover()
    assert (work / ".git" / "index.lock").exists()


HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(60)
"""


def test_a_second_process_on_the_work_directory_waits_then_is_refused(remote, tmp_path, monkeypatch):
    work = tmp_path / "w"
    work.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(work)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setattr(gitops.workdir, "LOCK_WAIT_S", 0.3)
        started = time.monotonic()
        with pytest.raises(WorkdirBusy) as busy:
            WorkingCopy(remote.url(REPO), "main", work)
        assert time.monotonic() - started >= 0.3
        assert f"another process holds the work directory {work}" in busy.value.message
        assert "its own --workdir" in busy.value.fix
    finally:
        holder.kill()
        holder.wait()
    assert WorkingCopy(remote.url(REPO), "main", work).sync()["main"]  # the kernel let go with the process


def test_copies_in_one_process_share_the_lock_and_the_last_lets_go(remote, tmp_path):
    work = tmp_path / "w"
    first, second = WorkingCopy(remote.url(REPO), "main", work), WorkingCopy(remote.url(REPO), "main", work)
    assert publish(first, render).changed and publish(second, render).commit is None
    fd = os.open(work, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held, for this process's copies
        del first, second
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # both gone: free
    finally:
        os.close(fd)


def test_sync_recovers_as_a_pass_does(remote, tmp_path):
    work = tmp_path / "w"
    wc = WorkingCopy(remote.url(REPO), "main", work)
    wc.sync()
    for name in ("index.lock", "HEAD.lock", "refs/remotes/origin/main.lock", "packed-refs.lock"):
        (work / ".git" / name).write_bytes(b"")
    heads = wc.sync()
    assert heads["main"] == remote.head(REPO) and not list((work / ".git").rglob("*.lock"))


A, B = "a" * 40, "b" * 64  # a SHA-1 and a SHA-256 object id
KEY = "0123456789abcdef" * 4
NOTE = "placed-elsewhere"
# case -> (what the note file holds, or None for none, and what `recall` under KEY gives)
NOTES = {
    "absent": (None, frozenset()),
    "kept-under-this-key": (f"{KEY}\n{A}\n{B}\n", frozenset({A, B})),
    "kept-under-another-key": (f"{'f' * 64}\n{A}\n", frozenset()),
    "empty-under-this-key": (f"{KEY}\n", frozenset()),
    "a-line-that-is-no-object-id": (f"{KEY}\n{A}\nrm -rf /\n", frozenset()),
    "an-id-in-capitals": (f"{KEY}\n{A.upper()}\n", frozenset()),
    "cut-off-mid-line": (f"{KEY}\n{A}\n{B[:30]}", frozenset()),
    "not-ascii": (f"{KEY}\n{A}\n\u00e9\n", frozenset()),
    "over-the-size-limit": (f"{KEY}\n" + f"{A}\n" * (gitops.workdir.NOTE_BYTES // 41 + 1), frozenset()),
}


@pytest.mark.parametrize("case", sorted(NOTES))
def test_a_note_is_read_back_only_whole_and_under_its_own_key(remote, tmp_path, case):
    held, recalled = NOTES[case]
    copy = WorkingCopy(remote.url(REPO), "main", tmp_path / "w")
    if held is not None:
        (tmp_path / "w" / ".git" / gitops.workdir.NOTES).mkdir()
        (tmp_path / "w" / ".git" / gitops.workdir.NOTES / NOTE).write_bytes(held.encode())
    assert copy.remembered(NOTE, KEY) == recalled
    assert WorkingCopy(remote.url(REPO), "main", tmp_path / "w").remembered(NOTE, KEY) == recalled


def test_a_note_outlives_the_process_and_a_new_key_or_a_new_clone_drops_it(remote, tmp_path):
    work = tmp_path / "w"
    WorkingCopy(remote.url(REPO), "main", work).remember(NOTE, KEY, [A, B])
    restarted = WorkingCopy(remote.url(REPO), "main", work)
    assert restarted.remembered(NOTE, KEY) == {A, B}, "a restarted controller reads its note"
    restarted.remember(NOTE, "f" * 64, [B])
    assert WorkingCopy(remote.url(REPO), "main", work).remembered(NOTE, KEY) == frozenset(), "replaced under a new key"
    restarted.reclone("is a test's")
    assert restarted.remembered(NOTE, "f" * 64) == frozenset(), "a directory cloned again starts without notes"
    assert not (work / ".git" / gitops.workdir.NOTES / NOTE).exists()


@pytest.mark.parametrize("name, key", [("../escape", KEY), ("Upper", KEY), ("", KEY), (NOTE, "not-hex"),
                                       (NOTE, KEY + "\nforged")], ids=["a-path", "capitals", "empty-name",
                                                                       "no-hex-key", "a-key-with-a-newline"])
def test_a_note_name_or_key_that_could_leave_its_file_is_refused(remote, tmp_path, name, key):
    copy = WorkingCopy(remote.url(REPO), "main", tmp_path / "w")
    with pytest.raises(ValueError, match="lowercase name and a hex key"):
        copy.remember(name, key, [A])
    assert not (tmp_path / "escape").exists()


def test_a_note_that_cannot_be_written_is_logged_and_the_pass_goes_on(remote, tmp_path, caplog):
    copy = WorkingCopy(remote.url(REPO), "main", tmp_path / "w")
    (tmp_path / "w" / ".git" / gitops.workdir.NOTES).write_text("a file where the notes' folder goes")
    with caplog.at_level(logging.WARNING, logger="gpushare.gitops"):
        copy.remember(NOTE, KEY, [A])
    assert copy.remembered(NOTE, KEY) == {A}, "this process still has it"
    assert f"could not write the note {NOTE}" in caplog.text
    assert WorkingCopy(remote.url(REPO), "main", tmp_path / "w").remembered(NOTE, KEY) == frozenset()
