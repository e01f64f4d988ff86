"""gitops.workcopy.cone_patterns: the folders a controller's copy checks out, as git's cone-mode patterns.

Table-driven: each case's folders and the patterns `git sparse-checkout set --cone` writes for them; git itself
must read them back as cone patterns (`git sparse-checkout list` prints the folders, with no warning that it fell
back to pattern matching). Folders git would read as patterns are refused.
"""
from __future__ import annotations

import subprocess

import pytest

from controller.inputs.layout import SINGLE, Layout
from gitops.errors import InvalidWriteBack
from gitops.workcopy import cone_patterns

# (case id, folders, the patterns)
CASES = [
    ("one-top-folder", ["models"], ("/*", "!/*/", "/models/")),
    ("a-nested-folder-opens-its-parents-for-their-own-files", ["decisions/eu-1/_last-good"],
     ("/*", "!/*/", "/decisions/", "!/decisions/*/", "/decisions/eu-1/", "!/decisions/eu-1/*/",
      "/decisions/eu-1/_last-good/")),
    ("two-folders-under-one-parent", ["decisions/_last-good", "decisions/rightsizing"],
     ("/*", "!/*/", "/decisions/", "!/decisions/*/", "/decisions/_last-good/", "/decisions/rightsizing/")),
    ("a-folder-inside-another-is-the-outer-one", ["profiles", "profiles/measured/eu-1"],
     ("/*", "!/*/", "/profiles/")),
    ("a-parent-that-is-wanted-whole", ["clusters", "clusters/eu-1/models"], ("/*", "!/*/", "/clusters/")),
    ("slashes-around-are-dropped-and-repeats-once", ["/models/", "models"], ("/*", "!/*/", "/models/")),
    ("no-folder-the-top-files-only", [], ("/*", "!/*/")),
]


@pytest.mark.parametrize("case, folders, patterns", CASES, ids=[c[0] for c in CASES])
def test_the_cone_patterns_of_each_set_of_folders(case, folders, patterns):
    assert cone_patterns(folders) == patterns


@pytest.mark.parametrize("layout", [SINGLE, Layout("eu-1")], ids=["single-cluster", "cluster-eu-1"])
def test_git_reads_the_layouts_patterns_as_cone_patterns(tmp_path, layout):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    for key, value in (("core.sparseCheckout", "true"), ("core.sparseCheckoutCone", "true")):
        subprocess.run(["git", "-C", str(tmp_path), "config", key, value], check=True)
    (tmp_path / ".git" / "info").mkdir(exist_ok=True)
    (tmp_path / ".git" / "info" / "sparse-checkout").write_text("".join(f"{p}\n" for p in cone_patterns(layout.cone)))
    listed = subprocess.run(["git", "-C", str(tmp_path), "sparse-checkout", "list"], check=True, capture_output=True,
                            text=True)
    assert not listed.stderr, listed.stderr
    assert sorted(listed.stdout.split()) == sorted(layout.cone)


@pytest.mark.parametrize("folder", ["models/*", "a?b", "[ab]", "a\\b", "!models", "#x", "a\nb", "", "/", "a/../b",
                                    "./models", "a//b"],
                         ids=["star", "question-mark", "brackets", "backslash", "bang", "hash", "newline", "empty",
                              "root", "dot-dot", "dot", "empty-segment"])
def test_a_folder_git_would_read_as_a_pattern_is_refused(folder):
    with pytest.raises(InvalidWriteBack, match="no plain repository folder"):
        cone_patterns([folder])
