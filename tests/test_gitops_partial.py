"""A cluster controller's partial clone against a real git remote (`git daemon` on 127.0.0.1): its new work directory
downloads commits and trees and only the blobs it reads, against a remote that allows filtered fetches (as forges
do); against one that refuses them (a plain daemon) it is a full clone. Either way it commits the same trees. The
single-cluster layout's copy is a full clone, as before.
"""
from __future__ import annotations

import logging
from pathlib import Path

import pytest

import gitops.git

from controller.cli.common import controller_copy
from controller.cli.offline import reconcile_once
from controller.inputs.layout import Layout
from gitops.change import TreeEdit
from gitops.errors import InvalidWriteBack
from tests.conftest import REPO_ROOT
from tests.gitserver import git, serving

pytestmark = pytest.mark.integration

REGIONS = REPO_ROOT / "examples" / "regions"
REPO = "regions.git"
CLUSTERS = ("eu-1", "staging", "us-1")


def _tree() -> dict[str, bytes]:
    return {p.relative_to(REGIONS).as_posix(): p.read_bytes() for p in sorted(REGIONS.rglob("*")) if p.is_file()}


def _missing(root: Path) -> set[str]:
    """The objects HEAD names that the work directory does not hold (listed without fetching them)."""
    listed = git("rev-list", "--objects", "--missing=print", "HEAD", cwd=root).splitlines()
    return {line[1:] for line in listed if line.startswith("?")}


def _paths_of(root: Path, ids: set[str]) -> set[str]:
    listing = git("ls-tree", "-r", "HEAD", cwd=root).splitlines()
    return {line.split("\t", 1)[1] for line in listing if line.split("\t", 1)[0].split(" ")[2] in ids}


def _every_cluster(base: Path, filters: bool, partial: bool | None = None) -> tuple[str, dict[str, Path]]:
    """Each cluster's controller renders in turn in its own new work directory; the remote's final tree. `partial`:
    what each copy is after its first pass (default: a partial clone where the remote filters)."""
    with serving(base / "remote", filters=filters) as server:
        server.create_repo(REPO, _tree())
        copies = {cluster: controller_copy(server.url(REPO), "main", base / f"wd-{cluster}", layout=Layout(cluster))
                  for cluster in CLUSTERS}
        for cluster, copy in copies.items():
            assert reconcile_once(copy, cluster=cluster).published.changed, cluster
            assert copy.partial is (filters if partial is None else partial), f"{cluster}: partial clone or not"
        for cluster, copy in copies.items():  # each fetches the others' trees, and commits nothing
            assert not reconcile_once(copy, cluster=cluster).published.changed, cluster
        return git("rev-parse", "main^{tree}", cwd=server.path(REPO)), {c: copy.root for c, copy in copies.items()}


def test_the_same_trees_are_committed_whether_the_remote_allows_filters_or_not(tmp_path):
    full_tree, _ = _every_cluster(tmp_path / "plain", filters=False)
    partial_tree, _ = _every_cluster(tmp_path / "forge", filters=True)
    assert partial_tree == full_tree


def test_a_partial_work_directory_lacks_only_blobs_of_what_its_cluster_does_not_read(tmp_path):
    _, workdirs = _every_cluster(tmp_path, filters=True)
    root = workdirs["eu-1"]
    missing = _paths_of(root, _missing(root))
    assert any(p.startswith("rendered/us-1/") for p in missing), "another cluster's manifests were downloaded"
    others = tuple(f"{top}/{name}/" for name in CLUSTERS if name != "eu-1" for top in ("rendered", "decisions"))
    others += tuple(f"clusters/{name}/models/" for name in CLUSTERS if name != "eu-1")
    assert all(p.startswith(others) for p in missing), sorted(p for p in missing if not p.startswith(others))
    held = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and ".git" not in p.parts}
    assert held and not held & missing, "a checked-out file whose blob is missing"
    assert git("config", "--get", "remote.origin.promisor", cwd=root) == "true"


def test_against_a_remote_that_refuses_filters_the_copy_is_a_full_clone(tmp_path):
    _, workdirs = _every_cluster(tmp_path, filters=False)
    for cluster, root in workdirs.items():
        assert not _missing(root), cluster
        assert "promisor" not in git("config", "--local", "--list", cwd=root), cluster


def test_the_single_cluster_layout_clones_in_full_even_where_the_remote_filters(tmp_path):
    with serving(tmp_path / "remote", filters=True) as server:
        server.create_repo("fleet.git", {"gpus.yaml": b"nodes: []\n", "models/a.yaml": b"{}\n"})
        copy = controller_copy(server.url("fleet.git"), "main", tmp_path / "wd")
        copy.sync()
        assert not copy.partial and not _missing(copy.root)


def test_a_restarted_controller_fetches_the_records_it_reads_in_one_batch_and_commits_nothing(tmp_path):
    with serving(tmp_path / "remote", filters=True) as server:
        server.create_repo(REPO, _tree())
        url = server.url(REPO)
        layout = Layout("eu-1")
        assert reconcile_once(controller_copy(url, "main", tmp_path / "first", layout=layout),
                              cluster="eu-1").published.changed
        restarted = controller_copy(url, "main", tmp_path / "restarted", layout=layout)
        head = restarted.sync()["main"]
        entries = restarted.entries(head, layout.generated)
        records = sorted(p for p in entries if p.startswith(f"{layout.decisions}/") and p.endswith(".yaml")
                         and not p.startswith(f"{layout.last_good}/"))
        assert records and {entries[p][1] for p in records} <= _missing(restarted.root)
        restarted.prefetch(entries[p][1] for p in records)
        server.stop()  # from here on nothing can be fetched: the one batch brought every record
        read = restarted.read_files(entries, records, 1 << 20)
        assert set(read) == set(records)
        committed = server.files(REPO)
        assert read == {p: committed[p] for p in records}
        server.start()
        again = reconcile_once(restarted, cluster="eu-1")
        assert not again.published.changed, "the restarted controller read its records and found nothing new"


def test_reading_many_missing_records_is_one_fetch_not_one_per_record(tmp_path):
    with serving(tmp_path / "remote", filters=True) as server:
        server.create_repo(REPO, _tree())
        layout = Layout("eu-1")
        assert reconcile_once(controller_copy(server.url(REPO), "main", tmp_path / "first", layout=layout),
                              cluster="eu-1").published.changed
        restarted = controller_copy(server.url(REPO), "main", tmp_path / "restarted", layout=layout)
        head = restarted.sync()["main"]
        git("config", "fetch.unpackLimit", "1", cwd=restarted.root)  # every fetch, git's lazy ones too, keeps a pack
        entries = restarted.entries(head, layout.generated)
        records = [p for p in entries if entries[p][1] in _missing(restarted.root)]
        assert len(records) > 1
        packs = set((restarted.root / ".git" / "objects" / "pack").glob("*.pack"))
        read = restarted.read_files(entries, records, 1 << 20)
        assert set(read) == set(records) and not {entries[p][1] for p in records} & _missing(restarted.root)
        assert len(set((restarted.root / ".git" / "objects" / "pack").glob("*.pack")) - packs) == 1


def test_a_partial_copy_refuses_a_tree_naming_a_blob_it_does_not_hold(tmp_path):
    with serving(tmp_path / "remote", filters=True) as server:
        server.create_repo(REPO, _tree())
        copy = controller_copy(server.url(REPO), "main", tmp_path / "wd", layout=Layout("eu-1"))
        head = copy.sync()["main"]
        assert copy.partial
        with pytest.raises(InvalidWriteBack, match="not in the object store"):
            copy.write_tree(head, TreeEdit(add={"rendered/eu-1/x.yaml": ("100644", "1" * 40)}))


def _fetches_of(copy) -> list[tuple[str, ...]]:
    """The git fetch commands `copy` runs from now on (its Git wrapped)."""
    fetches: list[tuple[str, ...]] = []
    run = copy.git.run

    def counted(*args, **kwargs):
        if args[0] == "fetch":
            fetches.append(args)
        return run(*args, **kwargs)

    copy.git.run = counted
    return fetches


def test_blobs_read_or_written_once_are_never_fetched_again(tmp_path):
    """A re-render on the same upstream reads its records and writes nothing new: it starts no fetch beside the
    pass's own (WorkingCopy keeps the ids of the blobs it fetched or wrote); a second read of records fetched
    once starts none."""
    with serving(tmp_path / "remote", filters=True) as server:
        server.create_repo(REPO, _tree())
        layout = Layout("eu-1")
        copy = controller_copy(server.url(REPO), "main", tmp_path / "wd", layout=layout)
        assert reconcile_once(copy, cluster="eu-1").published.changed
        fetches = _fetches_of(copy)
        again = reconcile_once(copy, cluster="eu-1")
        assert not again.published.changed and again.output is not None, "rendered again, nothing new"
        assert len(fetches) == 1 and "--stdin" not in fetches[0], f"only the pass's own fetch: {fetches}"

        restarted = controller_copy(server.url(REPO), "main", tmp_path / "restarted", layout=layout)
        head = restarted.sync()["main"]
        entries = restarted.entries(head, layout.generated)
        records = [p for p in entries if entries[p][1] in _missing(restarted.root)]
        fetches = _fetches_of(restarted)
        assert records and set(restarted.read_files(entries, records, 1 << 20)) == set(records)
        assert len(fetches) == 1, "one batch for the missing records"
        assert set(restarted.read_files(entries, records, 1 << 20)) == set(records)
        assert len(fetches) == 1, "and none for a second read of them"


def test_a_remote_that_filters_but_refuses_wants_by_id_gets_a_whole_clone_and_the_same_trees(tmp_path, monkeypatch,
                                                                                              caplog):
    """A protocol v0 server (here: every git the controller runs speaks v0) serves the filtered clone, then will not
    send a blob by its id: the checkout's lazy fetch is refused. The pass clones again, whole, and commits the trees
    a v2 remote gets."""
    full_tree, _ = _every_cluster(tmp_path / "v2", filters=True)
    plain_env = gitops.git.clean_env

    def protocol_v0(identity, extra):
        return {**plain_env(identity, extra), "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "protocol.version",
                "GIT_CONFIG_VALUE_0": "0"}

    monkeypatch.setattr(gitops.git, "clean_env", protocol_v0)
    with caplog.at_level(logging.WARNING, logger="gpushare.gitops"):
        tree, roots = _every_cluster(tmp_path / "v0", filters=True, partial=False)
    assert tree == full_tree
    assert all(not _missing(root) for root in roots.values()), "a copy still lacks objects"
    recloned = [r.getMessage() for r in caplog.records if "will not send the objects it lacks" in r.getMessage()]
    assert len(recloned) == len(CLUSTERS), recloned
