"""The controller's sparse working copy against a real remote served on 127.0.0.1.

gitops.WorkingCopy(cone=...) with the controller's folders (controller.inputs.layout.CONE, through
controller.cli.common.controller_copy) checks out what a pass reads as files and nothing else, with a sparse
index (a folder left out is one entry of git's index); the render is handed
every generated path from git (gitops.Checkout.generated), so a manifest that is not checked out is still
pruned, kept or left as it is, and the prune guard counts the whole tree. An existing full work directory
becomes sparse at its next pass, and back.
"""
from __future__ import annotations

import functools
import subprocess
from pathlib import Path

import pytest

import gitops
from controller.cli.common import controller_copy
from controller.cli.offline import reconcile_once
from controller.inputs.layout import GENERATED
from controller.inputs.reader import read_repo
from controller.inputs.repofiles import owned_files
from gitops import Change, Checkout, WorkingCopy
from gitops.errors import UnsafePath
from tests.gitserver import both_git_servers, serving  # noqa: F401  (the fixture)


@pytest.fixture
def git_server(both_git_servers):  # noqa: F811
    """Each test against a remote that refuses filtered fetches and one that allows them (a partial clone)."""
    return both_git_servers

pytestmark = pytest.mark.integration
publish = functools.partial(gitops.publish, owned=GENERATED)
REPO = "fleet"
FLEET = Path(__file__).resolve().parent.parent / "examples" / "fleet"
WORKER = "rendered/gpushare-system/deployment-worker-n-gpu0-default.yaml"
SERVICE = "rendered/llm/service-chat.yaml"
TREE = {
    "models/llm/chat.yaml": b"kind: ElasticModel\n",
    "gpus.yaml": b"nodes: []\n",
    "README.md": b"fleet\n",
    "profiles/NVIDIA-H200/x.yaml": b"profile\n",
    "profiles/measured/NVIDIA-H200/x.yaml": b"measured\n",
    "compositions/mine.yaml": b"composition\n",
    "apps/argocd.yaml": b"an Application\n",
    "decisions/llm/chat.yaml": b"decision\n",
    "decisions/_last-good/gpus.yaml": b"nodes: []\n",
    "decisions/_last-good/_owners.yaml": b"{}\n",
    "decisions/_last-good/models/llm/chat.yaml": b"kind: ElasticModel\n",
    "decisions/rightsizing/llm/chat.yaml": b"record\n",
    "rendered/PLAN.md": b"# plan\n",
    WORKER: b"worker\n",
    "rendered/gpushare-system/configmap-worker-n-gpu0-default.yaml": b"config\n",
    "rendered/gpushare-system/networkpolicy-worker-n-gpu0-default.yaml": b"policy\n",
    "rendered/gpushare-system/role-worker-n-gpu0-default.yaml": b"role\n",
    SERVICE: b"service\n",
    "rendered/llm/namespace-llm.yaml": b"namespace\n",
    "rendered/llm/nested/deployment-deep.yaml": b"deeper than a worker\n",
}
NOT_CHECKED_OUT = {"decisions/llm/chat.yaml", WORKER,  # a decision record, a worker's files: read from git
                   "rendered/PLAN.md",  # read from git too: the rendered tree is never checked out
                   "apps/argocd.yaml",  # a folder of the user's that no pass reads
                   "rendered/gpushare-system/configmap-worker-n-gpu0-default.yaml",
                   "rendered/gpushare-system/networkpolicy-worker-n-gpu0-default.yaml",
                   "rendered/gpushare-system/role-worker-n-gpu0-default.yaml", SERVICE,
                   "rendered/llm/namespace-llm.yaml", "rendered/llm/nested/deployment-deep.yaml"}


def work_tree(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")
            if ".git" not in p.relative_to(root).parts and (p.is_file() or p.is_symlink())}


@pytest.fixture
def remote(git_server):  # noqa: F811
    git_server.create_repo(REPO, TREE)
    return git_server


@pytest.fixture(scope="module")
def synced(tmp_path_factory) -> Path:
    """One sparse checkout of TREE, shared by the cases that only look at it."""
    base = tmp_path_factory.mktemp("sparse")
    with serving(base / "remotes") as server:
        server.create_repo(REPO, TREE)
        copy = controller_copy(server.url(REPO), "main", base / "wc")
        copy.sync()
        yield copy.root


@pytest.mark.parametrize("path", sorted(TREE), ids=lambda p: p.replace("/", "|"))
def test_the_work_tree_holds_what_a_pass_reads(synced, path):
    on_disk = work_tree(synced)
    assert (path in on_disk) == (path not in NOT_CHECKED_OUT)
    if path in on_disk:
        assert (synced / path).read_bytes() == TREE[path]


def test_the_render_is_given_every_generated_path_from_git(remote, tmp_path):
    seen: list[Checkout] = []

    def render(checkout: Checkout) -> Change:
        seen.append(checkout)
        return Change({}, "nothing", keep=frozenset(checkout.generated))

    result = publish(controller_copy(remote.url(REPO), "main", tmp_path / "wc"), render)
    assert not result.changed
    (checkout,) = seen
    assert checkout.generated == tuple(sorted(p for p in TREE if p.startswith(GENERATED)))
    tree = read_repo(checkout.root, generated=checkout.generated, committed=checkout)
    assert tree.last.paths == tuple(sorted(p for p in TREE if p.startswith(("decisions/", "rendered/"))))
    assert set(tree.last.workers) == {WORKER, "rendered/gpushare-system/configmap-worker-n-gpu0-default.yaml"}
    assert [p.path for p in tree.rightsizing.problems] == ["decisions/rightsizing/llm/chat.yaml"], \
        "the record under decisions/rightsizing/ is read (and found garbled)"
    assert tree.last.plan_md == TREE["rendered/PLAN.md"].decode(), "PLAN.md is read from git"


def test_the_index_holds_one_entry_for_each_folder_left_out(synced):
    """git's sparse index: the rendered tree and a user's folder no pass reads are one entry each, not one per
    file (what keeps a cluster's reset and clean from growing with the other clusters' trees)."""
    listed = subprocess.run(["git", "-C", str(synced), "ls-files", "--sparse"], check=True, capture_output=True,
                            text=True).stdout.splitlines()
    assert {"rendered/", "apps/"} <= set(listed)
    assert not [path for path in listed if path.startswith(("rendered/", "apps/")) and not path.endswith("/")]
    assert "models/llm/chat.yaml" in listed and "decisions/_last-good/_owners.yaml" in listed


# (case id, the generated files, kept prefixes, what the branch holds at SERVICE afterwards (None: removed),
#  whether a commit is made)
CASES = [
    ("regenerated-unchanged-is-left", {SERVICE: TREE[SERVICE]}, frozenset(), TREE[SERVICE], False),
    ("regenerated-changed-is-replaced", {SERVICE: b"service v2\n"}, frozenset(), b"service v2\n", True),
    ("not-generated-is-pruned", {}, frozenset(), None, True),
    ("kept-by-prefix-stays", {}, frozenset({"rendered/llm/"}), TREE[SERVICE], False),
    ("kept-by-path-stays", {}, frozenset({SERVICE}), TREE[SERVICE], False),
]


@pytest.mark.parametrize("case, files, keep, after, commits", CASES, ids=[c[0] for c in CASES])
def test_a_manifest_not_checked_out_is_pruned_kept_or_left_as_in_a_full_checkout(remote, tmp_path, case, files,
                                                                                   keep, after, commits):
    """Everything else generated is regenerated as it is, so only SERVICE's fate differs; the sparse copy and a
    full one make the same tree."""
    others = {p: d for p, d in TREE.items() if p.startswith(GENERATED) and p != SERVICE}
    trees = []
    for name, sparse in (("sparse", True), ("full", False)):
        remote.create_repo(f"{name}.git", TREE)
        url = remote.url(f"{name}.git")
        copy = controller_copy(url, "main", tmp_path / name) if sparse else WorkingCopy(url, "main", tmp_path / name)
        result = publish(copy, lambda checkout: Change({**others, **files}, case, keep=keep))
        assert result.changed == commits
        held = remote.files(f"{name}.git")
        assert held.get(SERVICE) == after
        assert {p: d for p, d in held.items() if p != SERVICE} == {p: d for p, d in TREE.items() if p != SERVICE}
        trees.append(copy.tree_of(remote.head(f"{name}.git")))
    assert trees[0] == trees[1], "the sparse copy commits the tree the full one does"


def test_nothing_is_written_through_a_symlink_that_is_not_checked_out(remote, tmp_path):
    remote.push_files(REPO, {}, "a link where a directory of manifests goes", links={"rendered/team": "/tmp"})
    copy = controller_copy(remote.url(REPO), "main", tmp_path / "wc")
    with pytest.raises(UnsafePath, match="symlink"):
        publish(copy, lambda checkout: Change({"rendered/team/service-x.yaml": b"x"}, "through a link",
                                              keep=frozenset({"rendered/team"})))


def test_an_existing_full_checkout_becomes_sparse_at_its_next_checkout_and_back(remote, tmp_path):
    workdir = tmp_path / "wc"
    full = WorkingCopy(remote.url(REPO), "main", workdir)
    full.sync()
    assert work_tree(workdir) == set(TREE)
    (workdir / SERVICE).write_bytes(b"edited by hand")  # a local change the next checkout discards

    sparse = controller_copy(remote.url(REPO), "main", workdir)
    head = sparse.sync()["main"]
    assert work_tree(workdir) == set(TREE) - NOT_CHECKED_OUT
    assert sorted(sparse.entries(head, GENERATED)) == sorted(p for p in TREE if p.startswith(GENERATED))

    again = WorkingCopy(remote.url(REPO), "main", workdir)
    again.sync()
    assert work_tree(workdir) == set(TREE)
    assert (workdir / SERVICE).read_bytes() == TREE[SERVICE]


def test_the_prune_guard_counts_the_whole_tree_not_the_work_tree(git_server, tmp_path):  # noqa: F811
    """The example fleet reconciled by a sparse copy; then gpus.yaml is deleted: the guard holds the pass and
    counts every rendered object upstream holds, as a full checkout lists them."""
    files = {p.relative_to(FLEET).as_posix(): p.read_bytes() for p in FLEET.rglob("*") if p.is_file()}
    git_server.create_repo(REPO, files)
    copy = controller_copy(git_server.url(REPO), "main", tmp_path / "controller")
    first = reconcile_once(copy)
    assert first.published.changed and not first.output.errors
    full = WorkingCopy(git_server.url(REPO), "main", tmp_path / "full")
    full.sync()
    objects = [p for p in owned_files(full.root, GENERATED) if p.startswith("rendered/") and p != "rendered/PLAN.md"]
    assert len(work_tree(copy.root) & set(objects)) < len(objects), "some rendered objects are not checked out"

    git_server.push_files(REPO, {"gpus.yaml": None}, "the inventory is deleted")
    held = reconcile_once(copy)

    assert held.hold is not None and not held.published.changed
    assert held.hold.before == len(objects)


def test_the_decision_records_are_read_from_git_as_a_full_checkout_reads_them(git_server, tmp_path):  # noqa: F811
    """The example fleet reconciled once; a restarted controller (a fresh sparse copy) holds no decision record
    in its work tree, reads each from git, and re-renders nothing new, as a full checkout of the same commit."""
    files = {p.relative_to(FLEET).as_posix(): p.read_bytes() for p in FLEET.rglob("*") if p.is_file()}
    git_server.create_repo(REPO, files)
    assert reconcile_once(controller_copy(git_server.url(REPO), "main", tmp_path / "first")).published.changed
    seen: list = []

    def render(checkout: Checkout) -> Change:
        seen.append(read_repo(checkout.root, generated=checkout.generated, committed=checkout).last.records)
        return Change({}, "nothing", keep=frozenset(checkout.generated))

    restarted = controller_copy(git_server.url(REPO), "main", tmp_path / "restarted")
    publish(restarted, render)
    full = WorkingCopy(git_server.url(REPO), "main", tmp_path / "full")
    full.sync()
    expected = read_repo(full.root).last.records
    assert expected and seen == [expected]
    assert not [p for p in work_tree(restarted.root) if p.startswith("decisions/") and p.count("/") == 2
                and not p.startswith("decisions/_last-good/")], "no decision record in the work tree"
    assert not reconcile_once(restarted).published.changed  # the same decisions: nothing new


def test_committed_files_beyond_the_size_limit_or_not_files_are_left_out(remote, tmp_path):
    copy = controller_copy(remote.url(REPO), "main", tmp_path / "wc")
    heads = copy.sync()
    entries = copy.entries(heads["main"], GENERATED)
    read = copy.read_files(entries, ["decisions/llm/chat.yaml", "rendered/PLAN.md", "decisions/absent.yaml"], 8)
    assert read == {"rendered/PLAN.md": b"# plan\n"}  # the record has 9 bytes, over the limit of 8
    assert copy.read_files(entries, ["decisions/llm/chat.yaml"], 9) == {"decisions/llm/chat.yaml": b"decision\n"}
