"""The clusters a controller's sparse checkout reads from git are the clusters a plain directory holds.

A cluster's controller checks out its own folder only (controller.inputs.layout.Layout.cone), so it lists
clusters/ and reads every other cluster's gpus.yaml from git (gitops.Checkout: `children`, `kinds`, `read`). Each
case is one repository, read twice through controller.inputs.reader.read_catalog: as a plain directory (what
`gpushare validate` reads) and through the sparse copy of a real remote on 127.0.0.1; the names, labels and errors
must be the same, and the work tree must not hold the other clusters' folders.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from controller.inputs.layout import SINGLE, Layout
from controller.inputs.reader import read_catalog, repository_clusters
from tests.sparse_cases import Link, plain_and_served

pytestmark = pytest.mark.integration


def inventory(labels: str = "") -> bytes:
    return f"apiVersion: gpushare.dev/v1alpha1\nkind: GPUInventory\n{labels}nodes: []\n".encode()


MODEL = b"apiVersion: gpushare.dev/v1alpha1\nkind: ElasticModel\nmetadata: {name: a, namespace: llm}\n"

# (case id, the repository's files, the cluster whose controller reads it: None for the single-cluster layout)
CASES = [
    ("three-clusters-with-labels", {
        "clusters/eu-1/gpus.yaml": inventory("labels: {region: eu, tier: prod}\n"),
        "clusters/us-1/gpus.yaml": inventory("labels: {region: us}\n"),
        "clusters/staging/gpus.yaml": inventory(),
        "clusters/staging/models/llm/a.yaml": MODEL,
    }, "eu-1"),
    ("a-folder-without-its-inventory", {
        "clusters/eu-1/gpus.yaml": inventory(),
        "clusters/us-1/models/llm/a.yaml": MODEL,
    }, "eu-1"),
    ("a-folder-name-that-is-no-cluster-name", {
        "clusters/eu-1/gpus.yaml": inventory(),
        "clusters/US_East/gpus.yaml": inventory(),
    }, "eu-1"),
    ("another-clusters-labels-break-the-rules", {
        "clusters/eu-1/gpus.yaml": inventory(),
        "clusters/us-1/gpus.yaml": inventory("labels: {'bad key!': x}\n"),
    }, "eu-1"),
    ("another-clusters-inventory-is-no-yaml", {
        "clusters/eu-1/gpus.yaml": inventory(),
        "clusters/us-1/gpus.yaml": b"nodes: [unclosed\n",
    }, "eu-1"),
    ("another-clusters-inventory-is-no-utf8", {
        "clusters/eu-1/gpus.yaml": inventory(),
        "clusters/us-1/gpus.yaml": b"labels: {region: \xff}\nnodes: []\n",
    }, "eu-1"),
    ("both-layouts-at-once", {
        "gpus.yaml": inventory(),
        "clusters/eu-1/gpus.yaml": inventory(),
    }, "eu-1"),
    ("clusters-holds-files-and-no-folder", {
        "gpus.yaml": inventory(),
        "clusters/README.md": b"one folder per cluster\n",
    }, None),
    ("clusters-is-a-file", {
        "gpus.yaml": inventory(),
        "clusters": b"not a folder\n",
    }, None),
    ("the-single-cluster-layout", {
        "gpus.yaml": inventory(),
        "models/llm/a.yaml": MODEL,
    }, None),
    ("another-clusters-inventory-is-a-symlink-to-a-file-in-the-repository", {
        "clusters/eu-1/gpus.yaml": inventory(),
        "clusters/us-1/gpus.yaml": Link("../../common/us.yaml"),
        "common/us.yaml": inventory("labels: {region: us}\n"),
    }, "eu-1"),
    ("a-chain-of-symlinks-through-a-linked-folder", {
        "clusters/eu-1/gpus.yaml": inventory(),
        "clusters/us-1/gpus.yaml": Link("../../inventories/current/us.yaml"),
        "inventories/current": Link("v2"),
        "inventories/v2/us.yaml": Link("./../v2/real.yaml"),
        "inventories/v2/real.yaml": inventory("labels: {region: us, generation: '2'}\n"),
    }, "eu-1"),
    ("a-symlink-out-of-the-repository", {
        "clusters/eu-1/gpus.yaml": inventory(),
        "clusters/us-1/gpus.yaml": Link("../../../outside.yaml"),
        "clusters/ap-1/gpus.yaml": Link("/etc/hostname"),
    }, "eu-1"),
    ("a-symlink-loop-and-a-link-to-a-folder", {
        "clusters/eu-1/gpus.yaml": inventory(),
        "clusters/us-1/gpus.yaml": Link("gpus.yaml"),
        "clusters/ap-1/gpus.yaml": Link("../eu-1"),
        "clusters/sa-1/gpus.yaml": Link("../eu-1/gpus.yaml/more"),
    }, "eu-1"),
    ("the-probe-of-every-cluster-through-a-single-layout-copy", {
        "clusters/eu-1/gpus.yaml": inventory("labels: {region: eu}\n"),
        "clusters/us-1/gpus.yaml": inventory("labels: {region: us}\n"),
    }, None),
]


def shown(catalog):
    return None if catalog is None else (catalog.names, {k: None if v is None else dict(v)
                                                         for k, v in catalog.labels.items()}, catalog.errors)


@pytest.mark.parametrize("case, files, cluster", CASES, ids=[c[0] for c in CASES])
def test_the_catalog_read_from_git_is_the_directorys(tmp_path, case, files, cluster):
    layout = SINGLE if cluster is None else Layout(cluster)
    with plain_and_served(tmp_path, files, layout) as (plain, copy, checkout):
        from_git = read_catalog(copy.root, layout, checkout)
    assert shown(from_git) == shown(read_catalog(plain, layout))
    names = repository_clusters(plain)
    assert repository_clusters(copy.root, checkout) == names
    others = [name for name in (names or ()) if name != cluster]
    assert not [name for name in others if (Path(copy.root) / "clusters" / name).exists()], \
        "another cluster's folder is in the work tree"
