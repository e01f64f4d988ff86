"""Many clusters against a real git remote (`git daemon` on 127.0.0.1): one controller per cluster, one branch.

`gpushare reconcile --offline` reconciles a three-cluster repository (examples/regions) end to end; each
cluster's commit touches its own paths only. Several controllers, one per cluster, pushing at the same
moment never lose or overwrite each other's commits: the losers land their change again on top (without
rendering again: another cluster's commit touches nothing they read), never forced, and history stays linear.
A cluster whose controller is down keeps its own tree as it was while the others go on. Review branches are
per cluster. In cluster mode a controller reads its own Argo CD Application and writes its own paths.
"""
from __future__ import annotations

import threading
from pathlib import Path

import pytest
import yaml

from controller.cli.commands import main
from controller.cli.common import controller_copy
from controller.cli.offline import reconcile_once
from controller.inputs.layout import Layout
from controller.inputs.reader import read_repo, repository_clusters
from gitops import Checkout
from tests.conftest import REPO_ROOT
from tests.gitserver import git, both_git_servers  # noqa: F401  (the fixture)


@pytest.fixture
def git_server(both_git_servers):  # noqa: F811
    """Each test against a remote that refuses filtered fetches and one that allows them (a partial clone)."""
    return both_git_servers

pytestmark = pytest.mark.integration

REGIONS = REPO_ROOT / "examples" / "regions"
REPO = "regions.git"
CLUSTERS = ("eu-1", "staging", "us-1")


def _tree(extra_clusters: tuple[str, ...] = ()) -> dict[str, bytes]:
    files = {p.relative_to(REGIONS).as_posix(): p.read_bytes() for p in sorted(REGIONS.rglob("*")) if p.is_file()}
    for name in extra_clusters:  # more staging-like clusters: chat-small runs there (it has no placement)
        files[f"clusters/{name}/gpus.yaml"] = files["clusters/staging/gpus.yaml"].replace(
            b"staging-l4-1", f"{name}-l4-1".encode())
    return files


def _touched(server, commit: str) -> set[str]:
    return set(git("diff-tree", "--no-commit-id", "--name-only", "-r", commit, cwd=server.path(REPO)).split())


def _generated(files: dict[str, bytes], cluster: str) -> dict[str, bytes]:
    return {p: b for p, b in files.items() if p.startswith(Layout(cluster).generated)}


def _linear(server, head: str) -> list[str]:
    """The commits up to `head`, newest first, each with exactly one parent but the root (no merge, no rewrite)."""
    lines = git("rev-list", "--parents", head, cwd=server.path(REPO)).splitlines()
    assert all(len(line.split()) == 2 for line in lines[:-1]), "a merge commit"
    return [line.split()[0] for line in lines]


def test_reconcile_offline_reconciles_three_clusters_each_on_its_own_paths(git_server, tmp_path, capsys):  # noqa: F811
    git_server.create_repo(REPO, _tree())
    seed = git_server.head(REPO)
    url = git_server.url(REPO)
    assert main(["reconcile", "--offline", "--repo", url, "--workdir", str(tmp_path / "wd")]) == 0
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if line.startswith("== cluster")] == [
        f"== cluster {c} ==" for c in CLUSTERS]
    commits = _linear(git_server, git_server.head(REPO))
    assert commits[3:] == [seed], "one commit per cluster on top of the user's"
    for commit, cluster in zip(reversed(commits[:3]), CLUSTERS):
        assert all(p.startswith(Layout(cluster).generated) for p in _touched(git_server, commit)), cluster
        subject = git("log", "-1", "--format=%s", commit, cwd=git_server.path(REPO))
        assert subject.startswith(f"gpushare({cluster}): "), subject
    files = git_server.files(REPO)
    assert {c: {p.split("/elasticmodel-")[1].removesuffix(".yaml") for p in files
                if p.startswith(f"rendered/{c}/") and "/elasticmodel-" in p} for c in CLUSTERS} == {
        "eu-1": {"assistant-8b", "chat-small", "analyst-70b"}, "staging": {"chat-canary", "chat-small", "summarizer"},
        "us-1": {"assistant-8b", "chat-small", "coder-32b", "summarizer"}}
    assert all(f"rendered/{c}/PLAN.md" in files for c in CLUSTERS)
    assert not any(p.startswith(("rendered/PLAN.md", "decisions/llm/")) for p in files), "no single-cluster path"

    assert main(["reconcile", "--offline", "--repo", url, "--workdir", str(tmp_path / "wd")]) == 0
    assert git_server.head(REPO) == commits[0], "a second run over the same inputs commits nothing"
    assert out.count("committed ") == 3


def test_controllers_of_five_clusters_pushing_at_once_lose_nothing_and_never_force(git_server, tmp_path):  # noqa: F811
    clusters = ("ap-1", "ap-2", *CLUSTERS)
    git_server.create_repo(REPO, _tree(("ap-1", "ap-2")))
    seed = git_server.head(REPO)
    url = git_server.url(REPO)
    pushing = threading.Barrier(len(clusters), timeout=120)
    renders: dict[str, int] = {c: 0 for c in clusters}
    results, failures = {}, []

    def controller(cluster: str) -> None:
        def progress(phase: str) -> None:
            if phase.startswith("reading"):
                renders[cluster] += 1
            if phase.startswith("planned") and renders[cluster] == 1:
                pushing.wait()  # every controller rendered on the same upstream: now all push at once
        try:
            copy = controller_copy(url, "main", tmp_path / cluster, layout=Layout(cluster))
            results[cluster] = reconcile_once(copy, progress=progress, cluster=cluster)
        except Exception as exc:  # noqa: BLE001 - reported below with its cluster
            failures.append((cluster, exc))

    threads = [threading.Thread(target=controller, args=(c,)) for c in clusters]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not failures, failures
    head = git_server.head(REPO)
    history = _linear(git_server, head)
    assert history[-1] == seed and len(history) == 1 + len(clusters), "one commit per controller, linear"
    for cluster, result in results.items():
        assert result.published.changed and result.published.commit in history, cluster
        assert _touched(git_server, result.published.commit) <= set(_generated(git_server.files(REPO), cluster))
    assert sum(r.published.attempts > 1 for r in results.values()) >= 1, "the pushes did race"
    assert renders == {c: 1 for c in clusters}, "a lost race lands the same change again, unrendered"

    # every cluster's files are the ones a controller alone would commit: a fresh remote, one cluster at a time
    git_server.create_repo("alone.git", _tree(("ap-1", "ap-2")))
    for cluster in sorted(clusters):
        copy = controller_copy(git_server.url("alone.git"), "main", tmp_path / f"alone-{cluster}",
                               layout=Layout(cluster))
        reconcile_once(copy, cluster=cluster)
    raced, alone = git_server.files(REPO), git_server.files("alone.git")
    for cluster in clusters:
        ours, theirs = _generated(raced, cluster), _generated(alone, cluster)
        assert ours.keys() == theirs.keys(), cluster
        assert {p for p in ours if ours[p] != theirs[p]} == set(), cluster


def test_a_cluster_whose_controller_is_down_keeps_its_tree_while_the_others_go_on(git_server, tmp_path):  # noqa: F811
    git_server.create_repo(REPO, _tree())
    url = git_server.url(REPO)
    copies = {c: controller_copy(url, "main", tmp_path / c, layout=Layout(c)) for c in CLUSTERS}
    last = {c: reconcile_once(copies[c], cluster=c).published for c in CLUSTERS}
    before = git_server.files(REPO)
    chat = before["models/llm/chat.yaml"].replace(b"clusters: [us-1, staging]", b"clusters: [eu-1, staging]")
    git_server.push_files(REPO, {"models/llm/chat.yaml": chat}, "summarizer: from us-1 to eu-1")
    for cluster in ("eu-1", "us-1"):  # staging's controller is down
        result = reconcile_once(copies[cluster], previous=last[cluster], cluster=cluster)
        assert result.published.changed, cluster
    after = git_server.files(REPO)
    assert "rendered/eu-1/llm/elasticmodel-summarizer.yaml" in after
    assert "rendered/us-1/llm/elasticmodel-summarizer.yaml" not in after
    assert _generated(after, "staging") == _generated(before, "staging"), "the down cluster's state is held"
    assert not any(p.startswith("decisions/us-1/") and "summarizer" in p for p in after)

    # staging comes back: the model change touched what it reads (models/), so it renders, and plans the same
    back = reconcile_once(copies["staging"], previous=last["staging"], cluster="staging")
    assert back.output is not None and not back.published.changed

    # another cluster's commits alone touch nothing staging reads: its last change stands, nothing is rendered
    git_server.push_files(REPO, {"rendered/eu-1/PLAN.md": None}, "someone deletes eu-1's PLAN.md")
    restored = reconcile_once(copies["eu-1"], cluster="eu-1")
    assert restored.published.changed and "rendered/eu-1/PLAN.md" in git_server.files(REPO)
    again = reconcile_once(copies["staging"], previous=back.published, cluster="staging")
    assert again.output is None and not again.published.changed
    assert again.published.upstream == git_server.head(REPO)

    # a user file every pass reads (outside every cluster's tree) is rendered again
    git_server.push_files(REPO, {"README.md": b"regions\n"}, "docs")
    assert reconcile_once(copies["staging"], previous=again.published, cluster="staging").output is not None


def test_review_branches_are_per_cluster_and_the_tracked_branch_is_never_written(git_server, tmp_path):  # noqa: F811
    git_server.create_repo(REPO, _tree())
    seed = git_server.head(REPO)
    url = git_server.url(REPO)
    assert main(["reconcile", "--offline", "--repo", url, "--workdir", str(tmp_path / "wd"),
                 "--write-back", "branch:gpushare/review"]) == 0
    assert git_server.head(REPO) == seed
    for cluster in CLUSTERS:
        branch = f"gpushare/review/{cluster}"
        head = git_server.head(REPO, branch)
        assert head is not None, branch
        changed = set(git("diff", "--name-only", seed, head, cwd=git_server.path(REPO)).split())
        assert changed and all(p.startswith(Layout(cluster).generated) for p in changed), cluster
    assert main(["reconcile", "--offline", "--repo", url, "--workdir", str(tmp_path / "wd2"), "--cluster", "us-1",
                 "--write-back", "branch:gpushare/review"]) == 0
    assert git_server.head(REPO, "gpushare/review") is None


def test_a_cluster_asked_for_in_a_single_cluster_repository_is_refused(git_server, tmp_path, capsys):  # noqa: F811
    files = {p.relative_to(REPO_ROOT / "examples/fleet").as_posix(): p.read_bytes()
             for p in (REPO_ROOT / "examples/fleet").rglob("*") if p.is_file()}
    git_server.create_repo(REPO, files)
    seed = git_server.head(REPO)
    assert main(["reconcile", "--offline", "--repo", git_server.url(REPO), "--workdir", str(tmp_path / "wd"),
                 "--cluster", "eu-1"]) == 2
    assert "[UnknownCluster]" in capsys.readouterr().err and git_server.head(REPO) == seed


def test_the_sparse_work_tree_of_a_cluster_holds_its_own_folder_and_reads_the_rest_from_git(git_server, tmp_path):  # noqa: F811
    git_server.create_repo(REPO, _tree())
    url = git_server.url(REPO)
    for cluster in CLUSTERS:
        reconcile_once(controller_copy(url, "main", tmp_path / cluster, layout=Layout(cluster)), cluster=cluster)
    layout = Layout("eu-1")
    copy = controller_copy(url, "main", tmp_path / "eu-1", layout=layout)
    head = copy.sync()["main"]
    held = {p.relative_to(copy.root).as_posix() for p in copy.root.rglob("*") if p.is_file() and ".git" not in p.parts}
    assert "clusters/eu-1/gpus.yaml" in held
    assert "clusters/us-1/gpus.yaml" not in held and "clusters/staging/models/llm/canary.yaml" not in held, \
        "another cluster's folder"
    assert not any(p.startswith(("rendered/", "decisions/us-1", "decisions/staging")) for p in held)
    assert any(p.startswith("decisions/eu-1/_last-good/") for p in held)
    entries = copy.entries(head, layout.cluster_generated)
    assert entries and all(p.startswith(layout.cluster_generated) for p in entries)
    assert yaml.safe_load((copy.root / "clusters/eu-1/gpus.yaml").read_text())["labels"]["region"] == "eu"

    checkout = Checkout.at(copy, head, layout.cluster_generated)
    tree = read_repo(checkout.root, generated=checkout.generated, committed=checkout, cluster="eu-1")
    assert tree.clusters == CLUSTERS, "every cluster, listed from git"
    assert tree.last.plan_md == git_server.files(REPO)["rendered/eu-1/PLAN.md"].decode(), "its PLAN.md, from git"
    assert repository_clusters(copy.root, checkout) == CLUSTERS
    assert repository_clusters(copy.root) == ("eu-1",), "the work tree alone holds its own folder only"


def test_the_work_directories_of_two_clusters_never_collide(tmp_path):
    from controller.cli.common import default_workdir

    assert len({default_workdir("git://h/r.git", "main", c) for c in (None, "eu-1", "us-1")}) == 3
    assert isinstance(default_workdir("r", "main"), Path)
