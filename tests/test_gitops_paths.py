"""Which paths, branches, targets and remote URLs the write-back accepts (gitops.paths, workcopy, writeback)."""
from __future__ import annotations

from pathlib import Path

import pytest

from gitops.errors import InvalidWriteBack, UnsafePath
from gitops.paths import Prefixes, check_generated, check_no_file_dir_clash, normalize_owned
from gitops.workcopy import check_branch_name, remote_url
from gitops.writeback import Target, parse_target

OWNED = ("decisions/", "rendered/")


@pytest.mark.parametrize("path", [
    "rendered/llm/chat-small/deployment.yaml",
    "rendered/PLAN.md",
    "decisions/llm/chat-small.yaml",
    "rendered/..hidden/x.yaml",   # '..' inside a name is just a name
])
def test_owned_relative_paths_are_accepted(path):
    assert check_generated(path, OWNED) == path


@pytest.mark.parametrize("path, why", [
    pytest.param("/etc/passwd", "absolute", id="absolute"),
    pytest.param("rendered/../models/chat.yaml", "'..' segment", id="dotdot-inside"),
    pytest.param("../outside.yaml", "'..' segment", id="dotdot-leading"),
    pytest.param("rendered/./x.yaml", "'.' segment", id="dot-segment"),
    pytest.param("rendered//x.yaml", "'empty' segment", id="empty-segment"),
    pytest.param("rendered/x/", "'empty' segment", id="trailing-slash"),
    pytest.param("rendered/.git/config", "reaches into .git", id="git-dir"),
    pytest.param("rendered/.GIT/hooks/pre-push", "reaches into .git", id="git-dir-upper-case"),
    pytest.param("rendered\\..\\models\\x", "backslash", id="backslash"),
    pytest.param("rendered/x\0.yaml", "NUL", id="nul-byte"),
    pytest.param("", "empty", id="empty"),
    pytest.param("models/chat.yaml", "not under an owned prefix", id="user-model"),
    pytest.param("gpus.yaml", "not under an owned prefix", id="user-inventory"),
    pytest.param("rendered-evil/x.yaml", "not under an owned prefix", id="prefix-lookalike"),
    pytest.param("rendered", "not under an owned prefix", id="owned-dir-itself"),
])
def test_unsafe_or_unowned_paths_are_refused(path, why):
    with pytest.raises(UnsafePath) as caught:
        check_generated(path, OWNED)
    assert why in caught.value.message
    assert caught.value.reason == "UnsafePath"


@pytest.mark.parametrize("owned", [
    pytest.param([""], id="empty"), pytest.param(["/"], id="root"), pytest.param(["../up/"], id="dotdot"),
    pytest.param([".git/"], id="git-dir"), pytest.param(["/abs/"], id="absolute"), pytest.param([], id="none"),
])
def test_unusable_owned_prefixes_are_refused(owned):
    with pytest.raises(InvalidWriteBack):
        normalize_owned(owned)


def test_owned_prefixes_are_sorted_and_deduplicated():
    assert normalize_owned(["rendered/", "decisions/", "rendered/"]) == ("decisions/", "rendered/")


@pytest.mark.parametrize("path, prefixes, expected", [
    pytest.param("rendered/a/b.yaml", ["rendered/a/"], True, id="inside-dir"),
    pytest.param("rendered/ab.yaml", ["rendered/a/"], False, id="sibling-with-same-start"),
    pytest.param("rendered/a", ["rendered/a"], True, id="exact-file"),
    pytest.param("rendered/a/b", ["rendered/a"], False, id="file-prefix-is-not-a-dir"),
    pytest.param("rendered/x/y.yaml", [f"rendered/{i}/" for i in range(50)] + ["rendered/x/"], True,
                 id="inside-the-last-of-many-dirs"),
    pytest.param("rendered/x", [], False, id="no-prefixes"),
])
def test_prefixes_hold(path, prefixes, expected):
    assert Prefixes(prefixes).holds(path) is expected


def test_a_path_generated_as_file_and_directory_is_refused():
    with pytest.raises(UnsafePath, match="generated as a file too"):
        check_no_file_dir_clash(["rendered/a", "rendered/a/b.yaml"])


@pytest.mark.parametrize("name, ok", [
    ("main", True), ("gpushare/plan", True), ("release-1.2_x", True),
    ("", False), ("-delete", False), ("/abs", False), ("a..b", False), ("a//b", False),
    ("a/.hidden", False), ("x.lock", False), ("a.lock/b", False), ("ends/", False), ("ends.", False),
    ("a b", False), ("a:b", False), ("a@{1}", False), ("a~1", False),
])
def test_branch_names(name, ok):
    if ok:
        assert check_branch_name(name) == name
    else:
        with pytest.raises(InvalidWriteBack):
            check_branch_name(name)


@pytest.mark.parametrize("value, expected", [
    ("direct", Target()), ("branch:gpushare/plan", Target("gpushare/plan")),
    ("pr:gpushare/plan", Target("gpushare/plan", pull_request=True)),
])
def test_write_back_targets(value, expected):
    assert parse_target(value) == expected
    assert str(parse_target(value)) == value


@pytest.mark.parametrize("value", ["", "Direct", "branch:", "branch:-x", "pull:plan", "pr:"])
def test_bad_write_back_targets_are_refused(value):
    with pytest.raises(InvalidWriteBack):
        parse_target(value)


@pytest.mark.parametrize("url", [
    pytest.param("https://ghp_SECRET@git.example.invalid/o/r.git", id="token-as-username"),
    pytest.param("https://bot:ghp_SECRET@git.example.invalid/o/r.git", id="user-and-token"),
    pytest.param("ssh://git:ghp_SECRET@git.example.invalid/o/r.git", id="ssh-password"),
])
def test_credentials_in_urls_are_refused_without_echoing_them(url):
    with pytest.raises(InvalidWriteBack) as caught:
        remote_url(url)
    assert "ghp_SECRET" not in str(caught.value)


@pytest.mark.parametrize("url", [
    pytest.param("ext::sh -c touch% /tmp/pwned", id="ext-runs-a-command"),
    pytest.param("fd::17", id="transport-helper"),
    pytest.param("ftp://git.example.invalid/r.git", id="ftp"),
])
def test_unsupported_transports_are_refused(url):
    with pytest.raises(InvalidWriteBack, match="unsupported transport"):
        remote_url(url)


@pytest.mark.parametrize("url", [
    "ssh://git@git.example.invalid/o/r.git", "git@git.example.invalid:o/r.git",
    "https://git.example.invalid/o/r.git", "git://127.0.0.1:9418/r.git", "file:///srv/r.git",
    "ssh://git@[::1]:2222/r.git",
])
def test_remote_urls_pass_through(url):
    assert remote_url(url) == url


def test_local_paths_become_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert remote_url("fleet.git") == str(tmp_path / "fleet.git")
    assert Path(remote_url("./a/../fleet.git")) == tmp_path / "fleet.git"
