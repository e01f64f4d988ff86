"""git's failure text to typed errors, push porcelain, redaction, the clean environment (gitops.git, credentials)."""
from __future__ import annotations

import os
import shlex

import pytest

from gitops.credentials import Credentials, redact
from gitops.errors import (BranchNotFound, GitAuthFailed, GitCommandFailed, GitLocked, GitUnreachable,
                           PartialCloneRefused, RepoNotFound, WorkdirDamaged)
from gitops.git import MAX_GIT_TEXT, Identity, PushOutcome, classify, clean_env, git_text, parse_push

# git 2.39's text for a lock file that exists (index.lock, a ref's lock, HEAD.lock, ...)
_LOCKED = ("fatal: Unable to create '{path}': File exists.\n\nAnother git process seems to be running in this "
           "repository, e.g.\nan editor opened by 'git commit'. Please make sure all processes\nare terminated then "
           "try again. If it still fails, a git process\nmay have crashed in this repository earlier:\nremove the "
           "file manually to continue.\n")
_READ_REMOTE = ("fatal: Could not read from remote repository.\n\n"
                "Please make sure you have the correct access rights\nand the repository exists.\n")


# stderr as git 2.39 prints it (LC_ALL=C), one real case per row.
@pytest.mark.parametrize("stderr, error", [
    pytest.param("fatal: unable to connect to 127.0.0.1:\n127.0.0.1[0: 127.0.0.1]: errno=Connection refused\n",
                 GitUnreachable, id="daemon-down"),
    pytest.param("fatal: unable to access 'https://git.example.invalid/o/r.git/': Could not resolve host: "
                 "git.example.invalid\n", GitUnreachable, id="dns"),
    pytest.param("fatal: unable to access 'https://h/o/r.git/': Failed to connect to h port 443 after 3 ms: "
                 "Couldn't connect to server\n", GitUnreachable, id="https-refused"),
    pytest.param("fatal: unable to access 'https://h/': SSL certificate problem: self-signed certificate\n",
                 GitUnreachable, id="tls"),
    pytest.param("ssh: connect to host h port 22: Connection timed out\n" + _READ_REMOTE,
                 GitUnreachable, id="ssh-timeout"),
    pytest.param("remote: Invalid username or password.\nfatal: Authentication failed for 'https://h/o/r.git/'\n",
                 GitAuthFailed, id="bad-token"),
    pytest.param("fatal: could not read Username for 'https://h': terminal prompts disabled\n",
                 GitAuthFailed, id="no-credentials"),
    pytest.param("git@h: Permission denied (publickey).\n" + _READ_REMOTE, GitAuthFailed, id="ssh-key-refused"),
    pytest.param("Host key verification failed.\n" + _READ_REMOTE, GitAuthFailed, id="unknown-host-key"),
    pytest.param("remote: Permission to o/r.git denied to bot.\nfatal: unable to access 'https://h/o/r.git/': "
                 "The requested URL returned error: 403\n", GitAuthFailed, id="read-only-token"),
    pytest.param("fatal: '/tmp/nonexist' does not appear to be a git repository\n" + _READ_REMOTE,
                 RepoNotFound, id="local-path-missing"),
    pytest.param("fatal: remote error: access denied or repository not exported: /nope.git\n",
                 RepoNotFound, id="daemon-unknown-repo"),
    pytest.param("remote: Repository not found.\nfatal: repository 'https://h/o/r.git/' not found\n",
                 RepoNotFound, id="https-unknown-repo"),
    pytest.param("fatal: couldn't find remote ref refs/heads/main\n", BranchNotFound, id="missing-branch"),
    pytest.param("fatal: ambiguous argument 'x': unknown revision or path not in the working tree.\n",
                 GitCommandFailed, id="anything-else"),
    pytest.param("fatal: bad object HEAD\n", WorkdirDamaged, id="bad-object"),
    pytest.param("error: bad signature 0x00000000\nfatal: index file corrupt\n", WorkdirDamaged, id="corrupt-index"),
    pytest.param("error: object file .git/objects/4b/825dc642 is empty\nfatal: loose object 4b825dc642 (stored in "
                 ".git/objects/4b/825dc642) is corrupt\n", WorkdirDamaged, id="empty-object"),
    pytest.param("fatal: not a git repository (or any of the parent directories): .git\n", WorkdirDamaged,
                 id="not-a-repository-any-more"),
    pytest.param("error: missing blob 5716ca5987cbf97d6bb54920bea6adde242d87e6\n", WorkdirDamaged, id="missing-blob"),
    pytest.param("error: Server does not allow request for unadvertised object 00750edc07d6415dcc07ae0351e9397b0222b7ba"
                 "\nfatal: could not fetch 00750edc07d6415dcc07ae0351e9397b0222b7ba from promisor remote\n",
                 PartialCloneRefused, id="protocol-v0-refuses-a-lazy-fetch"),
    pytest.param("fatal: remote error: upload-pack: not our ref 00750edc07d6415dcc07ae0351e9397b0222b7ba\n",
                 PartialCloneRefused, id="protocol-v0-refuses-a-want-by-id"),
    pytest.param(_LOCKED.format(path="/w/.git/index.lock"), GitLocked, id="index-lock"),
    pytest.param("error: cannot lock ref 'refs/remotes/origin/main': " + _LOCKED.format(
        path="/w/.git/refs/remotes/origin/main.lock"), GitLocked, id="ref-lock"),
])
def test_failures_are_classified(stderr, error):
    raised = classify("fetch", stderr)
    assert type(raised) is error
    assert raised.reason == error.__name__
    assert raised.message.startswith("git fetch failed: ")
    assert raised.fix


@pytest.mark.parametrize("command,path", [
    ("reset -q --hard 8eb7680", "/w/.git/index.lock"),
    ("fetch -q origin +refs/heads/main:refs/remotes/origin/main", "/w/.git/refs/remotes/origin/main.lock"),
    ("update-ref -d refs/remotes/origin/x", "/w/.git/packed-refs.lock"),
])
def test_a_lock_error_names_the_command_the_file_and_the_fix_in_full(command, path):
    """Issue 34: the message was the tail of git's text ("are terminated then try again..."), never the file."""
    raised = classify(command, _LOCKED.format(path=path))
    assert type(raised) is GitLocked and raised.reason == "GitLocked"
    assert raised.message.startswith(f"git {command} failed: fatal: Unable to create '{path}': File exists.")
    assert "Another git process seems to be running in this repository, e.g. an editor opened by 'git commit'. " \
           "Please make sure all processes are terminated then try again." in raised.message  # one paragraph
    assert "remove the file manually to continue" in raised.message
    assert path in raised.fix and "/w" in raised.fix and "next pass" in raised.fix


@pytest.mark.parametrize("case,stderr", [
    ("many-lines", "".join(f"error: line {i} of git's text\n" for i in range(2000))),
    ("one-long-line", "fatal: " + "x" * 50_000 + " the end\n"),
])
def test_git_text_is_bounded_and_keeps_both_ends(case, stderr):
    text = git_text(stderr)
    assert len(text) <= MAX_GIT_TEXT + 60, case
    assert text.startswith(stderr.splitlines()[0].strip()[:100]), case  # the cause
    assert text.endswith(stderr.splitlines()[-1].strip()[-20:]), case  # git's last word
    assert "characters left out" in text, case


def test_git_text_escapes_control_characters_a_remote_may_send():
    assert git_text("remote: \x1b[31mred\x1b[0m\n") == "remote: \\x1b[31mred\\x1b[0m"


def test_error_message_keeps_git_lines_but_not_hints():
    raised = classify("push", "error: failed to push some refs to 'x'\nhint: Updates were rejected\n")
    assert "failed to push some refs" in str(raised)
    assert "hint" not in str(raised)
    assert "Fix: " in str(raised)


REF = "refs/heads/main"


# `git push --porcelain` stdout as git 2.39 prints it.
@pytest.mark.parametrize("stdout, expected", [
    pytest.param(f"To git://h/r.git\n \tabc:{REF}\t8eb7680..79e3bdf\nDone\n", "pushed", id="fast-forward"),
    pytest.param("To git://h/r.git\n*\tabc:refs/heads/main\t[new branch]\nDone\n", "pushed", id="new-branch"),
    pytest.param(f"To git://h/r.git\n=\tabc:{REF}\t[up to date]\nDone\n", "present", id="up-to-date"),
    pytest.param(f"To git://h/r.git\n!\tabc:{REF}\t[rejected] (fetch first)\nDone\n", "stale", id="fetch-first"),
    pytest.param(f"!\tabc:{REF}\t[rejected] (non-fast-forward)\n", "stale", id="non-fast-forward"),
    pytest.param(f"!\tabc:{REF}\t[remote rejected] (cannot lock ref '{REF}': is at 1 but expected 2)\n",
                 "stale", id="lost-ref-lock"),
    pytest.param(f"!\tabc:{REF}\t[remote rejected] (pre-receive hook declined)\n", "refused", id="hook"),
    pytest.param(f"!\tabc:{REF}\t[remote rejected] (protected branch hook declined)\n", "refused",
                 id="protected-branch"),
])
def test_push_outcomes(stdout, expected):
    outcome = parse_push(stdout, REF)
    assert isinstance(outcome, PushOutcome)
    assert outcome.status == expected


@pytest.mark.parametrize("stdout", [
    pytest.param("", id="nothing"),
    pytest.param("To git://h/r.git\n \tabc:refs/heads/other\t1..2\nDone\n", id="other-ref"),
    pytest.param(" \tabc:refs/heads/main-2\t1..2\n", id="ref-with-same-start"),
])
def test_push_without_a_line_for_the_ref_has_no_outcome(stdout):
    assert parse_push(stdout, REF) is None


@pytest.mark.parametrize("text, secrets, expected", [
    pytest.param("fatal: unable to access 'https://bot:ghp_x@h/r.git/'", (), "fatal: unable to access "
                 "'https://***@h/r.git/'", id="user-and-token"),
    pytest.param("https://ghp_x@h/r.git and ssh://git@h/r.git", (), "https://***@h/r.git and ssh://***@h/r.git",
                 id="every-url"),
    pytest.param("remote: bad token ghp_x", ("ghp_x",), "remote: bad token ***", id="token-value"),
    pytest.param("https://h/path@v1", (), "https://h/path@v1", id="at-sign-in-path-is-not-userinfo"),
])
def test_redaction(text, secrets, expected):
    assert redact(text, secrets) == expected


def test_environment_drops_inherited_git_variables_and_sets_identity(monkeypatch):
    monkeypatch.setenv("GIT_TRACE_CURL", "1")  # would log Authorization headers
    monkeypatch.setenv("GIT_DIR", "/elsewhere")
    monkeypatch.setenv("SSH_ASKPASS", "/usr/bin/prompt")
    env = clean_env(Identity("bot", "bot@example.invalid"), {"GIT_ASKPASS": "/x"})
    assert "GIT_TRACE_CURL" not in env and "GIT_DIR" not in env and "SSH_ASKPASS" not in env
    assert env["GIT_CONFIG_GLOBAL"] == os.devnull and env["GIT_CONFIG_NOSYSTEM"] == "1"
    assert env["GIT_TERMINAL_PROMPT"] == "0"
    assert (env["GIT_AUTHOR_NAME"], env["GIT_COMMITTER_EMAIL"]) == ("bot", "bot@example.invalid")
    assert env["GIT_ASKPASS"] == "/x"


def test_token_reaches_git_only_as_a_file_path(tmp_path):
    token = tmp_path / "token"
    token.write_text("ghp_SECRET\n")
    creds = Credentials(token_file=token, username="bot")
    env = creds.env(tmp_path / "askpass")
    assert env == {"GIT_ASKPASS": str(tmp_path / "askpass"), "GPUSHARE_GIT_TOKEN_FILE": str(token),
                   "GPUSHARE_GIT_USERNAME": "bot"}
    assert creds.secrets() == ("ghp_SECRET",)


def test_ssh_key_is_passed_by_path_with_strict_host_checking(tmp_path):
    key = tmp_path / "my keys" / "id_ed25519"
    hosts = tmp_path / "known_hosts"
    command = shlex.split(Credentials(ssh_key_file=key, known_hosts_file=hosts).env(tmp_path)["GIT_SSH_COMMAND"])
    assert command[:3] == ["ssh", "-F", "/dev/null"]
    assert command[command.index("-i") + 1] == str(key)
    for option in ("IdentitiesOnly=yes", "BatchMode=yes", "StrictHostKeyChecking=yes",
                   f"UserKnownHostsFile={hosts}"):
        assert option in command


def test_missing_credential_file_is_named(tmp_path):
    with pytest.raises(GitAuthFailed, match="token file .*absent-token"):
        Credentials(token_file=tmp_path / "absent-token").check()


@pytest.mark.parametrize("new_files, window", [(0, None), (1000, None), (1001, "0")],
                         ids=["a-usual-pass-keeps-the-delta-search", "at-the-limit-keeps-it", "a-first-render-skips-it"])
def test_a_push_of_many_new_files_skips_the_delta_search(tmp_path, monkeypatch, new_files, window):
    from gitops.git import Result
    from gitops.workcopy import WorkingCopy

    copy = WorkingCopy(str(tmp_path / "remote"), "main", tmp_path / "wc")
    seen = []

    def run(*args, ok_codes=(0,), stdin=None, config=None, env=None):
        seen.append((args[0], (config or {}).get("pack.window")))
        return Result(0, b"To remote\n=\tabc:refs/heads/main\t[up to date]\nDone\n", "")

    monkeypatch.setattr(copy.git, "run", run)
    copy.push("abc", "main", new_files)
    assert seen == [("push", window)]
