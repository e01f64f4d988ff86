"""The GitOps repository's layout: which paths the user owns and which the controller generates, per cluster.

One place for every folder name. The user owns `models/`, `gpus.yaml` (or, for several clusters,
`clusters/<name>/gpus.yaml`), `profiles/` (estimated or hand-made profiles) and `compositions/`; the
controller owns `rendered/` (manifests and PLAN.md), `decisions/` and, in cluster mode,
`profiles/measured/`; under `decisions/_last-good/` it keeps the last copy of each input file that
parsed cleanly (what a pass reads while that file is broken) and each model's generated paths (kept
while the model fails to render). The reader (controller.inputs.reader) reads the user's paths; the
shells hand a `Layout`'s `generated` (or `cluster_generated`) prefixes to gitops, which writes nothing
outside the prefixes it is given. `cone` names the folders the controller's own working copy checks
out: what a pass reads as files (the user's folders, the last good copies, the right-sizing records; never
the rendered manifests, PLAN.md or the decision records, which it reads from git).

A repository without `clusters/` is one implicit cluster whose paths are the ones above (`SINGLE`, the
module constants). With `clusters/<name>/gpus.yaml`, each cluster is planned on its own (`Layout(name)`):
its generated tree is `rendered/<name>/`, `decisions/<name>/` and `profiles/measured/<name>/`, paths no
other cluster's controller writes, so controllers of several clusters never edit one file. Models that run in
one cluster only may live in `clusters/<name>/models/`, which no other cluster's controller reads or checks
out: a controller's reading grows with its own cluster, not with the number of clusters.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

MODELS_DIR = "models"
PROFILES_DIR = "profiles"
COMPOSITIONS_DIR = "compositions"
CLUSTERS_DIR = "clusters"  # clusters/<name>/gpus.yaml: one folder per cluster (the many-cluster layout)
INVENTORY_FILE = "gpus.yaml"
RENDERED_DIR = "rendered"
DECISIONS_DIR = "decisions"
MEASURED_PROFILES_DIR = f"{PROFILES_DIR}/measured"
PLAN_FILE = "PLAN.md"
LAST_GOOD = "_last-good"  # the last good copy of each input file; `_` is no namespace and no cluster name
RIGHTSIZING = "rightsizing"
OWNERS_NAME = "_owners.yaml"
WORKER_FILES = ("deployment-", "configmap-")  # rendered/<namespace>/<prefix>*: a worker's files a pass reads back


@dataclass(frozen=True)
class Layout:
    """Where one cluster's files are. `cluster` None: the single-cluster layout (no `clusters/` folder), whose
    paths are today's top-level ones; a name: that cluster of the many-cluster layout."""

    cluster: str | None = None

    def _own(self, top: str) -> str:
        return top if self.cluster is None else f"{top}/{self.cluster}"

    @property
    def rendered(self) -> str:
        return self._own(RENDERED_DIR)

    @property
    def decisions(self) -> str:
        return self._own(DECISIONS_DIR)

    @property
    def measured(self) -> str:
        """Where the cluster's controller commits the profiles its profiler Jobs measured."""
        return self._own(MEASURED_PROFILES_DIR)

    @property
    def models(self) -> tuple[str, ...]:
        """The folders of the ElasticModels this cluster reads: models/, and its own clusters/<name>/models/."""
        return (MODELS_DIR,) if self.cluster is None else (MODELS_DIR, self.own_models)

    @property
    def folder(self) -> str:
        """clusters/<name>: the cluster's own folder (its gpus.yaml and its own models)."""
        return f"{CLUSTERS_DIR}/{self.cluster}"

    @property
    def own_models(self) -> str:
        """clusters/<name>/models/: the models of this cluster alone."""
        return f"{self.folder}/{MODELS_DIR}"

    @property
    def inventory(self) -> str:
        return INVENTORY_FILE if self.cluster is None else f"{self.folder}/{INVENTORY_FILE}"

    @property
    def plan_md(self) -> str:
        return f"{self.rendered}/{PLAN_FILE}"

    @property
    def last_good(self) -> str:
        return f"{self.decisions}/{LAST_GOOD}"

    @property
    def owners(self) -> str:
        """Each model's generated paths after the last pass."""
        return f"{self.last_good}/{OWNERS_NAME}"

    @property
    def rightsizing(self) -> str:
        """Right-sizing records: written by the right-sizing pass, kept by the others."""
        return f"{self.decisions}/{RIGHTSIZING}"

    @property
    def generated(self) -> tuple[str, str]:
        return (f"{self.decisions}/", f"{self.rendered}/")

    @property
    def cluster_generated(self) -> tuple[str, str, str]:
        return (*self.generated, f"{self.measured}/")

    @property
    def cone(self) -> tuple[str, ...]:
        """The folders the controller's working copy checks out (gitops.WorkingCopy's cone-mode sparse checkout:
        the files at the top of the tree and every file under these): what a pass reads as files, the user's
        folders, the cluster's own folder, its last good copies and its right-sizing records. The rest a pass reads
        from git (gitops.Checkout: the decision records, the workers' Deployments and ConfigMaps, PLAN.md and, with
        clusters, every cluster's gpus.yaml) and lists every generated path from git (gitops.Checkout.generated): a
        restarted controller writes the user's files and little else, and git's index holds one entry for each
        folder left out (another cluster's tree is one entry, not thousands)."""
        own = (self.folder,) if self.cluster is not None else ()
        models = () if self.models_in_git else (MODELS_DIR,)
        return (*models, PROFILES_DIR, COMPOSITIONS_DIR, *own, self.last_good, self.rightsizing)

    @property
    def models_in_git(self) -> bool:
        """Whether the controller reads models/ from git (gitops.Checkout) and leaves it out of its checkout: with
        clusters/, where models/ holds the models of every cluster and a cluster's controller reads most of its
        files only to see that they are placed elsewhere (writing a file costs more than reading it from git's
        object store, and a cluster's own models are in its own folder, which it checks out)."""
        return self.cluster is not None

    def reads(self, clusters: Iterable[str]) -> tuple[str, ...] | None:
        """git pathspecs of everything a pass of this cluster reads (gitops.Change.reads), given the repository's
        `clusters`: the whole tree but the other clusters' rendered and decisions trees and own models; None in the
        single-cluster layout (a pass there reads what any commit may change)."""
        if self.cluster is None:
            return None
        others = sorted(set(clusters) - {self.cluster})
        return (":(top)", *(f":(exclude){top}" for name in others for top in (
            f"{RENDERED_DIR}/{name}", f"{DECISIONS_DIR}/{name}", f"{CLUSTERS_DIR}/{name}/{MODELS_DIR}")))

    def branch(self, name: str) -> str:
        """A review branch of this cluster: `name` itself in the single-cluster layout, `name/<cluster>` otherwise,
        so two clusters' reviews never write one branch."""
        return name if self.cluster is None else f"{name}/{self.cluster}"

    @property
    def label(self) -> str:
        """How messages name the cluster: `cluster eu-1`, or `the cluster` in the single-cluster layout."""
        return "the cluster" if self.cluster is None else f"cluster {self.cluster}"


SINGLE = Layout()  # the single-cluster layout: a repository without clusters/

PLAN_MD = SINGLE.plan_md
LAST_GOOD_DIR = SINGLE.last_good
OWNERS_FILE = SINGLE.owners
RIGHTSIZING_DIR = SINGLE.rightsizing
GENERATED = SINGLE.generated
CLUSTER_GENERATED = SINGLE.cluster_generated
CONE = SINGLE.cone
