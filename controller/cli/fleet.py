"""The whole repository or one cluster: which clusters a command plans, and what their passes say once.

Owns what `validate`, `plan`, `explain` and `reconcile --offline` share when a repository has clusters/
(controller.inputs.layout): the clusters a command runs over (`--cluster NAME`, else every cluster; the one
implicit cluster, None, of a repository without clusters/), the pass over each (controller.cli.offline.pass_over,
as a reconcile runs it) and their errors without repeats (a broken model file is every cluster's error once).
Called by controller.cli.commands and controller.cli.reconcile_cmd.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from controller.cli.offline import pass_over
from controller.inputs.clusters import cluster_name_problem
from controller.inputs.reader import check_cluster, read_catalog
from controller.passes.reconcile import PassOutput
from controller.types import InputError


def cluster_name(text: str) -> str:
    """A cluster's name (the --cluster flag): a DNS-1123 label, its folder under clusters/."""
    problem = cluster_name_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(f"{text!r} cannot name a cluster: {problem}")
    return text


def chosen_clusters(root: Path, cluster: str | None) -> tuple[str | None, ...]:
    """The clusters a command over `root` plans: (None,) without clusters/ (then `cluster` must be None), else
    `cluster` alone or every cluster in name order (none when clusters/ holds none); ClusterNotFound otherwise."""
    catalog = read_catalog(root)
    if cluster is not None or catalog is None:
        check_cluster(catalog, cluster)
        return (cluster,)
    return catalog.names


def passes(root: Path, cluster: str | None, processes: int = 1) -> dict[str | None, PassOutput]:
    """The pass over each chosen cluster (chosen_clusters), by cluster."""
    return {name: pass_over(root, processes=processes, cluster=name) for name in chosen_clusters(root, cluster)}


def repository_errors(root: Path) -> tuple[InputError, ...]:
    """The errors of clusters/ itself (its folders, a gpus.yaml beside it): what a repository whose clusters/ holds
    no usable cluster reports, with no pass to report them."""
    catalog = read_catalog(root)
    return catalog.errors if catalog is not None else ()


def distinct(errors: list[InputError]) -> tuple[InputError, ...]:
    """`errors` in order, each once (every cluster's pass reports a broken model file)."""
    return tuple(dict.fromkeys(errors))
