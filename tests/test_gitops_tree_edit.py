"""WorkingCopy.write_tree (one fast-import tree edit on top of a commit) against git's own index: for each edit,
the tree equals the one `read-tree` + `update-index --index-info` + `write-tree` build from the same commit, paths
git must quote (spaces, quotes, backslashes, newlines, non-ASCII) included, and only the edited trees are written.
"""
from __future__ import annotations

import os
import subprocess

import pytest

from gitops import WorkingCopy
from gitops.change import TreeEdit
from gitops.git import blob_id
from tests.gitserver import git, git_server  # noqa: F401  (the fixture)

pytestmark = pytest.mark.integration

UPSTREAM = {
    "models/a.yaml": b"kind: ElasticModel\n",
    "rendered/team-a/deployment-x.yaml": b"x: 1\n",
    "rendered/team-a/configmap-x.yaml": b"y: 2\n",
    "rendered/team-b/only.yaml": b"z: 3\n",
    "rendered/plain": b"a file where a folder may come\n",
    "decisions/team-a/x.yaml": b"record\n",
}
ODD = ("rendered/a b/c d.yaml", 'rendered/"quoted"/x.yaml', "rendered/back\\slash.yaml", "rendered/new\nline.yaml",
       "rendered/tab\there.yaml", "rendered/ünïcødé/名前.yaml", '"rendered/leading-quote.yaml')

# (case id, paths to remove, paths to add with their content and mode)
CASES = [
    ("adds-in-new-folders", (), {"rendered/team-c/deployment-y.yaml": b"new\n", "decisions/team-c/y.yaml": b"r\n"}),
    ("replaces-a-file", (), {"rendered/team-a/deployment-x.yaml": b"x: 2\n"}),
    ("removes-the-last-file-of-a-folder", ("rendered/team-b/only.yaml",), {}),
    ("removes-and-adds-in-one-folder", ("rendered/team-a/configmap-x.yaml",), {"rendered/team-a/new.yaml": b"n\n"}),
    ("a-file-becomes-a-folder", ("rendered/plain",), {"rendered/plain/inside.yaml": b"i\n"}),
    ("an-executable", (), {"rendered/team-a/run.sh": (b"#!/bin/sh\n", "100755")}),
    ("paths-git-must-quote", (), {path: path.encode() for path in ODD}),
    ("removing-paths-git-must-quote", ODD[:3], {}),
]


def _oracle(root, commit: str, edit: TreeEdit) -> str:
    """The tree git's own index builds for `edit` on top of `commit`."""
    env = {**os.environ, "GIT_INDEX_FILE": str(root / ".git" / "oracle-index"), "GIT_CONFIG_GLOBAL": os.devnull,
           "GIT_CONFIG_NOSYSTEM": "1"}
    lines = [f"0 {'0' * 40}\t{path}" for path in edit.remove] + [f"{mode} {blob}\t{path}"
                                                                 for path, (mode, blob) in edit.add.items()]
    for args, stdin in ((["read-tree", commit], None), (["update-index", "-z", "--index-info"],
                                                        "\0".join(lines).encode() + b"\0"), (["write-tree"], None)):
        done = subprocess.run(["git", "-C", str(root), *args], env=env, input=stdin, capture_output=True, check=True)
    return done.stdout.decode().strip()


@pytest.fixture
def copy(git_server, tmp_path):  # noqa: F811
    files = {**UPSTREAM, **{path: b"odd\n" for path in ODD[:3]}}
    git_server.create_repo("edit", files)
    copy = WorkingCopy(git_server.url("edit"), "main", tmp_path / "wd")
    copy.sync()
    return copy


@pytest.mark.parametrize("remove,add", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_tree_edit_builds_the_tree_git_s_index_builds(copy, remove, add):
    contents = {path: value if isinstance(value, tuple) else (value, "100644") for path, value in add.items()}
    edit = TreeEdit(remove=remove, add={path: (mode, blob_id(data)) for path, (data, mode) in contents.items()},
                    blobs={blob_id(data): data for data, _ in contents.values()})
    head = copy.git.text("rev-parse", "HEAD")
    tree = copy.write_tree(head, edit)
    assert tree == _oracle(copy.root, head, edit)
    listed = set(git("ls-tree", "-r", "-z", "--name-only", tree, cwd=copy.root).split("\0")) - {""}
    assert set(add) <= listed and not set(remove) & listed
    assert copy.git.text("rev-parse", "HEAD") == head, "the work tree's HEAD is not moved"
