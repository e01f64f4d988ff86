"""One meaning per flag across commands: one duration syntax on every duration flag, and `--repo` is the GitOps
repository (a URL or a local path) on reconcile and rightsize alike; a replay from a URL leaves no temporary
directory behind."""
from __future__ import annotations

import tempfile

import pytest

from controller.cli.commands import _parser, main
from tests.gitserver import git_server  # noqa: F401  (the fixture)

DURATION_FLAGS = [  # (argv before the flag, flag)
    (["reconcile", "--offline", "--repo", "."], "--interval"),
    (["reconcile", "--offline", "--repo", "."], "--rightsize-interval"),
    (["reconcile", "--offline", "--repo", "."], "--rightsize-window"),
    (["reconcile", "--offline", "--repo", "."], "--rightsize-step"),
    (["rightsize", "--repo", "."], "--window"),
    (["rightsize", "--repo", "."], "--step"),
    (["usage", "export", "--prometheus", "http://p:9090"], "--since"),
    (["usage", "export", "--prometheus", "http://p:9090"], "--step"),
]
SPELLINGS = [("500ms", 0.5), ("30s", 30), ("90", 90), ("5m", 300), ("1.5h", 5400), ("2d", 172800)]


@pytest.mark.parametrize("argv,flag", DURATION_FLAGS, ids=[f"{a[0]}{f}" for a, f in DURATION_FLAGS])
def test_every_duration_flag_takes_the_one_syntax(argv, flag):
    dest = flag.lstrip("-").replace("-", "_")
    for text, seconds in SPELLINGS:
        assert getattr(_parser().parse_args([*argv, flag, text]), dest) == pytest.approx(seconds)
    for bad in ("1w", "-5s", "5 minutes", "0s"):
        with pytest.raises(SystemExit):
            _parser().parse_args([*argv, flag, bad])


@pytest.mark.integration
def test_rightsize_replay_reads_a_repository_url_like_reconcile_and_leaves_no_temporary_directory(
        git_server, tmp_path, monkeypatch, capsys):  # noqa: F811
    from tests.test_rightsizing_pass import USAGE, _fleet, _usage
    from controller.rightsizing.usage import dump_lines
    url = git_server.create_repo("fleet", _fleet(tmp_path))
    usage = tmp_path / "usage.jsonl"
    usage.write_text("".join(dump_lines(_usage(USAGE)(0, 1e12))))
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    assert main(["rightsize", "--repo", url, "--usage", str(usage)]) == 0
    assert "llm/chat-small: policy Recommend" in capsys.readouterr().out
    assert not list(scratch.iterdir())


@pytest.mark.integration
def test_explain_reads_a_repository_url_like_reconcile(git_server, tmp_path, capsys):  # noqa: F811
    from tests.test_rightsizing_pass import _fleet
    url = git_server.create_repo("fleet", _fleet(tmp_path))
    assert main(["explain", "llm/chat-small", "--repo", url]) == 0
    assert "chat-small" in capsys.readouterr().out
