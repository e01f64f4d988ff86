"""Write-back against a real remote: bare repos served by `git daemon` on 127.0.0.1 (gitops.writeback, workcopy)."""
from __future__ import annotations

import functools
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

import gitops.workcopy
import gitops
from gitops import NO_CHANGE, Change, Checkout, WorkingCopy
from gitops.errors import (BranchNotFound, GitUnreachable, PushRejected, PushRetriesExhausted,
                           RevisionNotFound, UnsafePath, WorkdirInUse)
from gitops.git import blob_id
from gitserver import GitServer, git, serving

OWNED = ("decisions/", "rendered/")  # what these tests generate; the controller passes its own layout
publish = functools.partial(gitops.publish, owned=OWNED)

pytestmark = pytest.mark.integration
REPO = "fleet.git"
SEED = {"models/a.yaml": b"model: a\n", "gpus.yaml": b"gpus: []\n", "README.md": b"fleet\n"}


def render_models(checkout: Checkout) -> Change:
    root = checkout.root
    """What the controller would render: one file per model, computed from the checked-out tree."""
    files = {f"rendered/{m.stem}.yaml": b"# from models/" + m.name.encode() + b"\n" + m.read_bytes()
             for m in sorted((root / "models").glob("*.yaml"))}
    return Change(files, f"render {len(files)} models")


def no_sleep(_: float) -> None:
    pass


@pytest.fixture
def remote(tmp_path: Path) -> Iterator[GitServer]:
    with serving(tmp_path / "remote") as server:
        server.create_repo(REPO, SEED)
        yield server


def copy(server: GitServer, tmp_path: Path, name: str = "wc", **kwargs) -> WorkingCopy:
    return WorkingCopy(server.url(REPO), "main", tmp_path / name, **kwargs)


def test_first_publish_commits_and_an_identical_one_commits_nothing(remote, tmp_path):
    before = remote.head(REPO)
    first = publish(copy(remote, tmp_path), render_models)
    assert first.changed and first.attempts == 1 and first.upstream == before
    assert remote.head(REPO) == first.commit
    assert remote.files(REPO) == {**SEED, "rendered/a.yaml": b"# from models/a.yaml\nmodel: a\n"}
    log = git("log", "-1", "--format=%an <%ae>|%P|%B", "main", cwd=remote.path(REPO))
    assert log.strip() == f"gpushare-controller <gpushare@localhost>|{before}|render 1 models"

    again = publish(copy(remote, tmp_path), render_models)
    fresh_clone = publish(copy(remote, tmp_path, "other"), render_models)
    for result in (again, fresh_clone):
        assert (result.commit, result.message, result.attempts) == (None, NO_CHANGE, 1)
    assert remote.head(REPO) == first.commit


def test_the_commit_is_built_in_git_and_the_work_tree_stays_at_upstream(remote, tmp_path):
    wc = copy(remote, tmp_path)
    result = publish(wc, render_models)
    assert git("rev-parse", "HEAD", cwd=wc.root) == result.upstream
    assert git("status", "--porcelain", "--untracked-files=all", cwd=wc.root) == ""
    assert not (wc.root / "rendered").exists(), "generated files reach disk with the next pass's checkout"
    publish(wc, render_models)
    assert (wc.root / "rendered/a.yaml").read_bytes() == b"# from models/a.yaml\nmodel: a\n"


def test_blobs_split_over_several_importers_all_land(remote, tmp_path, monkeypatch):
    monkeypatch.setattr(gitops.workcopy, "_BYTES_PER_IMPORTER", 1)
    monkeypatch.setattr(gitops.workcopy.os, "sched_getaffinity", lambda _pid: {0, 1, 2})
    wc = copy(remote, tmp_path)
    contents = [b"one\n", b"two\n", b"three\n", b"four\n", b""]
    wc.write_blobs({blob_id(data): data for data in contents})
    for data in contents:
        assert git("cat-file", "blob", blob_id(data), cwd=wc.root).encode() == data.strip()


def test_owned_files_not_generated_are_pruned_unless_kept_and_user_files_stay(remote, tmp_path):
    remote.push_files(REPO, {"rendered/gone.yaml": b"stale", "rendered/broken/deploy.yaml": b"last good",
                             "decisions/old.yaml": b"old"}, "earlier output")

    def render(checkout: Checkout) -> Change:
        change = render_models(checkout)
        return Change(change.files, "models changed", keep=frozenset({"rendered/broken/"}))

    publish(copy(remote, tmp_path), render)
    files = remote.files(REPO)
    assert "rendered/gone.yaml" not in files and "decisions/old.yaml" not in files
    assert files["rendered/broken/deploy.yaml"] == b"last good"
    assert {k: files[k] for k in SEED} == SEED


def test_the_loser_of_a_race_re_renders_on_top_and_lands_without_force(remote, tmp_path):
    winner, loser = copy(remote, tmp_path, "winner"), copy(remote, tmp_path, "loser")
    seen, won, user = [], [], []

    def render_while_others_push(checkout: Checkout) -> Change:
        root = checkout.root
        seen.append(sorted(m.name for m in (root / "models").glob("*.yaml")))
        if len(seen) == 1:  # after the loser fetched, before it pushes
            won.append(publish(winner, render_models))
            user.append(remote.push_files(REPO, {"models/b.yaml": b"model: b\n"}, "user adds b"))
        return render_models(checkout)

    start = remote.head(REPO)
    result = publish(loser, render_while_others_push, backoff_s=0, sleep=no_sleep)
    assert result.attempts == 2 and seen == [["a.yaml"], ["a.yaml", "b.yaml"]]
    assert remote.head(REPO) == result.commit
    assert git("rev-parse", f"{result.commit}^", cwd=remote.path(REPO)) == user[0], "built on the new upstream"
    for older in (start, won[0].commit, user[0]):
        assert remote.is_ancestor(REPO, older, result.commit), "linear history, nothing overwritten"
    files = remote.files(REPO)
    assert files["models/b.yaml"] == b"model: b\n", "the user's commit made during the race survives"
    assert files["rendered/b.yaml"] == b"# from models/b.yaml\nmodel: b\n", "re-rendered from the new tree"


def test_races_are_retried_a_bounded_number_of_times(remote, tmp_path):
    calls = []

    def render_always_overtaken(checkout: Checkout) -> Change:
        calls.append(remote.push_files(REPO, {"models/a.yaml": f"rev {len(calls)}\n".encode()}, "user edit"))
        return render_models(checkout)

    with pytest.raises(PushRetriesExhausted) as caught:
        publish(copy(remote, tmp_path), render_always_overtaken, max_attempts=3, backoff_s=0, sleep=no_sleep)
    assert caught.value.reason == "PushRetriesExhausted" and len(calls) == 3
    assert remote.head(REPO) == calls[-1], "the user's last commit stands"


def test_a_push_refused_by_the_remote_is_not_retried(remote, tmp_path):
    hook = remote.path(REPO) / "hooks" / "pre-receive"
    hook.write_text("#!/bin/sh\necho 'main is protected' >&2\nexit 1\n")
    hook.chmod(0o755)
    calls = []

    def render(checkout: Checkout) -> Change:
        calls.append(1)
        return render_models(checkout)

    with pytest.raises(PushRejected, match="pre-receive hook declined"):
        publish(copy(remote, tmp_path), render, backoff_s=0, sleep=no_sleep)
    assert len(calls) == 1


@pytest.mark.parametrize("files, links", [
    pytest.param({"models/a.yaml": b"overwritten"}, {}, id="user-file"),
    pytest.param({"rendered/../models/a.yaml": b"overwritten"}, {}, id="dotdot"),
    pytest.param({"/tmp/gpushare-escape.yaml": b"overwritten"}, {}, id="absolute"),
    pytest.param({"rendered/x.yaml": b"escaped"}, {"rendered": "../wc_outside"}, id="committed-symlink"),
])
def test_unsafe_writes_are_refused_and_change_nothing(remote, tmp_path, files, links):
    if links:
        remote.push_files(REPO, {}, "a user commits a symlink", links=links)
    (tmp_path / "wc_outside").mkdir()
    head = remote.head(REPO)
    wc = copy(remote, tmp_path)
    with pytest.raises(UnsafePath):
        publish(wc, lambda checkout: Change(files, "bad"))
    assert remote.head(REPO) == head
    assert (wc.root / "models/a.yaml").read_bytes() == SEED["models/a.yaml"]
    assert not Path("/tmp/gpushare-escape.yaml").exists()
    assert list((tmp_path / "wc_outside").iterdir()) == []


def test_review_branch_holds_tracked_branch_plus_generated_tree(remote, tmp_path):
    wc, review = copy(remote, tmp_path), "gpushare/plan"
    main = remote.head(REPO)
    first = publish(wc, render_models, target=f"branch:{review}")
    assert first.branch == review and remote.head(REPO, review) == first.commit
    assert remote.head(REPO) == main, "the tracked branch is untouched"
    assert git("rev-parse", f"{first.commit}^", cwd=remote.path(REPO)) == main
    assert publish(wc, render_models, target=f"branch:{review}").commit is None

    user = remote.push_files(REPO, {"models/b.yaml": b"model: b\n"}, "user adds b")
    second = publish(wc, render_models, target=f"branch:{review}")
    parents = git("rev-parse", f"{second.commit}^1", f"{second.commit}^2", cwd=remote.path(REPO)).split()
    assert parents == [first.commit, user], "fast-forward of the review branch, merged with the new base"
    diff = git("diff", "--name-only", "main", review, cwd=remote.path(REPO)).split()
    assert diff == ["rendered/a.yaml", "rendered/b.yaml"], "the PR shows only generated files"

    git("update-ref", "refs/heads/main", second.commit, cwd=remote.path(REPO))  # the PR is merged
    assert publish(wc, render_models, target=f"branch:{review}").commit is None


def test_review_branch_is_not_created_when_nothing_would_change(remote, tmp_path):
    remote.push_files(REPO, {"rendered/a.yaml": b"# from models/a.yaml\nmodel: a\n"}, "already rendered")
    result = publish(copy(remote, tmp_path), render_models, target="branch:gpushare/plan")
    assert result.commit is None and remote.head(REPO, "gpushare/plan") is None


def test_an_unreachable_remote_is_a_typed_error_and_the_next_pass_recovers(remote, tmp_path):
    wc = copy(remote, tmp_path)
    publish(wc, render_models)
    remote.stop()
    remote.push_files(REPO, {"models/b.yaml": b"model: b\n"}, "pushed while the daemon was down")
    with pytest.raises(GitUnreachable) as caught:
        publish(wc, render_models)
    assert caught.value.reason == "GitUnreachable" and "Connection refused" in caught.value.message
    remote.start()
    result = publish(wc, render_models)
    assert result.changed and "rendered/b.yaml" in remote.files(REPO)


def test_a_missing_tracked_branch_is_a_typed_error(remote, tmp_path):
    with pytest.raises(BranchNotFound):
        WorkingCopy(remote.url(REPO), "release", tmp_path / "wc").sync()


def test_a_foreign_non_empty_workdir_is_refused(remote, tmp_path):
    (tmp_path / "wc").mkdir()
    (tmp_path / "wc" / "notes.txt").write_text("mine")
    with pytest.raises(WorkdirInUse):
        copy(remote, tmp_path)


def test_head_contains_checks_ancestry(remote, tmp_path):
    wc = copy(remote, tmp_path)
    decision = publish(wc, render_models).commit
    later = remote.push_files(REPO, {"models/b.yaml": b"model: b\n"}, "later")
    assert wc.head_contains(decision, later), "fetches the revision it has not seen yet"
    assert wc.head_contains(decision, decision)
    assert not wc.head_contains(later, decision)
    for bad in ("0" * 40, "--all"):
        with pytest.raises(RevisionNotFound):
            wc.head_contains(decision, bad)


def test_a_remote_that_never_answers_times_out_as_unreachable(tmp_path):
    with socket.socket() as silent:  # accepts connections (backlog), never speaks
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"git://127.0.0.1:{silent.getsockname()[1]}/{REPO}"
        with pytest.raises(GitUnreachable, match="did not finish within 1 s"):
            WorkingCopy(url, "main", tmp_path / "wc", timeout_s=1).sync()


def test_a_pass_with_no_branch_moved_since_the_previous_one_renders_nothing(remote, tmp_path):
    wc, renders = copy(remote, tmp_path), []

    def counting_render(checkout: Checkout) -> Change:
        renders.append(1)
        return render_models(checkout)

    first = publish(wc, counting_render)
    idle = publish(wc, counting_render, previous=first)
    assert (idle.commit, idle.attempts, len(renders)) == (None, 0, 1)
    remote.push_files(REPO, {"models/b.yaml": b"model: b\n"}, "user adds b")
    moved = publish(wc, counting_render, previous=idle)
    assert moved.changed and len(renders) == 2


def test_generated_files_are_committed_even_where_the_user_ignores_them(remote, tmp_path):
    remote.push_files(REPO, {".gitignore": b"rendered/\n*.yaml\n"}, "user ignores yaml")
    publish(copy(remote, tmp_path), render_models)
    assert "rendered/a.yaml" in remote.files(REPO)


@pytest.mark.parametrize("upstream, generated", [
    pytest.param({"rendered/a/x.yaml": b"x"}, {"rendered/a": b"file now"}, id="directory-becomes-file"),
    pytest.param({"rendered/a": b"file"}, {"rendered/a/x.yaml": b"directory now"}, id="file-becomes-directory"),
])
def test_generated_paths_may_change_between_file_and_directory(remote, tmp_path, upstream, generated):
    remote.push_files(REPO, upstream, "earlier layout")
    publish(copy(remote, tmp_path), lambda checkout: Change(generated, "new layout"))
    assert {k: v for k, v in remote.files(REPO).items() if k.startswith("rendered/")} == generated
