"""A cluster's controller reads models/ from git, and reads there what a plain directory holds.

With clusters/, models/ holds every cluster's models, so a cluster's controller leaves it out of its checkout
(controller.inputs.layout.Layout.models_in_git) and reads its files from git's object store (gitops.Checkout:
`files`, `contents`). Each case is one repository, read twice through controller.inputs.reader.read_repo: as a
plain directory (what `gpushare validate` reads) and through the sparse copy of a real remote on 127.0.0.1; the
models and every error (a symlink out of the repository, a loop, a file that is no UTF-8 or too large, broken
YAML) must be the same, and the work tree must hold no models/.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from controller.cli.common import controller_copy
from controller.inputs.layout import Layout
from controller.inputs.reader import ELSEWHERE_NOTE, read_repo
from gitops import Checkout
from tests.gitserver import serving
from tests.sparse_cases import Link, plain_and_served

pytestmark = pytest.mark.integration


def model(name: str, placement: dict | None = None, budget: str = "4Gi") -> bytes:
    spec = {"model": "Qwen/Qwen2.5-0.5B-Instruct", "memoryBudget": budget, **({"placement": placement} if placement
                                                                               else {})}
    return yaml.safe_dump({"apiVersion": "gpushare.dev/v1alpha1", "kind": "ElasticModel",
                           "metadata": {"name": name, "namespace": "llm"}, "spec": spec}).encode()


CLUSTERS = {"clusters/eu-1/gpus.yaml": b"apiVersion: gpushare.dev/v1alpha1\nkind: GPUInventory\nnodes: []\n",
            "clusters/us-1/gpus.yaml": b"apiVersion: gpushare.dev/v1alpha1\nkind: GPUInventory\nnodes: []\n"}
CASES = [  # (case id, the repository's files beside CLUSTERS)
    ("placed-here-elsewhere-and-everywhere", {
        "models/llm/a.yaml": model("a", {"clusters": ["eu-1"]}),
        "models/llm/b.yaml": model("b", {"clusters": ["us-1"]}),
        "models/c.yml": model("c"), "models/README.md": b"not a model\n"}),
    ("broken-models-here-and-elsewhere", {
        "models/llm/bad.yaml": model("bad", budget="lots"), "models/llm/gone.yaml": b"spec: [unclosed\n",
        "models/llm/other.yaml": model("other", {"clusters": ["us-1"]}, budget="lots")}),
    ("a-symlink-to-a-model-in-the-repository", {
        "models/llm/a.yaml": Link("../../common/a.yaml"), "common/a.yaml": model("a")}),
    ("a-symlinked-folder-of-models", {
        "models/team": Link("../teams/one"), "teams/one/a.yaml": model("a"), "teams/one/deeper/b.yaml": model("b")}),
    ("models-itself-a-symlink", {"models": Link("fleet"), "fleet/llm/a.yaml": model("a")}),
    ("a-symlink-out-of-the-repository-and-a-loop", {
        "models/llm/out.yaml": Link("../../../outside.yaml"), "models/llm/abs.yaml": Link("/etc/hostname"),
        "models/llm/loop.yaml": Link("loop.yaml"), "models/llm/a.yaml": model("a")}),
    ("models-a-symlink-out-of-the-repository", {"models": Link("/etc")}),
    ("a-symlinked-folder-out-of-the-repository", {"models/team": Link("/etc"), "models/llm/a.yaml": model("a")}),
    ("a-file-that-is-no-utf8", {"models/llm/a.yaml": b"apiVersion: \xff\n", "models/llm/b.yaml": model("b")}),
    ("a-file-over-the-input-limit", {"models/llm/big.yaml": model("big") + b"#" + b"x" * 3000 + b"\n",
                                     "models/llm/a.yaml": model("a")}),
    ("a-symlink-to-a-folder-named-like-a-model", {"models/llm/a.yaml": Link("../../teams"),
                                                  "teams/b.yaml": model("b")}),
    ("a-dangling-symlink-and-one-through-a-file", {"models/llm/gone.yaml": Link("nothing.yaml"),
                                                    "models/llm/through.yaml": Link("a.yaml/b.yaml"),
                                                    "models/llm/a.yaml": model("a")}),
]


def shown(tree):
    return ({m.ref: (str(m.source), m.budget_bytes) for m in tree.models},
            sorted((e.file, e.document, e.reason, e.path, e.message) for e in tree.inputs.errors))


@pytest.mark.parametrize("case, files", CASES, ids=[c[0] for c in CASES])
def test_the_models_read_from_git_are_the_directorys(tmp_path, monkeypatch, case, files):
    monkeypatch.setenv("GPUSHARE_MAX_INPUT_BYTES", "2048")
    files = {**CLUSTERS, **files}
    with plain_and_served(tmp_path, files, Layout("eu-1")) as (plain, copy, checkout):
        reads = [read_repo(copy.root, generated=checkout.generated, committed=checkout, cluster="eu-1")]
        again = Checkout.at(copy, checkout.commit, checkout.generated)  # the next pass: the copy's note read
        reads.append(read_repo(copy.root, generated=again.generated, committed=again, cluster="eu-1"))
        restarted = controller_copy(copy.url, "main", copy.root, layout=Layout("eu-1"))  # the note from disk
        later = Checkout.at(restarted, restarted.sync()["main"], checkout.generated)
        reads.append(read_repo(restarted.root, generated=later.generated, committed=later, cluster="eu-1"))
    plain_read = shown(read_repo(plain, cluster="eu-1"))
    assert [shown(read) for read in reads] == [plain_read] * 3, "first pass, next pass, restarted process"
    checked_out = Path(copy.root) / "models"
    assert checked_out.is_symlink() or not checked_out.exists(), "models/ is read from git, not checked out"


class Counted(Checkout):
    """A Checkout that notes which paths a read asked the contents of."""

    asked: list

    def contents(self, paths, limit):
        paths = list(paths)
        self.asked.extend(paths)
        return super().contents(paths, limit)


def counted(copy, commit: str, layout: Layout) -> Counted:
    checkout = Counted.at(copy, commit, layout.cluster_generated)
    object.__setattr__(checkout, "asked", [])
    return checkout


def models_asked(checkout: Counted) -> list[str]:
    return sorted(path for path in checkout.asked if path.startswith("models/"))


def inventory(labels: dict) -> bytes:
    return yaml.safe_dump({"apiVersion": "gpushare.dev/v1alpha1", "kind": "GPUInventory", "labels": labels,
                           "nodes": []}).encode()


def test_a_file_placed_elsewhere_is_not_read_again_until_the_clusters_labels_change(tmp_path):
    """The work directory's note spares the next pass every blob placed on other clusters only; a change of any
    cluster's labels (the key of the note) makes the cluster read them again, and a selector may now pick it."""
    files = {"clusters/eu-1/gpus.yaml": inventory({"region": "eu"}),
             "clusters/us-1/gpus.yaml": inventory({"region": "us"}),
             "models/llm/mine.yaml": model("mine", {"clusters": ["eu-1"]}),
             "models/llm/us.yaml": model("us", {"clusterSelector": {"matchLabels": {"region": "us"}}}),
             "models/llm/bad-us.yaml": model("bad-us", {"clusters": ["us-1"]}, budget="lots")}
    layout = Layout("eu-1")
    with serving(tmp_path / "remote", filters=True) as server:
        server.create_repo("fleet.git", files)
        copy = controller_copy(server.url("fleet.git"), "main", tmp_path / "wd", layout=layout)
        head = copy.sync()["main"]
        passes = []
        for _ in range(2):
            checkout = counted(copy, head, layout)
            tree = read_repo(copy.root, generated=checkout.generated, committed=checkout, cluster="eu-1")
            passes.append((sorted(m.name for m in tree.models), models_asked(checkout)))
        assert passes[0] == (["mine"], ["models/llm/bad-us.yaml", "models/llm/mine.yaml", "models/llm/us.yaml"])
        assert passes[1] == (["mine"], ["models/llm/mine.yaml"]), "the others' blobs are in the note"
        note = (copy.root / ".git" / "gpushare-notes" / ELSEWHERE_NOTE).read_text().splitlines()
        assert sorted(note[1:]) == sorted(checkout.blob_ids(["models/llm/us.yaml", "models/llm/bad-us.yaml"]).values())

        server.push_files("fleet.git", {"clusters/eu-1/gpus.yaml": inventory({"region": "us"})},
                          "eu-1 is labelled region=us")
        checkout = counted(copy, copy.sync()["main"], layout)
        tree = read_repo(copy.root, generated=checkout.generated, committed=checkout, cluster="eu-1")
    assert sorted(m.name for m in tree.models) == ["mine", "us"], "the selector now picks eu-1: read again"
    assert models_asked(checkout) == ["models/llm/bad-us.yaml", "models/llm/mine.yaml", "models/llm/us.yaml"]


def test_a_note_kept_by_a_broken_or_other_controller_is_not_trusted(tmp_path):
    files = {**CLUSTERS, "models/llm/a.yaml": model("a", {"clusters": ["eu-1"]}),
             "models/llm/b.yaml": model("b", {"clusters": ["us-1"]})}
    layout = Layout("eu-1")
    with serving(tmp_path / "remote", filters=True) as server:
        server.create_repo("fleet.git", files)
        copy = controller_copy(server.url("fleet.git"), "main", tmp_path / "wd", layout=layout)
        head = copy.sync()["main"]
        ids = Checkout.at(copy, head, layout.cluster_generated).blob_ids(["models/llm/a.yaml"])
        copy.remember(ELSEWHERE_NOTE, "f" * 64, ids.values())  # a's own blob, under a key no code of ours makes
        checkout = counted(copy, head, layout)
        tree = read_repo(copy.root, generated=checkout.generated, committed=checkout, cluster="eu-1")
    assert [m.name for m in tree.models] == ["a"] and models_asked(checkout) == ["models/llm/a.yaml",
                                                                              "models/llm/b.yaml"]
