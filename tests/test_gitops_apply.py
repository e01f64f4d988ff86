"""Planning the tree edit that makes upstream's owned paths equal a Change (gitops.change)."""
from __future__ import annotations

import pytest

from gitops.change import SYMLINK, Change, TreeEdit, check_change, plan_edit
from gitops.errors import UnsafePath
from gitops.git import blob_id

OWNED = ("decisions/", "rendered/")


def regular(files: dict[str, bytes]) -> dict[str, tuple[str, str]]:
    """Upstream entries for regular files, as `git ls-tree -r` lists them."""
    return {path: ("100644", blob_id(data)) for path, data in files.items()}


def result(upstream: dict[str, tuple[str, str]], edit: TreeEdit) -> dict[str, tuple[str, str]]:
    """Upstream's entries with the edit applied, as the new tree holds them."""
    return {**{p: e for p, e in upstream.items() if p not in edit.remove}, **edit.add}


def test_blob_ids_match_git():
    assert blob_id(b"") == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"
    assert blob_id(b"hello\n") == "ce013625030ba8dba906f756967f9e9ca394464a"
    assert blob_id(b"", "sha256") == "473a0f4c3be8a93681a267e3b1e9a7dcda1185436fe141f7749120a303721813"


def test_owned_files_become_exactly_the_change_and_user_files_stay():
    upstream = regular({"rendered/old/a.yaml": b"old", "rendered/b.yaml": b"b1", "decisions/x.yaml": b"x",
                        "models/chat.yaml": b"user"})
    change = Change({"rendered/b.yaml": b"b2", "rendered/new/c.yaml": b"c"}, "m")
    edit = plan_edit(change, upstream, OWNED)
    assert sorted(edit.remove) == ["decisions/x.yaml", "rendered/old/a.yaml"]
    assert result(upstream, edit) == {"models/chat.yaml": upstream["models/chat.yaml"],
                                      "rendered/b.yaml": ("100644", blob_id(b"b2")),
                                      "rendered/new/c.yaml": ("100644", blob_id(b"c"))}
    assert edit.blobs == {blob_id(b"b2"): b"b2", blob_id(b"c"): b"c"}


@pytest.mark.parametrize("keep, survivors", [
    pytest.param(frozenset({"rendered/broken/"}), {"rendered/broken/a", "rendered/broken/b"}, id="dir"),
    pytest.param(frozenset({"rendered/broken/a"}), {"rendered/broken/a"}, id="file"),
    pytest.param(frozenset(), set(), id="nothing-kept"),
])
def test_kept_files_are_not_pruned(keep, survivors):
    upstream = regular({"rendered/broken/a": b"a", "rendered/broken/b": b"b"})
    edit = plan_edit(Change({"rendered/good": b"g"}, "m", keep=keep), upstream, OWNED)
    assert set(result(upstream, edit)) == survivors | {"rendered/good"}


@pytest.mark.parametrize("upstream_mode, added", [
    pytest.param("100644", None, id="same-blob-is-not-touched"),
    pytest.param("100755", None, id="same-blob-keeps-its-executable-bit"),
    pytest.param("120000", ("100644", blob_id(b"same")), id="a-symlink-with-those-bytes-becomes-a-file"),
    pytest.param("160000", ("100644", blob_id(b"same")), id="a-submodule-there-becomes-a-file"),
])
def test_a_generated_file_already_upstream_is_left_as_it_is(upstream_mode, added):
    upstream = {"rendered/a": (upstream_mode, blob_id(b"same"))}
    edit = plan_edit(Change({"rendered/a": b"same"}, "m"), upstream, OWNED)
    assert edit.add.get("rendered/a") == added and edit.remove == ()
    assert edit.empty is (added is None)
    assert edit.blobs == ({} if added is None else {blob_id(b"same"): b"same"})


def test_new_content_keeps_an_executable_file_executable():
    edit = plan_edit(Change({"rendered/run.sh": b"v2"}, "m"), {"rendered/run.sh": ("100755", blob_id(b"v1"))},
                     OWNED)
    assert edit.add == {"rendered/run.sh": ("100755", blob_id(b"v2"))}


def test_identical_contents_are_written_once():
    edit = plan_edit(Change({"rendered/a": b"same", "rendered/b": b"same"}, "m"), {}, OWNED)
    assert edit.blobs == {blob_id(b"same"): b"same"} and len(edit.add) == 2


def test_blob_ids_follow_the_repository_object_format():
    edit = plan_edit(Change({"rendered/a": b"x"}, "m"), {}, OWNED, "sha256")
    assert edit.add == {"rendered/a": ("100644", blob_id(b"x", "sha256"))}


@pytest.mark.parametrize("upstream, generated", [
    pytest.param({"rendered/a/x.yaml": b"x"}, {"rendered/a": b"file now"}, id="directory-becomes-file"),
    pytest.param({"rendered/a": b"file"}, {"rendered/a/x.yaml": b"directory now"}, id="file-becomes-directory"),
])
def test_owned_paths_may_change_between_file_and_directory(upstream, generated):
    edit = plan_edit(Change(generated, "new layout"), regular(upstream), OWNED)
    assert result(regular(upstream), edit) == regular(generated)


# Each row: upstream entries (path -> mode), the Change, and what the refusal names.
@pytest.mark.parametrize("upstream, change, why", [
    pytest.param({"rendered": SYMLINK}, Change({"rendered/x.yaml": b""}, "m"),
                 "rendered is a symlink", id="owned-prefix-is-a-symlink"),
    pytest.param({"rendered/sub": SYMLINK},
                 Change({"rendered/sub/x.yaml": b""}, "m", keep=frozenset({"rendered/sub"})),
                 "rendered/sub is a symlink", id="kept-symlink-on-the-way"),
    pytest.param({"profiles": SYMLINK}, Change({"profiles/measured/x.yaml": b""}, "m"),
                 "profiles is a symlink", id="symlink-above-the-owned-prefix"),
    pytest.param({"profiles": "100644"}, Change({"profiles/measured/x.yaml": b""}, "m"),
                 "profiles is a kept or user file in the way", id="user-file-above-the-owned-prefix"),
    pytest.param({"rendered/a": "100644"},
                 Change({"rendered/a/x.yaml": b""}, "m", keep=frozenset({"rendered/a"})),
                 "rendered/a is a kept or user file", id="kept-file-on-the-way"),
    pytest.param({"rendered/a/kept.yaml": "100644"},
                 Change({"rendered/a": b""}, "m", keep=frozenset({"rendered/a/"})),
                 "a directory with kept files is in the way", id="kept-directory-in-the-way"),
])
def test_writes_through_symlinks_or_over_kept_and_user_files_are_refused(upstream, change, why):
    owned = (*OWNED, "profiles/measured/")
    with pytest.raises(UnsafePath, match=why):
        plan_edit(change, {path: (mode, blob_id(path.encode())) for path, mode in upstream.items()}, owned)


def test_an_owned_symlink_that_is_neither_generated_nor_kept_is_replaced_by_a_directory():
    upstream = {"rendered/sub": (SYMLINK, blob_id(b"/etc"))}
    edit = plan_edit(Change({"rendered/sub/x.yaml": b"x"}, "m"), upstream, OWNED)
    assert edit.remove == ("rendered/sub",) and set(edit.add) == {"rendered/sub/x.yaml"}


@pytest.mark.parametrize("change", [
    pytest.param(Change({"rendered/ok.yaml": b"", "models/chat.yaml": b"x"}, "m"), id="unowned-file"),
    pytest.param(Change({"rendered/ok.yaml": b"", "rendered/../../x": b"x"}, "m"), id="escaping-file"),
    pytest.param(Change({"rendered/ok.yaml": b""}, "m", keep=frozenset({"models/"})), id="unowned-keep"),
    pytest.param(Change({"rendered/ok.yaml": b""}, "m", keep=frozenset({"../"})), id="escaping-keep"),
])
def test_a_bad_path_anywhere_refuses_the_whole_change(change):
    with pytest.raises(UnsafePath):
        check_change(change, OWNED)
