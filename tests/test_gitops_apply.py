"""Making the owned files on disk equal a Change (gitops.change)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from gitops.errors import UnsafePath
from gitops.git import blob_id
from gitops.change import Change, apply_change, check_change

OWNED = ("decisions/", "rendered/")


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def checkout(root: Path, files: dict[str, bytes]) -> dict[str, tuple[str, str]]:
    """Files on disk as a checkout leaves them, and their index entries."""
    for path, data in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
    return {path: ("100644", blob_id(data)) for path, data in files.items()}


def test_blob_ids_match_git():
    assert blob_id(b"") == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"
    assert blob_id(b"hello\n") == "ce013625030ba8dba906f756967f9e9ca394464a"


def test_owned_files_become_exactly_the_change_and_user_files_stay(tmp_path):
    index = checkout(tmp_path, {"rendered/old/a.yaml": b"old", "rendered/b.yaml": b"b1", "decisions/x.yaml": b"x"})
    checkout(tmp_path, {"models/chat.yaml": b"user"})
    touched = apply_change(tmp_path, Change({"rendered/b.yaml": b"b2", "rendered/new/c.yaml": b"c"}, "m"), index)
    assert tree(tmp_path) == {"models/chat.yaml": b"user", "rendered/b.yaml": b"b2", "rendered/new/c.yaml": b"c"}
    assert sorted(touched) == ["decisions/x.yaml", "rendered/b.yaml", "rendered/new/c.yaml", "rendered/old/a.yaml"]
    assert not (tmp_path / "rendered/old").exists(), "emptied directories are removed"


@pytest.mark.parametrize("keep, survivors", [
    pytest.param(frozenset({"rendered/broken/"}), {"rendered/broken/a.yaml", "rendered/broken/b.yaml"}, id="dir"),
    pytest.param(frozenset({"rendered/broken/a.yaml"}), {"rendered/broken/a.yaml"}, id="file"),
    pytest.param(frozenset(), set(), id="nothing-kept"),
])
def test_kept_files_are_not_pruned(tmp_path, keep, survivors):
    index = checkout(tmp_path, {"rendered/broken/a.yaml": b"a", "rendered/broken/b.yaml": b"b"})
    apply_change(tmp_path, Change({"rendered/good.yaml": b"g"}, "m", keep=keep), index)
    assert set(tree(tmp_path)) == survivors | {"rendered/good.yaml"}


def test_files_whose_blob_is_already_checked_out_are_not_touched(tmp_path):
    index = checkout(tmp_path, {"rendered/a.yaml": b"same", "rendered/b.yaml": b"old"})
    os.utime(tmp_path / "rendered/a.yaml", ns=(1, 1))
    touched = apply_change(tmp_path, Change({"rendered/a.yaml": b"same", "rendered/b.yaml": b"new"}, "m"), index)
    assert touched == ["rendered/b.yaml"]
    assert (tmp_path / "rendered/a.yaml").stat().st_mtime_ns == 1


def test_a_symlinked_owned_directory_is_refused_and_nothing_leaves_the_tree(tmp_path):
    root, outside = tmp_path / "wc", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "rendered").symlink_to(outside)
    with pytest.raises(UnsafePath, match="rendered is a symlink"):
        apply_change(root, Change({"rendered/x.yaml": b"escaped"}, "m"), {})
    assert list(outside.iterdir()) == []


def test_a_symlinked_owned_file_is_replaced_not_followed(tmp_path):
    root, victim = tmp_path / "wc", tmp_path / "victim.txt"
    (root / "rendered").mkdir(parents=True)
    victim.write_bytes(b"untouched")
    (root / "rendered/x.yaml").symlink_to(victim)
    index = {"rendered/x.yaml": ("120000", blob_id(str(victim).encode()))}
    touched = apply_change(root, Change({"rendered/x.yaml": str(victim).encode()}, "m"), index)
    assert touched == ["rendered/x.yaml"], "same bytes as the link target, but a link is not a file"
    assert victim.read_bytes() == b"untouched"
    assert not (root / "rendered/x.yaml").is_symlink()
    assert (root / "rendered/x.yaml").read_bytes() == str(victim).encode()


@pytest.mark.parametrize("change", [
    pytest.param(Change({"rendered/ok.yaml": b"", "models/chat.yaml": b"x"}, "m"), id="unowned-file"),
    pytest.param(Change({"rendered/ok.yaml": b"", "rendered/../../x": b"x"}, "m"), id="escaping-file"),
    pytest.param(Change({"rendered/ok.yaml": b""}, "m", keep=frozenset({"models/"})), id="unowned-keep"),
    pytest.param(Change({"rendered/ok.yaml": b""}, "m", keep=frozenset({"../"})), id="escaping-keep"),
])
def test_a_bad_path_anywhere_refuses_the_whole_change(change):
    with pytest.raises(UnsafePath):
        check_change(change, OWNED)
