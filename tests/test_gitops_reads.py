"""A Change that names what its render read (gitops.Change.reads), against a real remote (`git daemon`).

Several controllers own their own paths of one branch. After a lost race, and in the next pass given the last
result, a Change is landed again without rendering when the commits since touch nothing it read; a commit that
touches what it read is rendered on again. Never forced either way.
"""
from __future__ import annotations

import functools

import pytest

import gitops
from gitops import Change, Checkout, WorkingCopy
from tests.gitserver import serving

pytestmark = pytest.mark.integration
REPO = "fleet.git"
OURS = ("rendered/a/",)
READS = (":(top)", ":(exclude)rendered/b")  # everything but the other writer's tree
publish = functools.partial(gitops.publish, owned=OURS, backoff_s=0, sleep=lambda _: None)


@pytest.fixture
def remote(tmp_path):
    with serving(tmp_path / "remote") as server:
        server.create_repo(REPO, {"models/m.yaml": b"m: 1\n"})
        yield server


def _counting(renders: list, during=None):
    def render(checkout: Checkout) -> Change:
        renders.append(checkout.root)
        if during is not None and len(renders) == 1:
            during()
        model = (checkout.root / "models" / "m.yaml").read_bytes()
        return Change({"rendered/a/m.yaml": b"# rendered\n" + model}, "render a", reads=READS)
    return render


@pytest.mark.parametrize("moved, rendered_again", [
    ({"rendered/b/x.yaml": b"theirs\n"}, False),  # the other writer's tree: nothing read moved
    ({"models/m.yaml": b"m: 2\n"}, True),  # an input
    ({"rendered/a/m.yaml": b"a hand edit\n"}, True),  # our own tree
], ids=["other-tree", "an-input", "our-own-tree"])
def test_a_lost_race_is_rendered_again_only_when_what_it_read_moved(remote, tmp_path, moved, rendered_again):
    renders, pushes = [], []
    start = remote.head(REPO)
    result = publish(WorkingCopy(remote.url(REPO), "main", tmp_path / "w"),
                     _counting(renders, lambda: remote.push_files(REPO, moved, "meanwhile")),
                     before_push=lambda: pushes.append(1))
    assert result.changed and result.attempts == 2 and len(renders) == 1 + rendered_again
    assert len(pushes) == 2, "the guard runs before every push, rendered again or not"
    assert remote.is_ancestor(REPO, start, result.commit), "built on top, never forced"
    files = remote.files(REPO)
    assert files["rendered/a/m.yaml"] == b"# rendered\n" + files["models/m.yaml"]
    for path, data in moved.items():
        if not path.startswith("rendered/a/"):
            assert files[path] == data, "the other commit stands"


def test_the_next_pass_lands_its_last_change_unrendered_after_another_writers_commit(remote, tmp_path):
    copy = WorkingCopy(remote.url(REPO), "main", tmp_path / "w")
    renders = []
    first = publish(copy, _counting(renders))
    remote.push_files(REPO, {"rendered/b/x.yaml": b"theirs\n"}, "the other writer")
    second = publish(copy, _counting(renders), previous=first)
    assert len(renders) == 1 and not second.changed and second.upstream == remote.head(REPO)
    remote.push_files(REPO, {"models/m.yaml": b"m: 3\n"}, "an input moves")
    third = publish(copy, _counting(renders), previous=second)
    assert len(renders) == 2 and third.changed


def test_a_guard_that_raises_before_the_push_lands_nothing(remote, tmp_path):
    class Deposed(Exception):
        pass

    def deposed() -> None:
        raise Deposed()

    start = remote.head(REPO)
    with pytest.raises(Deposed):
        publish(WorkingCopy(remote.url(REPO), "main", tmp_path / "w"), _counting([]), before_push=deposed)
    assert remote.head(REPO) == start


def test_a_change_without_reads_is_rendered_again_as_before(remote, tmp_path):
    copy = WorkingCopy(remote.url(REPO), "main", tmp_path / "w")
    renders = []

    def render(checkout: Checkout) -> Change:
        renders.append(1)
        return Change({"rendered/a/m.yaml": b"x\n"}, "render a")

    first = publish(copy, render)
    remote.push_files(REPO, {"rendered/b/x.yaml": b"theirs\n"}, "the other writer")
    publish(copy, render, previous=first)
    assert len(renders) == 2


def test_a_cluster_review_branch_blocked_by_the_old_single_cluster_one_says_so_at_once(remote, tmp_path):
    from gitops.errors import PushRejected

    copy = WorkingCopy(remote.url(REPO), "main", tmp_path / "w")
    publish(copy, lambda checkout: Change({"rendered/a/m.yaml": b"x\n"}, "render a"), target="branch:gpushare/review")
    with pytest.raises(PushRejected, match="'gpushare/review'") as caught:
        publish(copy, lambda checkout: Change({"rendered/a/m.yaml": b"y\n"}, "render a"),
                target="branch:gpushare/review/eu-1")
    assert "delete the branch 'gpushare/review'" in caught.value.fix


def test_a_work_tree_already_at_the_commit_is_not_reset_unless_something_changed_in_it(remote, tmp_path):
    copy = WorkingCopy(remote.url(REPO), "main", tmp_path / "w")
    head = copy.sync()["main"]
    ran = []
    run = copy.git.run

    def spy(*args, **kwargs):
        ran.append(args[0])
        return run(*args, **kwargs)

    copy.git.run = spy
    copy.checkout(head)
    assert "reset" not in ran, "the same commit, nothing changed: nothing to rewrite"
    (copy.root / "models" / "m.yaml").write_text("edited\n")
    (copy.root / "stray.yaml").write_text("untracked\n")
    copy.checkout(head)
    assert "reset" in ran and (copy.root / "models" / "m.yaml").read_text() == "m: 1\n"
    assert not (copy.root / "stray.yaml").exists()


def test_a_work_directory_cloned_again_is_checked_out_again(remote, tmp_path):
    copy = WorkingCopy(remote.url(REPO), "main", tmp_path / "w")
    head = copy.sync()["main"]
    copy.reclone("is damaged (the test says so)")
    copy.fetch()
    copy.checkout(head)
    assert (copy.root / "models" / "m.yaml").read_text() == "m: 1\n", "the new clone holds the commit's files"
